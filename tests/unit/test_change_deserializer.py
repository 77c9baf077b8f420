"""The change-stream deserializer (lakesink.kafka.changes): captured Debezium events and
hand-made ones as rows of versions, tombstones skipped, bad records failed by index with a
reason; the range reader dropping skipped records without dead letters."""

from __future__ import annotations

import io
import json
import struct
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Message
from fastavro import parse_schema, schemaless_writer
from test_debezium_captured import COLUMNS, PLAIN, VARIANTS, WRAPPED, records
from test_mutation_config import envelope_schema

from lakesink.config import build_config
from lakesink.errors import ConfigError
from lakesink.kafka.changes import ChangeDeserializer
from lakesink.kafka.dead_letters import FailedRecord
from lakesink.kafka.decoded import Deserializer
from lakesink.kafka.reader import UNREADABLE_HEADERS, RangeReadStats, _RangeReader, output_schema
from lakesink.protocol.mutation import (
    OPERATION_COLUMN,
    SOURCE_POSITION_COLUMN,
    UNAVAILABLE_COLUMN,
    RowOperation,
)
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.settings import parse_op_values

FIXTURES = Path(__file__).parent / "fixtures" / "debezium"
INSERT, UPDATE, DELETE = (op.code for op in RowOperation)
SOURCE = {"connector": "postgresql", "ts_ms": 1, "sequence": '["100","200"]', "lsn": 200}


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def encoded(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def event(op: str, row: dict[str, Any] | None, source: Any = SOURCE) -> bytes:
    side = "before" if op == "d" else "after"
    return encoded({"before": None, "after": None, side: row, "source": source, "op": op})


def customers(**kw: Any) -> ChangeDeserializer:
    return ChangeDeserializer(COLUMNS["customers"], ("id",), **kw)


def column(decoded: Any, name: str) -> list[Any]:
    return decoded.table.column(name).to_pylist()  # type: ignore[no-any-return]


# --- captured events ------------------------------------------------------------------------


@pytest.mark.parametrize("name", VARIANTS)
def test_captured_changes_become_rows_and_tombstones_are_skipped(name: str) -> None:
    mine = [r for r in records(name) if r.table == "customers"]
    out = customers().decode([r.value for r in mine])
    assert out.failures == {}
    assert out.skipped == frozenset(i for i, r in enumerate(mine) if r.value is None)
    assert len(out.skipped) == 2  # after the delete of 3 and of the key change's old key 2
    assert out.table.num_rows == len(mine) - 2
    assert out.table.schema == customers().value_schema
    changes = [r for r in mine if r.value is not None]
    expected_ops = {"r": INSERT, "c": INSERT, "u": UPDATE, "d": DELETE}
    assert column(out, OPERATION_COLUMN) == [expected_ops[r.envelope["op"]] for r in changes]
    assert column(out, "id") == [
        (r.envelope["before"] if r.envelope["op"] == "d" else r.envelope["after"])["id"]
        for r in changes
    ]


def test_the_schema_is_the_declared_rows_then_the_added_columns() -> None:
    schema = customers().value_schema
    assert schema.names == [
        *COLUMNS["customers"].names,
        SOURCE_POSITION_COLUMN,
        OPERATION_COLUMN,
        UNAVAILABLE_COLUMN,
    ]
    assert schema.field(OPERATION_COLUMN).type == pa.int8()
    assert schema.field(UNAVAILABLE_COLUMN).type == pa.list_(pa.string())
    assert schema.field(SOURCE_POSITION_COLUMN).type == pa.string()
    assert schema.field("balance").type == pa.decimal128(12, 2)


def test_key_columns_keep_their_declared_nullability_and_the_others_take_nulls() -> None:
    rows = pa.schema([pa.field("id", pa.int32(), nullable=False),
                      pa.field("name", pa.string(), nullable=False)])  # fmt: skip
    schema = ChangeDeserializer(rows, ("id",)).value_schema
    assert not schema.field("id").nullable and schema.field("name").nullable


def test_captured_decimals_land_as_the_declared_decimal_type() -> None:
    mine = [r for r in records(PLAIN) if r.table == "customers" and r.value is not None]
    out = customers().decode([r.value for r in mine])
    assert out.table.column("balance").type == pa.decimal128(12, 2)
    inserted = [r["balance"] for r in out.table.to_pylist() if r["name"] == "Barbara"]
    assert inserted == [Decimal("-1234567890.12"), Decimal("5.00")]  # insert, then update


@pytest.mark.parametrize("name", VARIANTS)
def test_captured_deletes_hold_their_key_and_nulls(name: str) -> None:
    mine = [r for r in records(name) if r.table == "customers" and r.value is not None]
    out = customers().decode([r.value for r in mine])
    rows = out.table.to_pylist()
    deletes = [r for r in rows if r[OPERATION_COLUMN] == DELETE]
    assert [r["id"] for r in deletes] == [3, 2]
    for row in deletes:
        # before held Debezium's stand-ins ('' and the epoch) under REPLICA IDENTITY DEFAULT
        assert {k: v for k, v in row.items() if k not in ("id", SOURCE_POSITION_COLUMN)} == {
            "name": None,
            "balance": None,
            "updated_at": None,
            "photo": None,
            "notes": None,
            OPERATION_COLUMN: DELETE,
            UNAVAILABLE_COLUMN: None,
        }
        assert row[SOURCE_POSITION_COLUMN]


@pytest.mark.parametrize("name", VARIANTS)
def test_captured_toast_placeholders_are_unavailable_columns_holding_null(name: str) -> None:
    mine = [r for r in records(name) if r.table == "customers" and r.value is not None]
    out = customers().decode([r.value for r in mine])
    by_step = {}
    for record, row in zip(mine, out.table.to_pylist(), strict=True):
        by_step.setdefault(record.step, []).append(row)
    (kept,) = by_step["update_keeps_toast"]
    assert kept[UNAVAILABLE_COLUMN] == ["notes", "photo"]
    assert kept["notes"] is None and kept["photo"] is None and kept["name"] == "Grace"
    (notes,) = by_step["update_notes"]
    assert notes[UNAVAILABLE_COLUMN] == ["photo"] and notes["notes"] == "rewritten"
    assert all(r[UNAVAILABLE_COLUMN] is None for r in by_step["insert"])


def test_captured_source_positions_order_the_rows_of_a_partition() -> None:
    mine = [r for r in records(PLAIN) if r.table == "customers" and r.value is not None]
    positions = column(customers().decode([r.value for r in mine]), SOURCE_POSITION_COLUMN)
    assert all(len(p) == 32 for p in positions)
    assert positions == sorted(positions)


def test_captured_key_change_is_a_delete_and_an_insert_of_the_new_key() -> None:
    mine = [r for r in records(PLAIN) if r.table == "customers" and r.step == "key_change"]
    out = customers().decode([r.value for r in mine])
    assert out.skipped == {1}
    assert list(zip(column(out, "id"), column(out, OPERATION_COLUMN), strict=True)) == [
        (2, DELETE),
        (20, INSERT),
    ]
    assert column(out, UNAVAILABLE_COLUMN) == [None, ["photo"]]


def test_captured_orders_table_decodes_its_own_columns() -> None:
    mine = [r for r in records(PLAIN) if r.table == "orders"]
    out = ChangeDeserializer(COLUMNS["orders"], ("id",)).decode([r.value for r in mine])
    assert out.failures == {} and len(out.skipped) == 1
    assert out.table.select(["id", "customer_id", "amount", OPERATION_COLUMN]).to_pylist() == [
        {"id": 1, "customer_id": 20, "amount": Decimal("15.00"), OPERATION_COLUMN: INSERT},
        {"id": 2, "customer_id": 1, "amount": Decimal("5.00"), OPERATION_COLUMN: INSERT},
        # before held the type zeros 0 and 0.00 for the non-key columns
        {"id": 2, "customer_id": None, "amount": None, OPERATION_COLUMN: DELETE},
    ]


def test_wrapped_and_plain_captures_give_the_same_rows_but_snapshot_positions() -> None:
    def rows(name: str) -> list[dict[str, Any]]:
        mine = [r for r in records(name) if r.table == "customers"]
        out = customers().decode([r.value for r in mine]).table.to_pylist()
        return [{k: v for k, v in r.items() if k != SOURCE_POSITION_COLUMN} for r in out]

    assert rows(PLAIN) == rows(WRAPPED)


# --- hand-made events: failures by index, with reasons ----------------------------------------


def test_bad_records_are_failures_by_index_and_good_ones_stay_in_order() -> None:
    values = [
        event("c", {"id": 1, "name": "a"}),
        encoded(fixture("unknown_op.json")),
        encoded(fixture("pg_truncate.json")),
        encoded(fixture("insert_without_key_value.json")),
        b"{not json",
        b"[1, 2]",
        encoded({"after": {"id": 9}}),
        event("u", {"id": 2, "balance": "1.234"}),
        event("u", {"id": 3, "name": 7}),
        encoded(fixture("pg_delete_replica_identity_nothing.json")["value"]),
        None,
        event("u", {"id": 4, "name": "b"}),
        b"[" * 100_000 + b"]" * 100_000,
    ]
    out = customers().decode(values)
    assert column(out, "id") == [1, 4]
    assert out.skipped == {10}
    reasons = out.failures
    assert sorted(reasons) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 12]
    assert "nested too deeply" in reasons[12]
    assert "unknown Debezium operation 'x'" in reasons[1]
    assert "truncate" in reasons[2]
    assert "no value for key column 'id'" in reasons[3]
    assert "not JSON" in reasons[4]
    assert "JSON object, not list" in reasons[5]
    assert "no 'op' field" in reasons[6]
    assert "more than 2 fractional digits" in reasons[7]
    assert reasons[8].startswith("the change does not fit the rows")
    assert "no value for key column 'id'" in reasons[9]  # a delete without before: no key


def test_an_event_without_a_source_position_fails_unless_an_ordering_field_orders_it() -> None:
    values = [event("c", {"id": 1, "name": "a"}, source=None)]
    assert "no position" in customers().decode(values).failures[0]
    rows = pa.schema([("id", pa.int32()), ("version", pa.int64())])
    ordered = ChangeDeserializer(rows, ("id",), ordering_field="version")
    out = ordered.decode([event("c", {"id": 1, "version": 3}, source=None)])
    assert out.failures == {} and column(out, "version") == [3]


def test_with_an_ordering_field_a_delete_keeps_its_ordering_value_and_no_position_is_added() -> (
    None
):
    rows = pa.schema([("id", pa.int32()), ("version", pa.int64()), ("name", pa.string())])
    d = ChangeDeserializer(rows, ("id",), ordering_field="version")
    assert SOURCE_POSITION_COLUMN not in d.value_schema.names
    # REPLICA IDENTITY FULL: before holds the deleted row, its ordering value included
    out = d.decode([event("d", {"id": 1, "version": 7, "name": "gone"})])
    assert out.table.to_pylist() == [
        {"id": 1, "version": 7, "name": None, OPERATION_COLUMN: DELETE, UNAVAILABLE_COLUMN: None}
    ]


def test_timestamps_take_iso_text_or_numbers_in_the_unit_the_schema_names() -> None:
    rows = pa.schema([("id", pa.int32()), ("at", pa.timestamp("us", tz="UTC")),
                      ("day", pa.date32())])  # fmt: skip

    def wrapped(at: Any, name: str | None) -> bytes:
        at_schema = {"type": "int64", "optional": True, "field": "at"}
        if name:
            at_schema["name"] = name
        fields = [{"type": "int32", "field": "id"}, at_schema,
                  {"type": "int32", "name": "io.debezium.time.Date", "field": "day"}]  # fmt: skip
        schema = {"type": "struct", "fields": [
            {"type": "struct", "field": "after", "fields": fields}]}  # fmt: skip
        payload = {"before": None, "after": {"id": 1, "at": at, "day": 20_000},
                   "source": SOURCE, "op": "c"}  # fmt: skip
        return encoded({"schema": schema, "payload": payload})

    d = ChangeDeserializer(rows, ("id",))
    out = d.decode(
        [
            event("c", {"id": 1, "at": "2026-11-27T08:00:00.123456Z", "day": "2024-02-29"}),
            wrapped(1_700_000_000_123_456, "io.debezium.time.MicroTimestamp"),
            wrapped(1_700_000_000_123, "io.debezium.time.Timestamp"),
            wrapped(1_700_000_000_123_456_000, "io.debezium.time.NanoTimestamp"),
            wrapped(1_700_000_000_123_456_789, "io.debezium.time.NanoTimestamp"),
            event("c", {"id": 1, "at": 1_700_000_000_123_456}),
            event("c", {"id": 1, "at": "2026-11-27"}),
        ]
    )
    micros = [t.timestamp() for t in column(out, "at")]
    assert micros == pytest.approx(
        [1795766400.123456, 1700000000.123456, 1700000000.123, 1700000000.123456]
    )
    assert str(column(out, "day")[0]) == "2024-02-29" and str(column(out, "day")[1]) == "2024-10-04"
    assert "nanoseconds" in out.failures[4]
    assert "unknown unit" in out.failures[5]
    assert "column 'at'" in out.failures[6] and "timestamp" in out.failures[6]


def test_undeclared_fields_are_ignored_and_missing_ones_are_null() -> None:
    out = customers().decode([event("c", {"id": 1, "extra": True})])
    (row,) = out.table.to_pylist()
    assert row["id"] == 1 and row["name"] is None and "extra" not in row


def test_a_key_column_that_is_not_declared_is_refused() -> None:
    with pytest.raises(ConfigError, match="tenant"):
        ChangeDeserializer(COLUMNS["customers"], ("id", "tenant"))


# --- an operation field ---------------------------------------------------------------------


def test_operation_field_records_map_their_values_and_unknown_values_fail() -> None:
    rows = pa.schema([("id", pa.string()), ("op_type", pa.string()), ("qty", pa.int64()),
                      ("updated_at", pa.int64())])  # fmt: skip
    d = ChangeDeserializer(
        rows,
        ("id",),
        cdc_format="field",
        ordering_field="updated_at",
        op_field="op_type",
        op_values=parse_op_values("I=insert,U=update,D=delete"),
    )
    assert SOURCE_POSITION_COLUMN not in d.value_schema.names
    values = [encoded(r) for r in fixture("operation_field_records.json")] + [None]
    out = d.decode(values)
    assert out.skipped == {4}
    assert "'X'" in out.failures[3] and "not one of D, I, U" in out.failures[3]
    assert out.table.to_pylist() == [
        {"id": "a", "op_type": "I", "qty": 1, "updated_at": 100,
         OPERATION_COLUMN: INSERT, UNAVAILABLE_COLUMN: None},
        {"id": "a", "op_type": "U", "qty": 2, "updated_at": 200,
         OPERATION_COLUMN: UPDATE, UNAVAILABLE_COLUMN: None},
        {"id": "a", "op_type": None, "qty": None, "updated_at": 300,
         OPERATION_COLUMN: DELETE, UNAVAILABLE_COLUMN: None},
    ]  # fmt: skip


def test_a_numeric_operation_field_matches_by_its_json_text() -> None:
    rows = pa.schema([("id", pa.int64()), ("kind", pa.int8())])
    d = ChangeDeserializer(rows, ("id",), cdc_format="field", op_field="kind",
                           op_values=parse_op_values("1=insert,2=update,3=delete"))  # fmt: skip
    out = d.decode([encoded({"id": 1, "kind": 1}), encoded({"id": 1, "kind": 3})])
    assert column(out, OPERATION_COLUMN) == [INSERT, DELETE]
    with pytest.raises(ConfigError, match=r"cdc\.op\.field=op"):
        ChangeDeserializer(rows, ("id",), cdc_format="field")


# --- Confluent-framed Avro envelopes --------------------------------------------------------


def _framed(schema_id: int, record: dict[str, Any] | None) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(envelope_schema()), record)
    return b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()


def _avro_config(tmp_path: Path, **extra: Any) -> Any:
    avsc = tmp_path / "envelope.avsc"
    avsc.write_text(json.dumps(envelope_schema()))
    return build_config(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9092",
            "kafka.topics": "shop.public.customers",
            "table.path": str(tmp_path / "t"),
            "write.operation": "cdc",
            "table.record.key.fields": "id",
            "value.format": "avro",
            "value.schema.file": str(avsc),
            "value.avro.schema.ids": "7",
            **extra,
        }
    )


def test_confluent_framed_avro_envelopes_decode_as_json_ones_do(tmp_path: Path) -> None:
    from lakesink.spark.source import value_deserializer

    d = value_deserializer(_avro_config(tmp_path))
    assert isinstance(d, ChangeDeserializer)
    source = {"connector": "postgresql", "ts_ms": 1, "sequence": '["10","20"]', "lsn": 20}
    row = {"id": 1, "name": "Ada", "updated": 1_700_000_000_000_001, "balance": "2.50"}
    values = [
        _framed(7, {"before": None, "after": row, "source": source, "op": "c"}),
        _framed(7, {"before": row, "after": None, "source": source, "op": "d"}),
        None,
        _framed(8, {"before": None, "after": row, "source": source, "op": "c"}),
        _framed(7, {"before": None, "after": row, "source": source, "op": "t"}),
    ]
    out = d.decode(values)
    assert out.skipped == {2}
    assert "schema id 8" in out.failures[3] and "truncate" in out.failures[4]
    first, deleted = out.table.to_pylist()
    assert first["updated"] == 1_700_000_000_000_001  # the envelope's long: no unit guessed
    assert first[SOURCE_POSITION_COLUMN] == f"{10:016x}{20:016x}"
    assert (first[OPERATION_COLUMN], deleted[OPERATION_COLUMN]) == (INSERT, DELETE)
    assert deleted["id"] == 1 and deleted["name"] is None


def test_avro_rows_declared_in_value_schema_take_decimals_and_timestamps(tmp_path: Path) -> None:
    from lakesink.spark.source import value_deserializer

    ddl = "id INT, balance DECIMAL(10,2), updated TIMESTAMP"
    d = value_deserializer(_avro_config(tmp_path, **{"value.schema": ddl}))
    assert d.row_schema.names == ["id", "balance", "updated"]
    source = {"connector": "postgresql", "ts_ms": 1, "lsn": 20}
    row = {"id": 1, "name": "Ada", "updated": 1_700_000_000_000_001, "balance": "2.5"}
    out = d.decode([_framed(7, {"before": None, "after": row, "source": source, "op": "r"})])
    assert column(out, "balance") == [Decimal("2.50")]
    # the Avro schema's connect.name gives the unit: io.debezium.time.MicroTimestamp
    assert column(out, "updated")[0].timestamp() == pytest.approx(1_700_000_000.000001)


def test_append_keeps_the_plain_deserializer(tmp_path: Path) -> None:
    from lakesink.kafka.json_bulk import JsonDeserializer
    from lakesink.spark.source import value_deserializer

    cfg = build_config({"kafka.bootstrap.servers": "h:1", "kafka.topics": "t",
                        "table.path": str(tmp_path / "t"), "value.schema": "id INT"})  # fmt: skip
    assert isinstance(value_deserializer(cfg), JsonDeserializer)


# --- the reader drops skipped records ---------------------------------------------------------


def _reader(d: Deserializer, tolerance: str, dead: list[FailedRecord]) -> _RangeReader:
    r = OffsetRange(TopicPartition("t", 0), 0, 100)
    return _RangeReader(
        "unused:9092", r, d, output_schema(d), {}, 100, tolerance, dead.append,  # type: ignore[arg-type]
        RangeReadStats(), 0.1, 1.0,
    )  # fmt: skip


class _BadHeaderKeyMessage(Message):  # type: ignore[misc]
    def headers(self) -> Any:
        raise SystemError("<method 'headers'> returned a result with an exception set")


def _msg(offset: int, value: bytes | None, cls: type[Message] = Message) -> Message:
    return cls(topic="t", partition=0, offset=offset, value=value, timestamp=(1, 1000))


def test_the_reader_drops_tombstones_without_dead_letters_and_counts_them() -> None:
    dead: list[FailedRecord] = []
    reader = _reader(customers(), "all", dead)
    msgs = [
        _msg(0, event("d", {"id": 3})),
        _msg(1, None),
        _msg(2, b"garbage"),
        _msg(3, event("c", {"id": 4, "name": "d"})),
    ]
    (batch,) = reader._emit(msgs)
    assert batch.column("kafka_offset").to_pylist() == [0, 3]
    assert batch.column("id").to_pylist() == [3, 4]
    assert batch.column(OPERATION_COLUMN).to_pylist() == [DELETE, INSERT]
    assert [f.offset for f in dead] == [2]
    st = reader.stats
    counts = (st.records_read, st.records_emitted, st.records_skipped, st.dead_letters)
    assert counts == (4, 2, 1, 1)


def test_a_batch_of_tombstones_only_emits_nothing_and_raises_nothing() -> None:
    reader = _reader(customers(), "none", [])
    assert list(reader._emit([_msg(0, None), _msg(1, None)])) == []
    assert reader.stats.records_skipped == 2 and reader.stats.dead_letters == 0


def test_a_tombstone_with_unreadable_headers_is_a_dead_letter_and_rows_stay_aligned() -> None:
    dead: list[FailedRecord] = []
    reader = _reader(customers(), "all", dead)
    msgs = [
        _msg(0, None, _BadHeaderKeyMessage),
        _msg(1, None),
        _msg(2, event("c", {"id": 5}), _BadHeaderKeyMessage),
        _msg(3, event("c", {"id": 6})),
    ]
    (batch,) = reader._emit(msgs)
    assert batch.column("id").to_pylist() == [6]
    assert [(f.offset, f.error) for f in dead] == [(0, UNREADABLE_HEADERS), (2, UNREADABLE_HEADERS)]
    assert reader.stats.records_skipped == 1


def test_upsert_values_without_a_key_are_failures_with_their_reason() -> None:
    from lakesink.kafka.changes import KeyedValues
    from lakesink.kafka.deserializers import make_deserializer

    values = KeyedValues(
        make_deserializer("json", schema="id STRING, region STRING, n INT"), ("id", "region")
    )
    decoded = values.decode(
        [
            b'{"id": "a", "region": "eu", "n": 1}',
            b'{"id": null, "region": "eu", "n": 2}',
            b"not json",
            b'{"id": "", "region": "", "n": 3}',
            b'{"id": "", "region": "us", "n": 4}',
            b'{"id": "b", "region": null, "n": 5}',
        ]
    )
    assert decoded.table.column("n").to_pylist() == [1, 4]
    assert decoded.failures[1] == "the record key column 'id' is null"
    assert decoded.failures[3] == "the record key is empty text"
    assert decoded.failures[5] == "the record key column 'region' is null"
    assert set(decoded.failures) == {1, 2, 3, 5}
    assert values.value_schema == values.inner.value_schema
