"""Schema evolution: the table schema a batch's rows evolve the table to, and the rows made to
fit it (`schema.evolution`).

`evolve(table, batch, mode)` compares two Arrow schemas by field name, nested structs, list
elements and map values included, and returns the table's next schema:

- a column the batch adds is appended after the table's (at the end of its struct when nested),
  always optional: older rows have no value for it;
- a widening takes the wider type: int→long (any narrower signed integer to a wider one) and
  float→double. These are the widenings Iceberg's spec and Hudi's rules both allow, so a table
  evolves the same way in either format (Hudi alone would also take int→double or →string);
- a required column that the batch makes optional, or leaves out, becomes optional;
- a column the batch leaves out stays in the table and is written as null;
- a batch type narrower than the table's (int into a long column) changes nothing: its rows are
  widened when written.

Anything else is refused with `SchemaEvolutionError` naming the field and the fix: a type change
that is not one of the widenings (the table never narrows), a new required column without a
default (`defaults` lists the fields whose writer schema has one: they are added as optional).
A rename cannot be told from a dropped column and an added one, and evolves as both. With
`mode = "off"` any change of the table schema is refused, naming the key.

`conform(rows, schema)` re-projects rows onto an evolved schema: columns by name, missing ones
null, narrower types widened, nested structs and list elements alike.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from lakesink.errors import SchemaEvolutionError
from lakesink.settings import SchemaEvolutionMode

__all__ = [
    "EVOLUTION_MODES",
    "EvolutionMode",
    "EvolvedSchema",
    "SchemaChange",
    "concat_unified",
    "conform",
    "evolve",
    "unify",
]

EvolutionMode = SchemaEvolutionMode
EVOLUTION_MODES: tuple[EvolutionMode, ...] = ("add-and-widen", "off")

ChangeKind = Literal["add", "widen", "optional"]


@dataclass(frozen=True, slots=True)
class SchemaChange:
    """One change of the table schema: a column added, a type widened or a column made
    optional; `path` is the dotted name (`address.city`, `tags.element` for a list element)."""

    kind: ChangeKind
    path: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} {self.path} ({self.detail})"


@dataclass(frozen=True, slots=True)
class EvolvedSchema:
    """The table's schema after a batch: `schema` to write the batch's files with and commit,
    `changes` what differs from the table's schema before (empty: the table stays as is)."""

    schema: pa.Schema
    changes: tuple[SchemaChange, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    @property
    def added(self) -> tuple[str, ...]:
        return tuple(c.path for c in self.changes if c.kind == "add")


def evolve(
    table: pa.Schema,
    batch: pa.Schema,
    mode: EvolutionMode = "add-and-widen",
    *,
    defaults: Collection[str] = (),
) -> EvolvedSchema:
    """The table schema that takes both the table's rows and the batch's (see the module's
    docstring); SchemaEvolutionError naming the first field that cannot evolve."""
    if mode not in EVOLUTION_MODES:
        raise ValueError(f"schema evolution mode {mode!r} is not one of {EVOLUTION_MODES}")
    changes: list[SchemaChange] = []
    fields = _merge_fields(list(table), list(batch), "", frozenset(defaults), changes)
    if changes and mode == "off":
        first = changes[0]
        raise SchemaEvolutionError(
            f"the rows would change the table schema ({first}; {len(changes)} change(s) in "
            "all) and schema.evolution is off: set schema.evolution = add-and-widen to evolve "
            "the table with the batch, or write rows of the table's schema"
        )
    return EvolvedSchema(pa.schema(fields, metadata=table.metadata), tuple(changes))


def unify(schemas: Sequence[pa.Schema]) -> pa.Schema:
    """The schema that the files of `schemas` (oldest first) read in: each evolved by the next,
    a required column new in a file taken as optional (a reader has no default to refuse). A
    reader conforms every file to it, as the table's latest schema would; SchemaEvolutionError
    where two files hold one column in types no widening joins."""
    if not schemas:
        raise ValueError("unify needs at least one schema")
    out = schemas[0]
    for s in schemas[1:]:
        changes: list[SchemaChange] = []
        out = pa.schema(_merge_fields(list(out), list(s), "", None, changes), out.metadata)
    return out


def concat_unified(pieces: Sequence[pa.Table | pa.RecordBatch]) -> pa.Table:
    """`pieces` (of one table, in schemas that evolved: files written before and after a
    change) as one table in their `unify`d schema, matched by column name."""
    tables = [pa.Table.from_batches([p]) if isinstance(p, pa.RecordBatch) else p for p in pieces]
    if not tables:
        raise ValueError("concat_unified needs at least one piece")
    distinct: list[pa.Schema] = []
    for t in tables:
        if not any(t.schema == s for s in distinct):
            distinct.append(t.schema)
    schema = unify(distinct)
    return pa.concat_tables([conform(t, schema) for t in tables])


# -- merging ---------------------------------------------------------------------------------


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


def _merge_fields(
    table: list[pa.Field],
    batch: list[pa.Field],
    parent: str,
    defaults: frozenset[str] | None,
    changes: list[SchemaChange],
) -> list[pa.Field]:
    """`defaults` None: any new field may be added as optional (a reader unifying files)."""
    by_name = {f.name: f for f in batch}
    out: list[pa.Field] = []
    for t in table:
        path = _join(parent, t.name)
        b = by_name.get(t.name)
        if b is None:
            if not t.nullable:  # written as null from now on
                changes.append(SchemaChange("optional", path, "not in the rows"))
                t = t.with_nullable(True)
            out.append(t)
            continue
        out.append(_merge_field(t, b, path, defaults, changes))
    known = {t.name for t in table}
    for b in batch:
        if b.name in known:
            continue
        path = _join(parent, b.name)
        if not b.nullable and defaults is not None and path not in defaults:
            raise SchemaEvolutionError(
                f"column {path!r} is new and required (no default): the table's older rows "
                f"have no value for it. Make {path!r} optional in the writer schema (in Avro: "
                'a union with "null" and "default": null), or give it a default'
            )
        changes.append(SchemaChange("add", path, str(b.type)))
        out.append(b.with_nullable(True))
    return out


def _merge_field(
    t: pa.Field,
    b: pa.Field,
    path: str,
    defaults: frozenset[str] | None,
    changes: list[SchemaChange],
) -> pa.Field:
    merged = t.with_type(_merge_type(t.type, b.type, path, defaults, changes))
    if b.nullable and not t.nullable:
        changes.append(SchemaChange("optional", path, "was required"))
        merged = merged.with_nullable(True)
    return merged


def _merge_type(
    t: pa.DataType,
    b: pa.DataType,
    path: str,
    defaults: frozenset[str] | None,
    changes: list[SchemaChange],
) -> pa.DataType:
    if t == b or _plain(t) == _plain(b):  # one type in two Arrow encodings: the table's kept
        return t
    if pa.types.is_struct(t) and pa.types.is_struct(b):
        fields = _merge_fields(list(t), list(b), path, defaults, changes)
        return pa.struct(fields)
    if _same_list_kind(t, b):
        assert isinstance(t, pa.ListType | pa.LargeListType)
        assert isinstance(b, pa.ListType | pa.LargeListType)
        item = _merge_field(t.value_field, b.value_field, f"{path}.element", defaults, changes)
        if item == t.value_field:
            return t
        return pa.large_list(item) if pa.types.is_large_list(t) else pa.list_(item)
    if pa.types.is_map(t) and pa.types.is_map(b):
        assert isinstance(t, pa.MapType) and isinstance(b, pa.MapType)
        if t.key_type != b.key_type:
            raise _not_a_widening(f"{path}.key", t.key_type, b.key_type)
        item = _merge_field(t.item_field, b.item_field, f"{path}.value", defaults, changes)
        return pa.map_(t.key_field, item)
    if _widens(t, b):
        changes.append(SchemaChange("widen", path, f"{t} to {b}"))
        return b
    if _widens(b, t):  # the rows are narrower: widened when written, the table unchanged
        return t
    raise _not_a_widening(path, t, b)


def _same_list_kind(t: pa.DataType, b: pa.DataType) -> bool:
    """Both lists, 32- or 64-bit offsets alike (the first one's kind is kept)."""
    return _is_list(t) and _is_list(b)


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def _plain(t: pa.DataType) -> pa.DataType:
    """A primitive type without its encoding choices: large strings and binaries as the plain
    ones, any time zone as UTC (a table's reader, pyiceberg, hands large strings and "UTC" where
    the rows may carry plain strings and the session's zone name: the same values)."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if isinstance(t, pa.TimestampType) and t.tz is not None:
        return pa.timestamp(t.unit, tz="UTC")
    return t


_SIGNED = (pa.int8(), pa.int16(), pa.int32(), pa.int64())


def _widens(narrow: pa.DataType, wide: pa.DataType) -> bool:
    """Whether `wide` is one of the widenings of `narrow` both formats allow."""
    if narrow in _SIGNED and wide in _SIGNED:
        return _SIGNED.index(narrow) < _SIGNED.index(wide)
    return bool(narrow == pa.float32() and wide == pa.float64())


def _not_a_widening(path: str, table: pa.DataType, rows: pa.DataType) -> SchemaEvolutionError:
    return SchemaEvolutionError(
        f"column {path!r} is {table} in the table and {rows} in the rows, which is not a "
        "widening lakesink evolves a table by (int to long, float to double; never the other "
        f"way): write the new values to a new optional column instead of changing {path!r}'s "
        "type, or write them to a new table"
    )


# -- re-projecting rows ----------------------------------------------------------------------


def conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """`rows` re-projected onto `schema` (an evolution of their own schema): columns in the
    schema's order, the ones the rows lack null, narrower types widened, nested alike.
    SchemaEvolutionError naming a column of the rows that `schema` has no place for."""
    if rows.schema == schema:
        return rows
    extra = [n for n in rows.column_names if schema.get_field_index(n) < 0]
    if extra:
        raise SchemaEvolutionError(
            f"column {extra[0]!r} of the rows is not in the schema they are written with "
            f"(columns: {', '.join(schema.names)}): evolve the table schema first"
        )
    columns: list[pa.ChunkedArray] = []
    for f in schema:
        if f.name in rows.column_names:
            col = rows.column(f.name)
            chunks = [_conform_array(c, f.type, f.name) for c in col.chunks]
            columns.append(pa.chunked_array(chunks, type=f.type))
        else:
            columns.append(pa.chunked_array([pa.nulls(rows.num_rows, f.type)], type=f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _conform_array(arr: pa.Array, target: pa.DataType, path: str) -> pa.Array:
    if arr.type == target:
        return arr
    if pa.types.is_struct(target) and pa.types.is_struct(arr.type):
        assert isinstance(arr, pa.StructArray)
        names = {arr.type.field(i).name for i in range(arr.type.num_fields)}
        children = [
            _conform_array(arr.field(f.name), f.type, _join(path, f.name))
            if f.name in names
            else pa.nulls(len(arr), f.type)
            for f in target
        ]
        mask = arr.is_null() if arr.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if _same_list_kind(arr.type, target):
        assert isinstance(arr, pa.ListArray | pa.LargeListArray)
        assert isinstance(target, pa.ListType | pa.LargeListType)
        # offsets rebased to 0: from_arrays takes no null mask over sliced offsets
        offsets = arr.offsets
        first = offsets[0].as_py() if len(offsets) else 0
        used = arr.values.slice(first, (offsets[-1].as_py() - first) if len(offsets) else 0)
        rebased = pc.subtract(offsets, pa.scalar(first, offsets.type))
        values = _conform_array(used, target.value_type, f"{path}.element")
        large = pa.types.is_large_list(target)
        cls = pa.LargeListArray if large else pa.ListArray
        mask = arr.is_null() if arr.null_count else None
        rebased = rebased.cast(pa.int64() if large else pa.int32())
        return cls.from_arrays(rebased, values, type=target, mask=mask)
    try:
        return arr.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise SchemaEvolutionError(
            f"column {path!r}: its {arr.type} values cannot be written as {target} ({e})"
        ) from e
