"""Field name mapping (schema.field.mapping): source field names to column names.

A `FieldMapping` holds `source=column` items. A source is a field of the decoded record, or a
nested one by its dotted path through structs (and lists of structs): `address.city=town`
renames the field `city` inside `address`; the target is always one name, the field's new name
at its own level. A parent renamed too keeps its source path in the items
(`address=addr,address.city=town` gives `addr.town`).

The mapping is applied once, to what a value deserializer yields (`MappedValues` wraps it: its
`value_schema` and every decoded table are renamed), so every decoder (JSON, Avro, the
registry's Avro, JSON Schema and Protobuf, Debezium's `after`/`before`, the key's fields joined
by key.format) gives the table the same column names. The schema the deserializer is given
(value.schema, a registry's subject) stays in source names; every key that names a column
(table.record.key.fields, table.ordering.field, cdc.op.field, the partition keys) names the
column, after mapping.

Errors are `ConfigError`s at start: an item that is not `source=column`, a source mapped twice,
a target that is not a column name (`COLUMN_NAME`: the names Avro, hence Hudi, accepts), two
fields of one level landing on one name. A mapped source that the columns lack is a warning,
not an error: a registry's later version may bring it (the mapping then applies to it).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from lakesink.errors import ConfigError
from lakesink.kafka.decoded import Decoded, Deserializer

log = logging.getLogger(__name__)

__all__ = ["COLUMN_NAME", "FieldMapping", "MappedValues", "mapped_values", "source_names"]

COLUMN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A valid mapping target: an Avro name (Hudi keeps the table schema as Avro), which Iceberg,
Spark and every reader lakesink tests take too."""


@dataclass(frozen=True, slots=True)
class _Level:
    """The renames of one struct level: field name -> new name, and the levels below."""

    names: dict[str, str]
    below: dict[str, _Level]


@dataclass(frozen=True, slots=True)
class FieldMapping:
    """`items`: (source path, column name) pairs, in the order given; empty maps nothing."""

    items: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> FieldMapping:
        """schema.field.mapping, 'source=column,...' (`userId=user_id,address.zip=postcode`);
        ConfigError naming the bad item."""
        items: list[tuple[str, str]] = []
        for item in (i for i in (text or "").split(",") if i.strip()):
            source, sep, target = (part.strip() for part in item.partition("="))
            if not sep or not source or not target:
                raise ConfigError(
                    f"schema.field.mapping: {item.strip()!r} is not of the form source=column"
                )
            items.append((source, target))
        return cls(tuple(items))

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        landed: dict[tuple[str, str], str] = {}
        for source, target in self.items:
            if any(not part for part in source.split(".")):
                raise ConfigError(
                    f"schema.field.mapping: {source!r} is not a field path (names joined by dots)"
                )
            if not COLUMN_NAME.fullmatch(target):
                raise ConfigError(
                    f"schema.field.mapping: {source}={target}: {target!r} is not a valid column "
                    "name (a letter or _, then letters, digits or _)"
                )
            if source in seen:
                raise ConfigError(
                    f"schema.field.mapping: {source} is mapped twice ({seen[source]}, {target})"
                )
            seen[source] = target
            parent = source.rpartition(".")[0]
            other = landed.setdefault((parent, target), source)
            if other != source:
                raise ConfigError(
                    f"schema.field.mapping: {other} and {source} both map to column {target}"
                )

    def __bool__(self) -> bool:
        return bool(self.items)

    def text(self) -> str:
        """The mapping in one spelling, as schema.field.mapping takes it."""
        return ",".join(f"{s}={t}" for s, t in self.items)

    def _tree(self) -> _Level:
        root = _Level({}, {})
        for source, target in self.items:
            *parents, name = source.split(".")
            level = root
            for p in parents:
                level = level.below.setdefault(p, _Level({}, {}))
            level.names[name] = target
        return root

    def column(self, source_path: str) -> str:
        """The column path (dotted) of a source field path."""
        level: _Level | None = self._tree()
        out: list[str] = []
        for part in source_path.split("."):
            out.append(level.names.get(part, part) if level is not None else part)
            level = level.below.get(part) if level is not None else None
        return ".".join(out)

    def source(self, column: str) -> str:
        """The source field of a top-level column (the column itself when not mapped)."""
        for source, target in self.items:
            if "." not in source and target == column:
                return source
        return column

    def aliases(self) -> dict[str, tuple[str, ...]]:
        """Column path (dotted) -> the source names it was renamed from (its last name only:
        a name mapping lists names per level)."""
        return {
            self.column(source): (source.rpartition(".")[2],)
            for source, target in self.items
            if source.rpartition(".")[2] != target
        }

    # -- applied to Arrow ------------------------------------------------------------------

    def rename_schema(self, schema: pa.Schema) -> pa.Schema:
        """`schema` with its fields renamed; ConfigError when two fields of one level would
        land on one name (a mapped field and an unmapped one of the target's name)."""
        if not self.items:
            return schema
        fields = _renamed_fields(list(schema), self._tree(), "")
        return pa.schema(fields, metadata=schema.metadata)

    def rename_table(self, table: pa.Table) -> pa.Table:
        """`table` with its fields renamed: the same buffers under the new names (a cast would
        match struct fields by name and null the renamed ones)."""
        if not self.items:
            return table
        schema = self.rename_schema(table.schema)
        columns = [
            pa.chunked_array([c.view(f.type) for c in col.chunks], f.type)
            for col, f in zip(table.columns, schema, strict=True)
        ]
        return pa.Table.from_arrays(columns, schema=schema)

    def unseen(self, schema: pa.Schema) -> list[str]:
        """The mapped source paths that are not fields of `schema`."""
        present = set(_paths(list(schema), ""))
        return [source for source, _ in self.items if source not in present]


def _element_struct(t: pa.DataType) -> pa.StructType | None:
    """The struct a path goes through: the type itself, or a list's element."""
    if pa.types.is_struct(t):
        return t
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _element_struct(t.value_type)
    return None


def _with_struct(t: pa.DataType, struct: pa.DataType) -> pa.DataType:
    """`t` with the struct `_element_struct` found replaced by `struct`."""
    if pa.types.is_struct(t):
        return struct
    item = t.value_field.with_type(_with_struct(t.value_type, struct))
    if pa.types.is_large_list(t):
        return pa.large_list(item)
    if pa.types.is_fixed_size_list(t):
        return pa.list_(item, t.list_size)
    return pa.list_(item)


def _renamed_fields(fields: Sequence[pa.Field], level: _Level, where: str) -> list[pa.Field]:
    out: list[pa.Field] = []
    by_name: dict[str, str] = {}
    for f in fields:
        name = level.names.get(f.name, f.name)
        source = f"{where}{f.name}"
        other = by_name.setdefault(name, source)
        if other != source:
            raise ConfigError(
                f"schema.field.mapping: fields {other} and {source} both land on column "
                f"{where}{name}; map one of them to another name"
            )
        below = level.below.get(f.name)
        struct = _element_struct(f.type)
        if below is not None and struct is not None:
            renamed = pa.struct(_renamed_fields(list(struct), below, f"{source}."))
            f = f.with_type(_with_struct(f.type, renamed))
        out.append(f.with_name(name))
    return out


def _paths(fields: Sequence[pa.Field], where: str) -> Iterator[str]:
    for f in fields:
        yield f"{where}{f.name}"
        struct = _element_struct(f.type)
        if struct is not None:
            yield from _paths(list(struct), f"{where}{f.name}.")


_WARNED: set[tuple[str, tuple[str, ...]]] = set()


class MappedValues:
    """`inner`'s rows with their fields renamed by `mapping` (the module doc)."""

    def __init__(self, inner: Deserializer, mapping: FieldMapping) -> None:
        self.inner = inner
        self.mapping = mapping
        source = inner.value_schema
        self._schema = mapping.rename_schema(source)
        for path in mapping.unseen(source):
            if (path, tuple(source.names)) not in _WARNED:  # once per process, not once per task
                _WARNED.add((path, tuple(source.names)))
                log.warning(
                    "schema.field.mapping maps %s, which the rows do not have (fields: %s); "
                    "it applies when a schema brings it",
                    path, ", ".join(source.names),
                )  # fmt: skip

    @property
    def value_schema(self) -> pa.Schema:
        return self._schema

    def decode(self, values: Sequence[bytes | None]) -> Decoded:
        return self._renamed(self.inner.decode(values))

    def decode_keyed(self, values: Sequence[bytes | None], keys: Sequence[bytes | None]) -> Decoded:
        """As decode, handing `inner` the records' keys where it reads them (key.format)."""
        keyed = getattr(self.inner, "decode_keyed", None)
        decoded = keyed(values, keys) if keyed is not None else self.inner.decode(values)
        return self._renamed(decoded)

    def _renamed(self, decoded: Decoded) -> Decoded:
        return Decoded(self.mapping.rename_table(decoded.table), decoded.failures, decoded.skipped)


def mapped_values(inner: Deserializer, mapping: FieldMapping) -> Deserializer:
    """`inner` itself when `mapping` is empty, else `inner` renamed by it."""
    return MappedValues(inner, mapping) if mapping else inner


def source_names(mapping: FieldMapping, columns: Sequence[str]) -> tuple[str, ...]:
    """The source fields of top-level `columns` (a decoder that works in source names is given
    the key and ordering fields so)."""
    return tuple(mapping.source(c) for c in columns)
