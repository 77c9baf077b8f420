"""Differential tests of every decoder: a batch through the bulk path gives exactly the rows and
failures of a per-value reference, on arbitrary bytes and on mixtures of good and bad values.

JSON: the reference is `JsonValueDecoder` (stdlib json and one explicit conversion per type),
one value at a time, each row converted to Arrow on its own. Avro and raw: each value decoded
alone. Every good JSON object carries its own index in `id`, so a row on the wrong record shows.
"""

from __future__ import annotations

import io
import json
import struct
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakesink.kafka.ddl import ddl_to_arrow
from lakesink.kafka.deserializers import (
    AvroDeserializer,
    Decoded,
    Deserializer,
    JsonDeserializer,
    RawDeserializer,
)
from lakesink.kafka.json_values import MAX_DEPTH, BadValue, JsonValueDecoder

DIFF = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

FAST_DDL = (
    "id BIGINT, s STRING, d DOUBLE, f FLOAT, t TIMESTAMP, n TIMESTAMP_NTZ, day DATE, b BINARY, "
    "ok BOOLEAN, small TINYINT, tags ARRAY<STRING>, st STRUCT<x: INT, y: DOUBLE, z: STRING>"
)
JSON_SCHEMAS = [
    "id BIGINT",
    FAST_DDL,
    FAST_DDL + ", m MAP<STRING, BIGINT>",  # a map: no pyarrow.json at all
    FAST_DDL + ", sd STRUCT<day: DATE, t: TIMESTAMP>",  # dates in a struct: the same
    "id BIGINT NOT NULL, s STRING NOT NULL, dec DECIMAL(6, 2), st STRUCT<x: INT NOT NULL>",
]
COLUMN_NAMES = ["id", "s", "d", "f", "t", "n", "day", "b", "ok", "small", "tags", "st", "m"]
COLUMN_NAMES += ["sd", "dec", "x", "y", "z", "other"]

NUMBERS = [
    "0", "-0", "1", "-1", "7", "1.5", "1e3", "1E3", "-0.0", "1e400", "-1e400", "1e-400",
    "9223372036854775807", "9223372036854775808", "-9223372036854775809", "3.4028235e38",
    "3.5e38", "1" + "0" * 50, "127", "128", "-129", "0.1", "12.345", "2147483648",
    "NaN", "Infinity", "-Infinity", "01", "+1", ".5", "1.", "-",
]  # fmt: skip
STRINGS = [
    '"a"', '""', '"\\ud800"', '"\\udc00x"', '"\\ud83d\\ude00"', '"caf\u00e9"', '"\\u00e9"',
    '"a\nb"', '"a\tb"', '"a\\nb"', '"\\u0000"', '"\\""', '"12.5"', '" 12.5"', '"NaN"',
    '"\\uDBFF\\uDFFF"', '"\ufeff"', '"\u2028"',
]  # fmt: skip
YEARS = ["2024", "0001", "9999", "0000", "1970", "\u0662\u0660\u0662\u0664"]
TIMESTAMP_PIECES = st.tuples(
    st.sampled_from(YEARS),
    st.sampled_from(["-", ""]),
    st.sampled_from(["01", "02", "12", "13"]),
    st.sampled_from(["-29", "-30", "-01", "29", ""]),
    st.sampled_from(["T", " ", "t", ""]),
    st.sampled_from(["00:00:00", "23:59:59", "23:59:60", "24:00:00", "12:30", "123000", ""]),
    st.sampled_from(["", ".5", ".123456", ".1234567", ".123456789", "."]),
    st.sampled_from(["", "Z", "z", "+02:00", "-01:00", "+0200", "+24:00", "+02", "-00:00"]),
).map(lambda p: '"' + "".join(p) + '"')

leaf_text = st.one_of(
    st.sampled_from(NUMBERS),
    st.sampled_from(STRINGS),
    TIMESTAMP_PIECES,
    st.sampled_from(["true", "false", "null"]),
    st.text(max_size=6).map(lambda s: json.dumps(s, ensure_ascii=False)),
    st.integers().map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
)
separators = st.sampled_from([",", ", ", ",\n", " ,\t"])


def objects(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.tuples(
        st.lists(st.tuples(st.sampled_from(COLUMN_NAMES), inner), max_size=5), separators
    ).map(lambda p: "{" + p[1].join(f'"{k}":{v}' for k, v in p[0]) + "}")


json_text = st.recursive(
    leaf_text,
    lambda inner: st.one_of(
        objects(inner), st.lists(inner, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]")
    ),
    max_leaves=12,
)


def top_object(data: st.DataObject, index: int) -> bytes:
    """One JSON object whose `id` is its index (unless the draw leaves it out or repeats it)."""
    body = data.draw(objects(json_text))
    if data.draw(st.booleans()):
        rest = "," + body[1:] if body != "{}" else "}"
        body = f'{{"id":{index}{rest}'

    return body.encode("utf-8", "surrogatepass")


def mutate(data: st.DataObject, v: bytes) -> bytes:
    how = data.draw(
        st.sampled_from(
            [
                "keep",
                "keep",
                "keep",
                "bom",
                "second",
                "second-line",
                "spaces",
                "truncate",
                "insert",
                "invalid-utf8",
                "deep",
                "newline",
            ]
        )
    )
    pos = data.draw(st.integers(0, len(v)))
    if how == "bom":
        return b"\xef\xbb\xbf" + v
    if how == "second":
        return v + b' {"id":-1}'
    if how == "second-line":
        return v + b'\n{"id":-1}'
    if how == "spaces":
        return b" \t" + v + b"\r\n"
    if how == "truncate":
        return v[:pos]
    if how == "insert":
        return v[:pos] + data.draw(st.binary(min_size=1, max_size=4)) + v[pos:]
    if how == "invalid-utf8":
        return v[:pos] + data.draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + v[pos:]
    if how == "deep":
        depth = data.draw(st.sampled_from([MAX_DEPTH - 2, MAX_DEPTH, MAX_DEPTH + 1]))
        return b'{"x":' + b"[" * depth + b"]" * depth + b"," + v[1:] if v[:1] == b"{" else v
    if how == "newline":
        return v.replace(b",", b",\n", 1)
    return v


def json_values(data: st.DataObject) -> list[bytes | None]:
    n = data.draw(st.integers(0, 12))
    out: list[bytes | None] = []
    for i in range(n):
        kind = data.draw(st.sampled_from(["object", "object", "object", "none", "bytes", "text"]))
        if kind == "none":
            out.append(None)
        elif kind == "bytes":
            out.append(data.draw(st.binary(max_size=30)))
        elif kind == "text":
            out.append(data.draw(json_text).encode("utf-8", "surrogatepass"))
        else:
            out.append(mutate(data, top_object(data, i)))
    return out


def canonical(table: pa.Table) -> pa.Table:
    """Floats as their bits (so -0.0 differs from 0.0), timestamps and dates as integers."""
    cols = []
    for f, chunked in zip(table.schema, table.columns, strict=True):
        col = chunked.combine_chunks()
        if pa.types.is_float64(f.type):
            col = col.view(pa.int64())
        elif pa.types.is_float32(f.type):
            col = col.view(pa.int32())
        elif pa.types.is_timestamp(f.type):
            col = pc.cast(col, pa.int64())
        elif pa.types.is_date32(f.type):
            col = pc.cast(col, pa.int32())
        cols.append(col)
    return pa.table(cols, names=table.schema.names)


def assert_same(bulk: Decoded, ref: Decoded, n: int) -> None:
    assert sorted(bulk.failures) == sorted(ref.failures)
    assert all(0 <= i < n and reason for i, reason in bulk.failures.items())
    assert bulk.table.schema == ref.table.schema
    assert bulk.table.num_rows == n - len(bulk.failures)
    assert canonical(bulk.table).equals(canonical(ref.table)), (
        bulk.table.to_pydict(),
        ref.table.to_pydict(),
    )


def json_reference(ddl: str, values: list[bytes | None]) -> Decoded:
    """The rules, one value at a time, each row converted to Arrow on its own."""
    schema = ddl_to_arrow(ddl)
    rules = JsonValueDecoder(schema)
    tables = [schema.empty_table()]
    failures: dict[int, str] = {}
    for i, v in enumerate(values):
        try:
            tables.append(pa.Table.from_pylist([rules.decode_one(v)], schema=schema))
        except BadValue as e:
            failures[i] = str(e)
    return Decoded(pa.concat_tables(tables), failures)


def singly(d: Deserializer, values: list[bytes | None]) -> Decoded:
    """Each value decoded alone through the same deserializer."""
    tables = [d.value_schema.empty_table()]
    failures: dict[int, str] = {}
    for i, v in enumerate(values):
        out = d.decode([v])
        tables.append(out.table)
        if out.failures:
            failures[i] = out.failures[0]
    return Decoded(pa.concat_tables(tables), failures)


@DIFF
@given(st.sampled_from(JSON_SCHEMAS), st.data())
def test_json_bulk_decoding_equals_the_per_value_rules(ddl: str, data: st.DataObject) -> None:
    values = json_values(data)
    bulk = JsonDeserializer(ddl).decode(values)
    assert_same(bulk, json_reference(ddl, values), len(values))


@DIFF
@given(st.sampled_from(JSON_SCHEMAS[:2] + JSON_SCHEMAS[4:]), st.data())
def test_json_one_line_objects_through_the_fast_read_equal_the_rules(
    ddl: str, data: st.DataObject
) -> None:
    """Objects on one line, no framing faults: the batches pyarrow.json reads, edge values and
    all (numbers, timestamps, escapes, repeated names) in the fields."""
    one_line = st.sampled_from([",", ", ", " ,\t"])
    fields = st.lists(st.tuples(st.sampled_from(COLUMN_NAMES), json_text), max_size=5)
    values: list[bytes | None] = [
        ("{" + data.draw(one_line).join(f'"{k}":{v}' for k, v in data.draw(fields)) + "}")
        .replace("\n", " ")
        .encode("utf-8", "surrogatepass")
        for _ in range(data.draw(st.integers(1, 12)))
    ]
    bulk = JsonDeserializer(ddl).decode(values)
    assert_same(bulk, json_reference(ddl, values), len(values))


@DIFF
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=40), st.data())
def test_json_rows_keep_their_positions_among_bad_values(
    ids: list[int], data: st.DataObject
) -> None:
    """Good values with distinct ids, bad values dropped in between: row k is good value k."""
    values: list[bytes | None] = [b'{"id":%d,"s":"v%d"}' % (i, i) for i in ids]
    bad = st.sampled_from(
        [b"", b'{"id":1}\n{"id":9}', b'{"id":1} {"id":9}', b'{"x":', b'{"id":1}}', None]
    )
    for _ in range(data.draw(st.integers(0, 6))):
        values.insert(data.draw(st.integers(0, len(values))), data.draw(bad))
    out = JsonDeserializer("id BIGINT NOT NULL, s STRING").decode(values)
    good = [i for i in range(len(values)) if i not in out.failures]
    assert [values[i] for i in good] == [b'{"id":%d,"s":"v%d"}' % (i, i) for i in ids]
    assert out.table.column("id").to_pylist() == ids
    assert_same(out, json_reference("id BIGINT NOT NULL, s STRING", values), len(values))


@DIFF
@given(st.sampled_from(JSON_SCHEMAS), st.lists(st.none() | st.binary(max_size=40), max_size=8))
def test_json_arbitrary_bytes_decode_like_the_rules(ddl: str, values: list[bytes | None]) -> None:
    bulk = JsonDeserializer(ddl).decode(values)
    assert_same(bulk, json_reference(ddl, values), len(values))


AVRO_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Event",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "score", "type": ["null", "float"], "default": None},
        {"name": "small", "type": "int"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "int"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2},
        },
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
    ],
}
# written with a wider schema, so values out of the reader's ranges occur
WRITER_SCHEMA = fastavro.parse_schema(
    {
        **AVRO_SCHEMA,
        "fields": [
            {**f, "type": "long"}
            if f["name"] in ("small", "day")
            else {**f, "type": {**f["type"], "precision": 22}}
            if f["name"] == "amount"
            else f
            for f in AVRO_SCHEMA["fields"]
        ],
    }
)
AVRO_RECORDS = st.fixed_dictionaries(
    {
        "id": st.integers(-(2**63), 2**63 - 1),
        "name": st.text(max_size=8),
        "score": st.none() | st.floats(width=32),
        "small": st.integers(-(2**40), 2**40),
        "tags": st.lists(st.text(max_size=4), max_size=3),
        "attrs": st.dictionaries(st.text(max_size=4), st.integers(-(2**31), 2**31 - 1), max_size=3),
        "at": st.integers(-(2**62), 2**62),
        "day": st.integers(-(2**40), 2**40),
        "amount": st.decimals(allow_nan=False, allow_infinity=False, places=2).filter(
            lambda d: abs(d) < 10**20
        ),
        "u": st.uuids().map(str),
    }
)


def avro_value(record: dict[str, Any], schema_id: int | None) -> bytes:
    buf = io.BytesIO()
    if schema_id is not None:
        buf.write(b"\x00" + struct.pack(">I", schema_id))
    fastavro.schemaless_writer(buf, WRITER_SCHEMA, record)
    return buf.getvalue()


@DIFF
@given(st.sampled_from(["plain", "confluent"]), st.data())
def test_avro_bulk_decoding_equals_decoding_each_value_alone(
    wire: str, data: st.DataObject
) -> None:
    ids = [7, 8] if wire == "confluent" else None
    d = AvroDeserializer(schema=AVRO_SCHEMA, wire_format=wire, schema_ids=ids)  # type: ignore[arg-type]
    values: list[bytes | None] = []
    for _ in range(data.draw(st.integers(0, 8))):
        kind = data.draw(st.sampled_from(["record", "record", "none", "bytes", "cut", "insert"]))
        if kind == "none":
            values.append(None)
            continue
        if kind == "bytes":
            values.append(data.draw(st.binary(max_size=40)))
            continue
        schema_id = data.draw(st.sampled_from([7, 8, 9, 0])) if wire == "confluent" else None
        v = avro_value(data.draw(AVRO_RECORDS), schema_id)
        pos = data.draw(st.integers(0, len(v)))
        if kind == "cut":
            v = v[:pos]
        elif kind == "insert":
            v = v[:pos] + data.draw(st.binary(min_size=1, max_size=3)) + v[pos:]
        values.append(v)
    bulk = d.decode(values)
    assert_same(bulk, singly(d, values), len(values))
    for i, reason in bulk.failures.items():
        v = values[i]
        if wire == "confluent" and v is not None and len(v) >= 5 and v[0] == 0:
            found = struct.unpack(">I", v[1:5])[0]
            if found not in (7, 8):
                assert f"schema id {found}, not one of the accepted ids 7, 8" in reason


@DIFF
@given(st.lists(st.none() | st.binary(max_size=60), max_size=10))
def test_raw_bulk_decoding_equals_decoding_each_value_alone(values: list[bytes | None]) -> None:
    d = RawDeserializer()
    bulk = d.decode(values)
    assert not bulk.failures
    assert_same(bulk, singly(d, values), len(values))
    assert bulk.table.column("value").to_pylist() == values
