"""Debezium change events and operation-field records as row changes (lakesink.kafka.debezium),
from hand-written envelopes in tests/unit/fixtures/debezium/."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakesink.errors import RecordError
from lakesink.kafka.debezium import (
    PLACEHOLDER,
    DebeziumDecoder,
    OperationFieldDecoder,
    RowValues,
    source_position,
)
from lakesink.protocol.mutation import RowChange, RowOperation

FIXTURES = Path(__file__).parent / "fixtures" / "debezium"
COLUMNS = pa.schema(
    [
        ("id", pa.int32()),
        ("name", pa.string()),
        ("balance", pa.decimal128(10, 2)),
        ("credit", pa.decimal128(10, 2)),
        ("photo", pa.binary()),
    ]
)
DECODER = DebeziumDecoder(("id",), RowValues(COLUMNS))


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def encoded(obj: Any) -> bytes | None:
    return None if obj is None else json.dumps(obj).encode()


def decode(name: str, decoder: DebeziumDecoder = DECODER) -> Any:
    return decoder.decode_json(encoded(fixture(name)))


# --- the protocol values --------------------------------------------------------------------


def test_row_operation_codes_round_trip_and_parse_in_any_case() -> None:
    for op in RowOperation:
        assert RowOperation.from_code(op.code) is op
    assert RowOperation.parse(" Delete ") is RowOperation.DELETE
    assert RowOperation.DELETE.is_delete and not RowOperation.UPDATE.is_delete
    with pytest.raises(RecordError, match="3"):
        RowOperation.from_code(3)
    with pytest.raises(RecordError, match="upsert"):
        RowOperation.parse("upsert")


def test_row_change_refuses_a_key_without_value_and_freezes_its_row() -> None:
    with pytest.raises(RecordError, match="'id' has no value"):
        RowChange(RowOperation.INSERT, (("id", None),), {})
    with pytest.raises(RecordError, match="unavailable"):
        RowChange(RowOperation.UPDATE, (("id", 1),), {}, unavailable=frozenset({"id"}))
    source = {"id": 1}
    change = RowChange(RowOperation.INSERT, (("id", 1),), source)
    source["id"] = 2
    assert change.row["id"] == 1 and change.key_values == (1,)
    with pytest.raises(TypeError):
        change.row["id"] = 3  # type: ignore[index]


# --- operations and rows --------------------------------------------------------------------


def test_snapshot_read_is_an_insert_of_after_with_string_decimal_as_decimal() -> None:
    event = decode("pg_snapshot_read.json")
    assert event.operation is RowOperation.INSERT
    assert event.key == (("id", 1),)
    assert event.row == {"id": 1, "name": "Ada", "balance": Decimal("10.50")}
    assert event.connector == "postgresql" and event.unavailable == frozenset()


def test_create_without_schema_wrapper_is_an_insert() -> None:
    event = decode("pg_insert_schemaless.json")
    assert event.operation is RowOperation.INSERT
    assert event.row["name"] == "Grace"


def test_update_with_schema_wrapper_reads_a_precise_decimal_from_its_field_schema() -> None:
    event = decode("pg_update_with_schema.json")
    assert event.operation is RowOperation.UPDATE
    assert event.row["credit"] == Decimal("1234.56")
    assert event.row["balance"] == Decimal("8.00")
    # Without target types, a precise decimal still decodes through the envelope's schema.
    plain = DebeziumDecoder(("id",)).decode_json(encoded(fixture("pg_update_with_schema.json")))
    assert plain is not None and plain.row["credit"] == Decimal("1234.56")


def test_unavailable_toast_values_become_null_and_named_for_text_bytea_json_and_arrays() -> None:
    event = decode("pg_update_toast.json")
    assert event.unavailable == frozenset({"notes", "photo", "profile", "tags"})
    assert all(event.row[c] is None for c in event.unavailable)
    assert event.row["name"] == "Edsger"


def test_placeholder_forms_and_base64_only_where_bytes_may_be() -> None:
    values = RowValues()
    raw = PLACEHOLDER.encode()
    assert values.is_placeholder(PLACEHOLDER)
    assert values.is_placeholder(raw)
    assert values.is_placeholder(list(raw))
    assert values.is_placeholder([PLACEHOLDER])
    assert values.is_placeholder("X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==")
    assert not values.is_placeholder("X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==", maybe_bytes=False)
    assert not values.is_placeholder([PLACEHOLDER, "x"])
    assert not values.is_placeholder("text")
    custom = DebeziumDecoder(("id",), RowValues(placeholder="~missing~"))
    event = custom.from_envelope({"op": "u", "after": {"id": 1, "a": "~missing~"}}, {})
    assert event.unavailable == frozenset({"a"})


def test_delete_takes_before_with_key_only_under_replica_identity_default() -> None:
    event = decode("pg_delete_replica_identity_default.json")
    assert event.operation is RowOperation.DELETE
    assert event.key == (("id", 2),)
    assert event.row == {"id": 2, "name": None, "balance": None}


def test_delete_without_before_takes_the_key_from_the_record_key() -> None:
    record = fixture("pg_delete_replica_identity_nothing.json")
    event = DECODER.decode_json(encoded(record["value"]), encoded(record["key"]))
    assert event is not None and event.operation is RowOperation.DELETE
    assert event.key == (("id", 5),) and event.row == {"id": 5}
    wrapped_key = encoded({"schema": {"type": "struct"}, "payload": record["key"]})
    assert DECODER.decode_json(encoded(record["value"]), wrapped_key) == event
    with pytest.raises(RecordError, match="no value for key column 'id'"):
        DECODER.decode_json(encoded(record["value"]))


def test_primary_key_change_is_delete_tombstone_create_each_on_its_own() -> None:
    records = fixture("pg_primary_key_change.json")
    decoded = DECODER.decode_all(
        [encoded(r["value"]) for r in records], [encoded(r["key"]) for r in records]
    )
    assert decoded.failures == {} and decoded.tombstones == [1]
    (i0, delete), (i2, create) = decoded.events
    assert (i0, delete.operation, delete.key) == (0, RowOperation.DELETE, (("id", 1),))
    assert (i2, create.operation, create.key) == (2, RowOperation.INSERT, (("id", 10),))


def test_tombstones_with_and_without_schema_wrapper_yield_nothing() -> None:
    assert DECODER.decode_json(None) is None
    assert DECODER.decode_json(b'{"schema": null, "payload": null}') is None
    assert DECODER.from_avro(None) is None


# --- ordering -------------------------------------------------------------------------------


def test_postgres_position_orders_by_commit_not_by_lsn() -> None:
    first, second = (
        DECODER.from_envelope(e, {}) for e in fixture("pg_two_transactions_interleaved_lsn.json")
    )
    # The later-committed transaction has the lower LSN but the higher position.
    assert second.position is not None and first.position is not None
    assert second.position > first.position
    assert second.ordering == second.position
    assert second.position == f"{23606400:016x}{23606100:016x}"


def test_snapshot_positions_order_below_streamed_ones() -> None:
    snapshot = decode("pg_snapshot_read.json")
    streamed = decode("pg_insert_schemaless.json")
    assert snapshot.position == f"{0:016x}{23600000:016x}"
    assert snapshot.position < streamed.position


def test_position_of_each_supported_connector() -> None:
    assert source_position({"connector": "postgresql", "lsn": 5}) == f"{0:016x}{5:016x}"
    mysql = decode("mysql_update.json")
    assert mysql.position == f"{3:016x}{484:016x}{0:016x}"
    assert source_position(
        {"connector": "sqlserver", "commit_lsn": "00000027:00000758:0005", "change_lsn": "x"}
    ) == ("00000027:00000758:0005x")
    assert source_position({"connector": "oracle", "ts_ms": 255}) == f"{255:016x}"
    assert source_position({"connector": "oracle"}) is None


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"connector": "postgresql", "sequence": "[1]"}, "not \\[last committed lsn, lsn\\]"),
        ({"connector": "postgresql", "sequence": "[1, null]"}, "not \\[last committed lsn"),
        ({"connector": "postgresql", "sequence": "{"}, "not a JSON array"),
        ({"connector": "postgresql", "sequence": '["a", "1"]'}, "is not a number"),
        ({"connector": "postgresql", "lsn": -1}, "not an unsigned 64-bit"),
        ({"connector": "mysql", "file": "binlog", "pos": 1}, "binlog number"),
    ],
)
def test_malformed_positions_are_failures_with_a_reason(
    source: dict[str, Any], message: str
) -> None:
    with pytest.raises(RecordError, match=message):
        source_position(source)


def test_ordering_path_reads_any_scalar_of_the_envelope() -> None:
    by_ts = DebeziumDecoder(("id",), ordering_path="source.ts_ms")
    event = by_ts.decode_json(encoded(fixture("mysql_update.json")))
    assert event is not None and event.ordering == 1764230400900
    by_after = DebeziumDecoder(("id",), ordering_path="after.missing")
    with pytest.raises(RecordError, match=r"no field 'after\.missing'"):
        by_after.decode_json(encoded(fixture("mysql_update.json")))
    by_row = DebeziumDecoder(("id",), ordering_path="after")
    with pytest.raises(RecordError, match="not a scalar"):
        by_row.decode_json(encoded(fixture("mysql_update.json")))
    nullable = DebeziumDecoder(("id",), ordering_path="transaction")
    event = nullable.decode_json(encoded(fixture("mysql_update.json")))
    assert event is not None and event.ordering is None


# --- bad records ----------------------------------------------------------------------------


def test_bad_records_are_failures_with_reasons_never_silent() -> None:
    values = [
        encoded(fixture("pg_truncate.json")),
        encoded(fixture("unknown_op.json")),
        encoded(fixture("insert_without_key_value.json")),
        b"not json",
        b"[1, 2]",
        encoded({"before": None, "after": {"id": 1}}),
        encoded({"op": "u", "after": None}),
        encoded({"op": "c", "after": [1]}),
        encoded({"op": "c", "after": {"id": 1}, "source": "pg"}),
        encoded({"op": "c", "after": {"id": 1, "balance": "1.234"}}),
        encoded({"op": "c", "after": {"id": 1, "balance": "123456789.00"}}),
        encoded({"op": "c", "after": {"id": 1, "balance": "abc"}}),
        encoded({"op": "c", "after": {"id": 1, "photo": "!!"}}),
    ]
    decoded = DECODER.decode_all(values)
    assert decoded.events == [] and decoded.tombstones == []
    reasons = decoded.failures
    assert sorted(reasons) == list(range(len(values)))
    assert "truncate" in reasons[0] and "skipped.operations=t" in reasons[0]
    assert "unknown Debezium operation 'x'" in reasons[1]
    assert "no value for key column 'id'" in reasons[2]
    assert "not JSON" in reasons[3]
    assert "not list" in reasons[4]
    assert "no 'op' field" in reasons[5]
    assert "no 'after' row" in reasons[6]
    assert "not a row object" in reasons[7]
    assert "'source' of the event is not an object" in reasons[8]
    assert "more than 2 fractional digits" in reasons[9]
    assert "does not fit decimal(10,2)" in reasons[10]
    assert "not a decimal number" in reasons[11]
    assert "not base64" in reasons[12]


def test_avro_envelope_maps_like_json() -> None:
    envelope = fixture("pg_insert_schemaless.json")
    avro = dict(envelope, after=dict(envelope["after"], balance=Decimal("7.25")))
    from_json = DECODER.decode_json(encoded(envelope))
    from_avro = DECODER.from_avro(avro, key={"id": 2})
    assert from_avro == from_json
    delete = DECODER.from_avro(
        {"op": "d", "before": None, "after": None, "source": {"connector": "postgresql"}},
        key={"id": 9},
    )
    assert delete is not None and delete.key == (("id", 9),)


def test_keys_must_be_given_and_all_key_columns_read() -> None:
    with pytest.raises(RecordError, match="at least one key column"):
        DebeziumDecoder(())
    two = DebeziumDecoder(("id", "name"))
    event = two.decode_json(encoded(fixture("mysql_update.json")))
    assert event is not None and event.key == (("id", 4), ("name", "new"))


# --- the operation field --------------------------------------------------------------------


OPS = {"I": RowOperation.INSERT, "U": RowOperation.UPDATE, "D": RowOperation.DELETE}


def test_operation_field_maps_values_and_orders_by_a_path() -> None:
    decoder = OperationFieldDecoder("op_type", OPS, ("id",), ordering_path="updated_at")
    decoded = decoder.decode_all([encoded(r) for r in fixture("operation_field_records.json")])
    ops = [(e.operation, e.ordering) for _, e in decoded.events]
    assert ops == [
        (RowOperation.INSERT, 100),
        (RowOperation.UPDATE, 200),
        (RowOperation.DELETE, 300),
    ]
    assert "'X', not one of D, I, U" in decoded.failures[3]
    assert decoded.events[0][1].row["op_type"] == "I"


def test_operation_field_bad_records_and_tombstones() -> None:
    decoder = OperationFieldDecoder(
        "op", {"1": RowOperation.INSERT, "true": RowOperation.DELETE}, ("id",)
    )
    values = [None, b"null", b'{"id": 1}', b'{"id": 1, "op": 1}', b'{"id": 2, "op": true}', b"3"]
    decoded = decoder.decode_all(values)
    assert decoded.tombstones == [0, 1]
    assert [(i, e.operation) for i, e in decoded.events] == [
        (3, RowOperation.INSERT),
        (4, RowOperation.DELETE),
    ]
    assert "no operation field 'op'" in decoded.failures[2]
    assert "not an object" in decoded.failures[5]
    with pytest.raises(RecordError, match="maps no values"):
        OperationFieldDecoder("op", {}, ("id",))
    with pytest.raises(RecordError, match="2 keys for 1 values"):
        decoder.decode_all([None], [None, None])
