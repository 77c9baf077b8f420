"""Unit: `evolve` decides the table's next schema from a batch's, `conform` re-projects rows
onto it; refusals name the field and the fix."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakesink.engine.evolution import EvolvedSchema, conform, evolve, unify
from lakesink.errors import SchemaEvolutionError


def f(name: str, t: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, t, nullable=nullable)


ADDR = pa.struct([f("city", pa.string())])
ADDR_ZIP = pa.struct([f("city", pa.string()), f("zip", pa.string())])

# (case, table fields, batch fields, expected fields, expected changes as "kind path")
ACCEPTED: list[tuple[str, list[pa.Field], list[pa.Field], list[pa.Field], list[str]]] = [
    ("same schema", [f("a", pa.int32())], [f("a", pa.int32())], [f("a", pa.int32())], []),
    (
        "optional column added at the end",
        [f("a", pa.int32()), f("b", pa.string())],
        [f("country", pa.string()), f("a", pa.int32()), f("b", pa.string())],
        [f("a", pa.int32()), f("b", pa.string()), f("country", pa.string())],
        ["add country"],
    ),
    (
        "nested optional field added at the end of its struct",
        [f("addr", ADDR)],
        [f("addr", ADDR_ZIP)],
        [f("addr", ADDR_ZIP)],
        ["add addr.zip"],
    ),
    (
        "int widened to long",
        [f("n", pa.int32())],
        [f("n", pa.int64())],
        [f("n", pa.int64())],
        ["widen n"],
    ),
    (
        "float widened to double",
        [f("x", pa.float32())],
        [f("x", pa.float64())],
        [f("x", pa.float64())],
        ["widen x"],
    ),
    (
        "int inside a list widened",
        [f("l", pa.list_(f("item", pa.int32())))],
        [f("l", pa.list_(f("item", pa.int64())))],
        [f("l", pa.list_(f("item", pa.int64())))],
        ["widen l.element"],
    ),
    (
        "narrower rows into a wider column: the table unchanged",
        [f("n", pa.int64())],
        [f("n", pa.int32())],
        [f("n", pa.int64())],
        [],
    ),
    (
        "required made optional",
        [f("a", pa.int32(), nullable=False)],
        [f("a", pa.int32())],
        [f("a", pa.int32())],
        ["optional a"],
    ),
    (
        "required rows into an optional column: the table unchanged",
        [f("a", pa.int32())],
        [f("a", pa.int32(), nullable=False)],
        [f("a", pa.int32())],
        [],
    ),
    (
        "dropped optional column kept (written as null)",
        [f("a", pa.int32()), f("b", pa.string())],
        [f("a", pa.int32())],
        [f("a", pa.int32()), f("b", pa.string())],
        [],
    ),
    (
        "dropped required column kept and made optional",
        [f("a", pa.int32()), f("b", pa.string(), nullable=False)],
        [f("a", pa.int32())],
        [f("a", pa.int32()), f("b", pa.string())],
        ["optional b"],
    ),
    (
        "map values widened",
        [f("m", pa.map_(pa.string(), pa.int32()))],
        [f("m", pa.map_(pa.string(), pa.int64()))],
        [f("m", pa.map_(pa.string(), pa.int64()))],
        ["widen m.value"],
    ),
]


@pytest.mark.parametrize(
    ("table", "batch", "expected", "changes"),
    [pytest.param(*case[1:], id=case[0]) for case in ACCEPTED],
)
def test_evolve_accepts_compatible_batches(
    table: list[pa.Field], batch: list[pa.Field], expected: list[pa.Field], changes: list[str]
) -> None:
    out = evolve(pa.schema(table), pa.schema(batch))
    assert out.schema == pa.schema(expected)
    assert [f"{c.kind} {c.path}" for c in out.changes] == changes
    assert out.changed is bool(changes)


# (case, table fields, batch fields, words the message must hold)
REFUSED: list[tuple[str, list[pa.Field], list[pa.Field], list[str]]] = [
    (
        "new required column without default",
        [f("a", pa.int32())],
        [f("a", pa.int32()), f("country", pa.string(), nullable=False)],
        ["'country'", "required", "optional"],
    ),
    (
        "new required nested field without default",
        [f("addr", ADDR)],
        [f("addr", pa.struct([f("city", pa.string()), f("zip", pa.string(), False)]))],
        ["'addr.zip'", "required"],
    ),
    (
        "a type change that is not a widening",
        [f("n", pa.int64())],
        [f("n", pa.string())],
        ["'n'", "int64", "string", "new optional column"],
    ),
    (
        "int to double is not a widening both formats allow",
        [f("n", pa.int32())],
        [f("n", pa.float64())],
        ["'n'", "not a widening"],
    ),
    (
        "a struct becoming a scalar",
        [f("addr", ADDR)],
        [f("addr", pa.string())],
        ["'addr'"],
    ),
    (
        "map keys changed",
        [f("m", pa.map_(pa.string(), pa.int32()))],
        [f("m", pa.map_(pa.int32(), pa.int32()))],
        ["'m.key'"],
    ),
]


@pytest.mark.parametrize(
    ("table", "batch", "words"),
    [pytest.param(*case[1:], id=case[0]) for case in REFUSED],
)
def test_evolve_refuses_incompatible_batches_naming_the_field(
    table: list[pa.Field], batch: list[pa.Field], words: list[str]
) -> None:
    with pytest.raises(SchemaEvolutionError) as e:
        evolve(pa.schema(table), pa.schema(batch))
    for word in words:
        assert word in str(e.value)


def test_new_required_column_with_a_default_is_added_as_optional() -> None:
    out = evolve(
        pa.schema([f("a", pa.int32())]),
        pa.schema([f("a", pa.int32()), f("country", pa.string(), nullable=False)]),
        defaults={"country"},
    )
    assert out.schema.field("country").nullable
    assert out.added == ("country",)


def test_mode_off_refuses_any_change_naming_the_key() -> None:
    table = pa.schema([f("a", pa.int32())])
    with pytest.raises(SchemaEvolutionError, match=r"schema\.evolution is off") as e:
        evolve(table, pa.schema([f("a", pa.int32()), f("country", pa.string())]), "off")
    assert "country" in str(e.value)
    # no change: off accepts
    assert evolve(table, table, "off") == EvolvedSchema(table)


def test_conform_null_fills_reorders_and_widens() -> None:
    rows = pa.table(
        {
            "addr": pa.array([{"city": "Oslo"}, None], ADDR),
            "n": pa.array([1, None], pa.int32()),
        }
    )
    schema = pa.schema([f("n", pa.int64()), f("addr", ADDR_ZIP), f("country", pa.string())])
    out = conform(rows, schema)
    assert out.schema == schema
    assert out.to_pylist() == [
        {"n": 1, "addr": {"city": "Oslo", "zip": None}, "country": None},
        {"n": None, "addr": None, "country": None},
    ]


def test_conform_refuses_a_column_the_schema_lacks() -> None:
    with pytest.raises(SchemaEvolutionError, match="'b'"):
        conform(pa.table({"a": [1], "b": [2]}), pa.schema([f("a", pa.int64())]))


def test_unify_reads_files_of_three_schemas_in_the_latest() -> None:
    v1 = pa.schema([f("id", pa.int32())])
    v2 = pa.schema([f("id", pa.int64())])
    v3 = pa.schema([f("id", pa.int64()), f("country", pa.string())])
    assert unify([v1, v2, v3]) == v3
    assert unify([v3, v1]) == v3  # an older file read after a newer one changes nothing


# -- property: whatever a compatible batch looks like, its rows fit the evolved schema -------

_LEAVES = [pa.int32(), pa.int64(), pa.float32(), pa.float64(), pa.string(), pa.bool_()]
_WIDER = {pa.int32(): pa.int64(), pa.float32(): pa.float64()}
_NAMES = st.sampled_from(["a", "b", "c", "d", "e"])


def _types(depth: int) -> st.SearchStrategy[pa.DataType]:
    leaf = st.sampled_from(_LEAVES)
    if depth == 0:
        return leaf
    return st.one_of(
        leaf,
        _fields(depth - 1).map(pa.struct),
        _types(depth - 1).map(lambda t: pa.list_(pa.field("item", t))),
    )


def _fields(depth: int) -> st.SearchStrategy[list[pa.Field]]:
    return st.lists(
        st.tuples(_NAMES, _types(depth), st.booleans()), min_size=1, max_size=4,
        unique_by=lambda x: x[0],
    ).map(lambda xs: [pa.field(n, t, nullable=b) for n, t, b in xs])  # fmt: skip


@st.composite
def _evolved_type(draw: st.DrawFn, t: pa.DataType) -> pa.DataType:
    """A type a writer may move `t` to: the same, a widening, or nested changes."""
    if pa.types.is_struct(t):
        return pa.struct(draw(_evolved_fields(list(t))))
    if pa.types.is_list(t):
        return pa.list_(pa.field("item", draw(_evolved_type(t.value_type))))
    wider = _WIDER.get(t)
    return wider if wider is not None and draw(st.booleans()) else t


@st.composite
def _evolved_fields(draw: st.DrawFn, fields: list[pa.Field]) -> list[pa.Field]:
    out: list[pa.Field] = []
    for fld in fields:
        if draw(st.integers(0, 4)) == 0:
            continue  # dropped
        nullable = fld.nullable or draw(st.booleans())  # required may become optional
        out.append(pa.field(fld.name, draw(_evolved_type(fld.type)), nullable=nullable))
    taken = {fld.name for fld in fields}
    for name in draw(st.lists(st.sampled_from(["x", "y", "z"]), unique=True, max_size=2)):
        if name not in taken:
            out.append(pa.field(name, draw(_types(1)), nullable=True))  # added, optional
    draw(st.randoms()).shuffle(out)
    return out if out else [pa.field("x", pa.string())]


def _sample(t: pa.DataType, nullable: bool, rnd: random.Random) -> Any:
    if nullable and rnd.random() < 0.25:
        return None
    if pa.types.is_struct(t):
        return {c.name: _sample(c.type, c.nullable, rnd) for c in t}
    if pa.types.is_list(t):
        return [_sample(t.value_type, True, rnd) for _ in range(rnd.randint(0, 2))]
    if pa.types.is_integer(t):
        return rnd.randint(-(2**31), 2**31 - 1)
    if pa.types.is_floating(t):
        return float(rnd.randint(-1000, 1000)) / 4
    if pa.types.is_boolean(t):
        return rnd.random() < 0.5
    return rnd.choice(["", "é", "lakesink"])


def _rows(schema: pa.Schema, rnd: random.Random, n: int) -> pa.Table:
    data = [{fld.name: _sample(fld.type, fld.nullable, rnd) for fld in schema} for _ in range(n)]
    return pa.Table.from_pylist(data, schema=schema)


def _fits(value: Any, target: Any) -> bool:
    """`target` (a conformed value) holds `value`, with None for the fields added since."""
    if isinstance(value, dict):
        return isinstance(target, dict) and all(
            _fits(value.get(k), v) if k in value else v is None for k, v in target.items()
        )
    if isinstance(value, list):
        return isinstance(target, list) and len(value) == len(target) and all(
            _fits(a, b) for a, b in zip(value, target, strict=True)
        )  # fmt: skip
    return bool(value == target)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), table_fields=_fields(2), seed=st.integers(0, 2**16), n=st.integers(0, 4))
def test_evolve_accepts_the_rows_of_both_schemas_re_projected(
    data: st.DataObject, table_fields: list[pa.Field], seed: int, n: int
) -> None:
    table = pa.schema(table_fields)
    batch = pa.schema(data.draw(_evolved_fields(table_fields)))
    evolved = evolve(table, batch)
    # a second look changes nothing: the evolved schema already takes both
    assert not evolve(evolved.schema, batch).changed
    assert not evolve(evolved.schema, table).changed
    rnd = random.Random(seed)
    for schema in (batch, table):
        rows = _rows(schema, rnd, n)
        out = conform(rows, evolved.schema)
        assert out.schema == evolved.schema
        assert out.num_rows == rows.num_rows
        for before, after in zip(rows.to_pylist(), out.to_pylist(), strict=True):
            assert _fits(before, after), (before, after)


def test_encodings_of_one_type_are_no_change_and_the_table_keeps_its_own() -> None:
    table = pa.schema(
        [
            f("s", pa.large_string()),
            f("l", pa.large_list(pa.large_string())),
            f("t", pa.timestamp("us", tz="UTC")),
        ]
    )
    rows = pa.table(
        {
            "s": pa.array(["x"], pa.string()),
            "l": pa.array([["y"]], pa.list_(pa.string())),
            "t": pa.array([1], pa.timestamp("us", tz="Etc/UTC")),
        }
    )
    out = evolve(table, rows.schema)
    assert out == EvolvedSchema(table)
    conformed = conform(rows, out.schema)
    assert conformed.schema == table
    assert conformed.to_pylist() == rows.to_pylist()
