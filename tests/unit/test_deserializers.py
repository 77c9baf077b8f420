"""Deserializers and the DDL parser without a broker: good values, bad values, bulk behaviour."""

from __future__ import annotations

import io
import json
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from fastavro import parse_schema, schemaless_writer

from lakesink.errors import ConfigError
from lakesink.kafka.ddl import arrow_to_ddl, ddl_to_arrow
from lakesink.kafka.deserializers import (
    AvroDeserializer,
    Deserializer,
    JsonDeserializer,
    RawDeserializer,
    make_deserializer,
)
from lakesink.kafka.producer import SAMPLE_EVENT_DDL, encode_event, sample_event

# --- DDL -----------------------------------------------------------------------------------------


def test_ddl_parses_common_types() -> None:
    schema = ddl_to_arrow(
        "id BIGINT NOT NULL, name STRING COMMENT 'who', ts TIMESTAMP, n TIMESTAMP_NTZ, "
        "amount DECIMAL(12, 3), d DATE, flag BOOLEAN, small SMALLINT, f FLOAT, b BINARY, "
        "v VARCHAR(20), tags ARRAY<STRING>, attrs MAP<STRING, BIGINT>, "
        "`odd name` STRUCT<a: INT, `b c`: ARRAY<ARRAY<INT>>>"
    )
    assert schema.field("id").type == pa.int64() and not schema.field("id").nullable
    assert schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert schema.field("n").type == pa.timestamp("us")
    assert schema.field("amount").type == pa.decimal128(12, 3)
    assert schema.field("d").type == pa.date32()
    assert schema.field("v").type == pa.string()
    assert schema.field("attrs").type == pa.map_(pa.string(), pa.int64())
    inner = schema.field("odd name").type
    assert inner.field("b c").type == pa.list_(pa.list_(pa.int32()))


def test_ddl_round_trips_through_arrow() -> None:
    ddl = "id BIGINT, tags ARRAY<STRING>, m MAP<STRING, DOUBLE>, s STRUCT<a: INT, d: DECIMAL(5,2)>"
    schema = ddl_to_arrow(ddl)
    assert ddl_to_arrow(arrow_to_ddl(schema)) == schema
    # a required struct's required field stays required (a registry's record pinned as DDL);
    # under an optional struct it is optional
    nested = ddl_to_arrow(
        "a STRUCT<city: STRING NOT NULL, zip: STRING, in: STRUCT<x: INT NOT NULL> NOT NULL> "
        "NOT NULL, b STRUCT<city: STRING NOT NULL>"
    )
    back = ddl_to_arrow(arrow_to_ddl(nested))
    assert back.field("a") == nested.field("a")
    assert not back.field("a").type.field("in").type.field("x").nullable
    assert back.field("b").type.field("city").nullable


def test_ddl_accepts_a_struct_wrapper() -> None:
    assert ddl_to_arrow("STRUCT<a: INT, b: STRING>").names == ["a", "b"]


@pytest.mark.parametrize(
    ("ddl", "fragment"),
    [
        ("", "empty"),
        ("id", "unexpected end"),
        ("id WIBBLE", "unknown type 'WIBBLE'"),
        ("id INT, id BIGINT", "appears twice"),
        ("d DECIMAL(50, 2)", "out of range"),
        ("a ARRAY<INT", "expected '>'"),
        ("a INT b INT", "unexpected text"),
        ("s STRUCT<>", "STRUCT<> has no fields"),  # Parquet cannot store it
        ("STRUCT<>", "STRUCT<> has no fields"),
    ],
)
def test_ddl_errors_name_the_problem(ddl: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        ddl_to_arrow(ddl)


# --- JSON ----------------------------------------------------------------------------------------


def test_json_decodes_sample_events_exactly() -> None:
    d = JsonDeserializer(SAMPLE_EVENT_DDL)
    events = [sample_event(i, seed=3) for i in range(50)]
    out = d.decode([encode_event(e) for e in events])
    assert not out.failures
    rows = out.table.to_pylist()
    for got, want in zip(rows, events, strict=True):
        assert got["event_id"] == want["event_id"]
        assert got["payload"] == want["payload"]
        assert got["ts"] == datetime.fromisoformat(want["ts"].replace("Z", "+00:00"))


def test_sample_events_are_deterministic_and_about_the_requested_size() -> None:
    assert sample_event(7, seed=1) == sample_event(7, seed=1)
    assert sample_event(7, seed=1) != sample_event(7, seed=2)
    assert 240 <= len(encode_event(sample_event(123))) <= 260


def test_json_types_nulls_extra_fields_and_tombstones() -> None:
    d = JsonDeserializer(
        "id BIGINT, amount DECIMAL(10,2), d DATE, ts TIMESTAMP, tags ARRAY<STRING>, "
        "s STRUCT<a: INT>"
    )
    values: list[bytes | None] = [
        b'{"id": 1, "amount": "12.34", "d": "2024-02-29", "ts": "2024-01-01T01:00:00+02:00",'
        b' "tags": ["x"], "s": {"a": 5, "zz": 1}, "extra": true}',
        b'{\n "id": 2\n}',  # newlines between tokens
        None,  # tombstone: a row of nulls
        b'  {"id": 3, "amount": 7}',
    ]
    out = d.decode(values)
    assert not out.failures
    rows = out.table.to_pylist()
    assert rows[0]["amount"] == Decimal("12.34")
    assert rows[0]["d"] == date(2024, 2, 29)
    assert rows[0]["ts"] == datetime(2023, 12, 31, 23, 0, tzinfo=UTC)
    assert rows[0]["s"] == {"a": 5}
    assert rows[1]["id"] == 2 and rows[1]["tags"] is None
    assert all(v is None for v in rows[2].values())
    assert rows[3]["amount"] == Decimal("7.00")


def test_json_bad_values_are_isolated_with_reasons_and_good_rows_keep_order() -> None:
    d = JsonDeserializer("id BIGINT, name STRING")
    values: list[bytes | None] = [
        b'{"id": 0}',
        b"null",  # not an object (a top-level null must never reach pyarrow.json: it crashes)
        b'{"id": 2}',
        b'{"id": "two"}',  # wrong type
        b"",
        b'{"id": 5',  # truncated
        b'{"id": 6} {"id": 7}',  # two objects in one value
        b"[1, 2]",
        b'{"id": 8, "name": "x"}',
        b'{"id": 1.5}',
    ]
    out = d.decode(values)
    assert sorted(out.failures) == [1, 3, 4, 5, 6, 7, 9]
    assert out.failures[1] == "value is not a JSON object (it is null)"
    assert out.failures[4] == "value is empty"
    assert "Extra data" in out.failures[6]
    assert out.table.column("id").to_pylist() == [0, 2, 8]


def test_json_all_bad_gives_an_empty_table_of_the_schema() -> None:
    d = JsonDeserializer("id BIGINT")
    out = d.decode([b"x", b"5"])
    assert out.table.num_rows == 0 and out.table.schema == d.value_schema
    assert sorted(out.failures) == [0, 1]


def test_json_maps_and_nested_dates_use_the_python_path() -> None:
    d = JsonDeserializer("m MAP<STRING, BIGINT>, s STRUCT<d: DATE, ts: TIMESTAMP>")
    out = d.decode(
        [
            b'{"m": {"a": 1, "b": 2}, "s": {"d": "2024-01-02", "ts": "2024-01-01T00:00:00Z"}}',
            b'{"m": {"a": "x"}}',
            b'{"m": null}',
        ]
    )
    assert list(out.failures) == [1]
    rows = out.table.to_pylist()
    assert rows[0]["m"] == [("a", 1), ("b", 2)]
    assert rows[0]["s"]["d"] == date(2024, 1, 2)
    assert rows[1]["m"] is None


def test_json_large_batch_with_one_bad_value_finds_it() -> None:
    d = JsonDeserializer(SAMPLE_EVENT_DDL)
    values = [encode_event(sample_event(i)) for i in range(5000)]
    values[3217] = b'{"event_id": "oops"}'
    out = d.decode(values)
    assert list(out.failures) == [3217]
    assert out.table.num_rows == 4999
    ids = out.table.column("event_id").to_pylist()
    assert ids == [i for i in range(5000) if i != 3217]


@pytest.mark.parametrize("deep_at", [0, 2, 5])
def test_json_a_value_nested_too_deep_among_plain_ones_is_refused_as_the_rules_refuse_it(
    deep_at: int,
) -> None:
    """pyarrow.json reads any depth, the rules stop at MAX_DEPTH: the batch check counts each
    value's brackets, so a too-deep value (here in a field that is no column) never reaches the
    bulk read, and a value at the limit, or one with many shallow brackets, still decodes."""
    from lakesink.kafka.json_values import MAX_DEPTH

    def nested(depth: int) -> bytes:  # the outer object is one level
        return b'{"x":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b',"id":7}'

    values = [b'{"id":%d,"pad":"%s"}' % (i, b"p" * 300) for i in range(6)]
    values[deep_at] = nested(MAX_DEPTH + 1)
    values[(deep_at + 1) % 6] = nested(MAX_DEPTH)
    values[(deep_at + 3) % 6] = b'{"x":[' + b"[]," * (MAX_DEPTH + 5) + b'[]],"id":9}'
    d = JsonDeserializer("id BIGINT")
    out = d.decode(values)
    assert list(out.failures) == [deep_at]
    assert "deeper" in out.failures[deep_at]
    expected = [
        7 if i == (deep_at + 1) % 6 else 9 if i == (deep_at + 3) % 6 else i for i in range(6)
    ]
    assert out.table.column("id").to_pylist() == [v for i, v in enumerate(expected) if i != deep_at]


# --- Avro ----------------------------------------------------------------------------------------

AVRO_SCHEMA = {
    "type": "record",
    "name": "Event",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
    ],
}


def _avro(record: dict[str, object]) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(AVRO_SCHEMA), record)
    return buf.getvalue()


def _record(i: int) -> dict[str, object]:
    return {
        "id": i,
        "name": None if i % 2 else f"n{i}",
        "ts": datetime(2024, 1, 1, tzinfo=UTC),
        "tags": ["a"] * (i % 3),
        "attrs": {"k": i},
        "kind": "B",
    }


def test_avro_confluent_framed_values(tmp_path: Path) -> None:
    path = tmp_path / "event.avsc"
    path.write_text(json.dumps(AVRO_SCHEMA))
    d = AvroDeserializer(path, schema_ids="7")
    framed = [b"\x00\x00\x00\x00\x07" + _avro(_record(i)) for i in range(2)]
    out = d.decode([*framed, b"\xff\xff\xff", None])
    assert list(out.failures) == [2, 3]
    assert "value.avro.wire.format=plain" in out.failures[2]
    assert out.failures[3] == "tombstone (null value) for a schema with required column id"
    rows = out.table.to_pylist()
    assert [r["id"] for r in rows] == [0, 1]
    assert rows[0]["name"] == "n0" and rows[1]["name"] is None
    assert rows[0]["ts"] == datetime(2024, 1, 1, tzinfo=UTC)
    assert rows[1]["attrs"] == [("k", 1)] and rows[0]["kind"] == "B"
    assert d.value_schema.field("ts").type == pa.timestamp("us", tz="UTC")


def test_avro_wire_format_must_be_named_not_guessed() -> None:
    with pytest.raises(ConfigError, match="confluent or plain"):
        AvroDeserializer(schema=json.dumps(AVRO_SCHEMA), wire_format="auto")  # type: ignore[arg-type]


def test_avro_confluent_values_with_another_schema_id_are_bad_records() -> None:
    d = AvroDeserializer(schema=AVRO_SCHEMA, schema_ids=[7, 9])
    body = _avro(_record(0))
    out = d.decode([b"\x00\x00\x00\x00\x09" + body, b"\x00\x00\x00\x01\x00" + body])
    assert list(out.failures) == [1]
    assert out.failures[1] == (
        "value is framed with schema id 256, not one of the accepted ids 7, 9 "
        "(value.avro.schema.ids): its writer schema is unknown"
    )
    assert out.table.column("id").to_pylist() == [0]


@pytest.mark.parametrize(
    ("wire", "ids", "fragment"),
    [
        ("confluent", None, "needs value.avro.schema.ids"),
        ("confluent", "", "needs value.avro.schema.ids"),
        ("confluent", "7, x", "entry 'x' is not valid"),
        ("confluent", [2**32], "is not valid"),
        ("plain", "7", "confluent only"),
    ],
)
def test_avro_schema_ids_config_errors(wire: str, ids: object, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        AvroDeserializer(schema=AVRO_SCHEMA, wire_format=wire, schema_ids=ids)  # type: ignore[arg-type]


def test_avro_strings_must_be_valid_utf8_and_uuids_are_strings() -> None:
    schema = {
        "type": "record",
        "name": "U",
        "fields": [
            {"name": "s", "type": "string"},
            {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        ],
    }
    d = AvroDeserializer(schema=schema, wire_format="plain")
    uuid = b"12345678-1234-1234-1234-123456789012"
    good = b"\x02a\x48" + uuid
    bad = b"\x02\xff\x48" + uuid
    surrogate = b"\x06\xed\xa0\x80\x48" + uuid  # an encoded surrogate is not UTF-8 either
    out = d.decode([good, bad, surrogate])
    assert sorted(out.failures) == [1, 2]
    assert all("not valid UTF-8" in r for r in out.failures.values())
    assert out.table.to_pylist() == [{"s": "a", "u": uuid.decode()}]


def test_avro_tombstones_give_nulls_only_for_all_nullable_schemas() -> None:
    schema = {
        "type": "record",
        "name": "N",
        "fields": [{"name": "a", "type": ["null", "long"], "default": None}],
    }
    out = AvroDeserializer(schema=schema, wire_format="plain").decode([None])
    assert not out.failures and out.table.to_pylist() == [{"a": None}]


def test_avro_value_with_trailing_bytes_is_bad() -> None:
    d = AvroDeserializer(schema=json.dumps(AVRO_SCHEMA), wire_format="plain")
    out = d.decode([_avro(_record(0)) + b"\x00\x00"])
    assert list(out.failures) == [0] and "ends at byte" in out.failures[0]


def test_avro_bad_value_reasons_say_what_is_wrong_and_are_the_same_on_every_decode() -> None:
    d = AvroDeserializer(schema=json.dumps(AVRO_SCHEMA), wire_format="plain")
    whole = _avro(_record(0))
    truncated, empty, bad_enum = whole[:3], b"", whole[:-1] + b"\x08"
    first = d.decode([truncated, empty, bad_enum]).failures
    again = AvroDeserializer(schema=json.dumps(AVRO_SCHEMA), wire_format="plain").decode(
        [truncated, empty, bad_enum]
    )
    assert first == again.failures and len(first) == 3
    assert not any("0x" in r or " object at " in r for r in first.values()), first
    assert "3-byte value ends before its record does" in first[0]
    assert "0-byte value ends before its record does" in first[1]
    assert "enum symbol or union branch index" in first[2]


# --- raw and the factory -------------------------------------------------------------------------


def test_raw_keeps_value_bytes_and_nulls() -> None:
    out = RawDeserializer().decode([b"a", None, b""])
    assert out.table.column("value").to_pylist() == [b"a", None, b""]


def test_make_deserializer_by_name(tmp_path: Path) -> None:
    assert isinstance(make_deserializer("raw"), RawDeserializer)
    j = make_deserializer("JSON", schema="id BIGINT")
    assert isinstance(j, JsonDeserializer) and isinstance(j, Deserializer)
    ddl_file = tmp_path / "schema.ddl"
    ddl_file.write_text("id BIGINT, name STRING\n")
    assert make_deserializer("json", schema_file=str(ddl_file)).value_schema.names == ["id", "name"]
    avsc = tmp_path / "e.avsc"
    avsc.write_text(json.dumps(AVRO_SCHEMA))
    avro = make_deserializer("avro", schema_file=str(avsc), avro_schema_ids="3, 4")
    assert isinstance(avro, AvroDeserializer) and avro.schema_ids == {3, 4}


@pytest.mark.parametrize(
    ("fmt", "schema", "fragment"),
    [
        ("thrift", None, "json, avro, raw"),
        ("protobuf", "id BIGINT", "needs schema.registry.url"),
        ("json", None, "needs a schema"),
        ("raw", "id INT", "takes no schema"),
        ("avro", '{"type": "string"}', "record schema"),
    ],
)
def test_make_deserializer_errors(fmt: str, schema: str | None, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        make_deserializer(fmt, schema=schema)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({}, "confluent needs value.avro.schema.ids"),
        ({"value.avro.schema.ids": "1.5"}, "'1.5' is not a schema id"),
        ({"value.avro.schema.ids": "4294967296"}, "is not a schema id"),
    ],
)
def test_config_refuses_confluent_avro_without_valid_schema_ids(
    extra: dict[str, str], fragment: str
) -> None:
    from lakesink.config import build_config

    base = {
        "kafka.bootstrap.servers": "127.0.0.1:9",
        "kafka.topics": "t",
        "table.path": "/nonexistent/t",
        "value.format": "avro",
        "value.schema.file": "/nonexistent/a.avsc",
    }
    with pytest.raises(ConfigError, match=fragment):
        build_config({**base, **extra})
    assert build_config({**base, "value.avro.schema.ids": "7, 9"})["value.avro.schema.ids"] == (
        7,
        9,
    )
