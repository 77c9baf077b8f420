"""lakesink's Debezium decoder (lakesink.kafka.debezium) against change events captured from a
real Debezium PostgreSQL connector: tests/unit/fixtures/debezium/captured/, written by capture.py
there (its docstring lists the steps; each record names the step whose transaction wrote it).

The same changes were captured twice, with the JSON converters' `schema`/`payload` wrapper
(`pg_json_schemas.json`) and without it (`pg_json.json`); both decode to the same changes.
"""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakesink.kafka.debezium import ChangeEvent, DebeziumDecoder, RowValues
from lakesink.protocol.mutation import RowOperation

CAPTURED = Path(__file__).parent / "fixtures" / "debezium" / "captured"
PLAIN = "pg_json.json"
WRAPPED = "pg_json_schemas.json"
VARIANTS = (PLAIN, WRAPPED)

# The tables' row schemas as a lakesink table would hold them (capture.py creates the tables).
COLUMNS = {
    "customers": pa.schema(
        [
            ("id", pa.int32()),
            ("name", pa.string()),
            ("balance", pa.decimal128(12, 2)),
            ("updated_at", pa.string()),
            ("photo", pa.binary()),
            ("notes", pa.string()),
        ]
    ),
    "orders": pa.schema(
        [("id", pa.int32()), ("customer_id", pa.int32()), ("amount", pa.decimal128(12, 2))]
    ),
}
LONG_NOTES = ("lakesink captured notes " * 90)[:2100]
LONG_PHOTO = bytes(range(256)) * 8 + bytes(range(52))
INSERT, UPDATE, DELETE = RowOperation.INSERT, RowOperation.UPDATE, RowOperation.DELETE


def compact(obj: Any) -> bytes:
    """The JSON converter's bytes of a stored key or value (capture.py checked the round trip)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True, slots=True)
class Captured:
    """One captured Kafka record, its key and value as the connector wrote them."""

    step: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Mapping[str, str | None]

    @property
    def table(self) -> str:
        return self.topic.rsplit(".", 1)[1]

    @property
    def envelope(self) -> Any:
        """The value's envelope, unwrapped from schema/payload (None for a tombstone)."""
        if self.value is None:
            return None
        parsed = json.loads(self.value)
        return parsed.get("payload", parsed)


def _raw(record: Mapping[str, Any], name: str) -> bytes | None:
    if f"{name}_text" in record:
        return str(record[f"{name}_text"]).encode()
    return None if record[name] is None else compact(record[name])


@cache
def golden(name: str) -> Mapping[str, Any]:
    return json.loads((CAPTURED / name).read_text())  # type: ignore[no-any-return]


@cache
def records(name: str) -> tuple[Captured, ...]:
    return tuple(
        Captured(
            r["step"],
            r["topic"],
            r["partition"],
            r["offset"],
            _raw(r, "key"),
            _raw(r, "value"),
            r.get("headers", {}),
        )
        for r in golden(name)["records"]
    )


def decoder(table: str) -> DebeziumDecoder:
    return DebeziumDecoder(("id",), RowValues(COLUMNS[table]))


def decoded(name: str) -> list[tuple[Captured, ChangeEvent | None]]:
    """Every record with its decoded event (None for a tombstone), in capture order."""
    return [(r, decoder(r.table).decode_json(r.value, r.key)) for r in records(name)]


def events(name: str, step: str) -> list[tuple[str, ChangeEvent]]:
    """The events of one step (tombstones left out) as (table, event), in offset order."""
    return [(r.table, e) for r, e in decoded(name) if r.step == step and e is not None]


def step_order(name: str) -> list[str]:
    return [s["name"] for s in golden(name)["steps"]]


def streamed(name: str) -> list[tuple[Captured, ChangeEvent]]:
    return [(r, e) for r, e in decoded(name) if e is not None and r.step != "snapshot"]


def sources(step: str) -> list[Mapping[str, Any]]:
    """The `source` blocks of one step's records without the schema wrapper."""
    return [r.envelope["source"] for r in records(PLAIN) if r.step == step and r.value]


# --- every record -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", VARIANTS)
def test_every_captured_record_decodes_and_tombstones_follow_deletes_of_their_key(
    name: str,
) -> None:
    assert len(records(name)) == 20  # capture.py's steps: 17 changes, 3 tombstones
    for table in COLUMNS:
        mine = [r for r in records(name) if r.table == table]
        outcome = decoder(table).decode_all([r.value for r in mine], [r.key for r in mine])
        assert outcome.failures == {}
        for i in outcome.tombstones:
            tombstone, before = mine[i], mine[i - 1]
            assert tombstone.value is None and tombstone.key is not None
            assert (tombstone.topic, tombstone.partition) == (before.topic, before.partition)
            assert before.offset == tombstone.offset - 1 and before.key == tombstone.key
            assert before.envelope["op"] == "d"
        deletes = [i for i, r in enumerate(mine) if r.envelope and r.envelope["op"] == "d"]
        assert outcome.tombstones == [i + 1 for i in deletes]


@pytest.mark.parametrize("name", VARIANTS)
def test_each_step_yields_the_operations_and_keys_it_made(name: str) -> None:
    expected: dict[str, list[tuple[str, RowOperation, int]]] = {
        "snapshot": [("customers", INSERT, 1), ("customers", INSERT, 3)],
        "insert": [("customers", INSERT, 2), ("customers", INSERT, 4)],
        "update_keeps_toast": [("customers", UPDATE, 2)],
        "update_notes": [("customers", UPDATE, 2)],
        "update_snapshot_row": [("customers", UPDATE, 1)],
        "delete": [("customers", DELETE, 3)],
        # a key change: the delete of the old key and the create of the new one
        "key_change": [("customers", DELETE, 2), ("customers", INSERT, 20)],
        "two_tables": [("orders", INSERT, 1), ("customers", UPDATE, 20)],
        "interleaved_first_commit": [("orders", INSERT, 2), ("customers", UPDATE, 4)],
        "interleaved_last_commit": [("customers", UPDATE, 1)],
        "delete_order": [("orders", DELETE, 2)],
        "marker": [("customers", INSERT, 99)],
    }
    assert set(step_order(name)) | {"snapshot"} == set(expected)
    for step, changes in expected.items():
        got = [(t, e.operation, e.key) for t, e in events(name, step)]
        # offset order is per topic: compare each table's changes in order
        for table in COLUMNS:
            assert [g for g in got if g[0] == table] == [
                (t, op, (("id", k),)) for t, op, k in changes if t == table
            ], (step, table)


def test_snapshot_reads_are_inserts_with_every_column() -> None:
    ada, edsger = (e for _, e in events(PLAIN, "snapshot"))
    assert ada.row == {
        "id": 1,
        "name": "Ada",
        "balance": Decimal("10.50"),
        "updated_at": "2026-11-27T08:00:00.000000Z",
        "photo": b"\x00\x01\xfe\xff",
        "notes": LONG_NOTES,
    }
    assert ada.unavailable == frozenset() and ada.connector == "postgresql"
    assert edsger.row["balance"] == Decimal("0.00") and edsger.row["photo"] is None


def test_inserts_carry_decimals_at_full_precision_and_bytea_from_base64() -> None:
    (_, grace), (_, barbara) = events(PLAIN, "insert")
    assert grace.row["photo"] == LONG_PHOTO and grace.row["notes"] == LONG_NOTES
    assert grace.row["balance"] == Decimal("99.99")
    assert barbara.row["balance"] == Decimal("-1234567890.12")
    assert barbara.row["photo"] is None and barbara.row["notes"] is None
    ((_, order),) = [(t, e) for t, e in events(PLAIN, "two_tables") if t == "orders"]
    assert order.row == {"id": 1, "customer_id": 20, "amount": Decimal("15.00")}


# --- unchanged TOAST values ----------------------------------------------------------------------


@pytest.mark.parametrize("name", VARIANTS)
def test_unchanged_toasted_columns_are_unavailable_never_their_placeholder(name: str) -> None:
    expected = {
        "update_keeps_toast": {"notes", "photo"},
        "update_notes": {"photo"},
        "update_snapshot_row": {"notes"},
        "two_tables": {"photo"},
    }
    for step, columns in expected.items():
        ((_, event),) = [(t, e) for t, e in events(name, step) if t == "customers"]
        assert event.unavailable == frozenset(columns), step
        assert all(event.row[c] is None for c in columns)
    (_, kept) = events(name, "update_keeps_toast")[0]
    assert kept.row["balance"] == Decimal("20.25") and kept.row["name"] == "Grace"
    (_, notes) = events(name, "update_notes")[0]
    assert notes.row["notes"] == "rewritten"


def test_a_key_change_create_may_carry_an_unavailable_column() -> None:
    # PostgreSQL sends the moved row's unchanged TOASTed value as "unchanged": the create of
    # the new key has no stored value to keep, a merge must know it (issue 29's wiring)
    (_, delete), (_, create) = events(PLAIN, "key_change")
    assert delete.operation is DELETE and create.operation is INSERT
    assert create.unavailable == frozenset({"photo"})
    assert create.row["notes"] == "rewritten" and create.row["balance"] == Decimal("20.25")


def test_the_placeholder_is_text_in_text_columns_and_base64_in_bytea_columns() -> None:
    (record, _) = next((r, e) for r, e in decoded(PLAIN) if r.step == "update_keeps_toast")
    after = record.envelope["after"]
    assert after["notes"] == "__debezium_unavailable_value"
    assert base64.b64decode(after["photo"]) == b"__debezium_unavailable_value"


# --- deletes, tombstones, key changes ----------------------------------------------------------


def test_delete_under_replica_identity_default_fills_non_key_columns_with_stand_ins() -> None:
    # PostgreSQL sends only the key; Debezium fills the NOT NULL columns with their type's
    # zero, not the deleted row's values: only the key of a delete may be trusted
    ((record, event),) = [(r, e) for r, e in decoded(PLAIN) if r.step == "delete" and e]
    assert record.envelope["after"] is None
    assert record.envelope["before"] == {
        "id": 3,
        "name": "",
        "balance": None,
        "updated_at": "1970-01-01T00:00:00Z",
        "photo": None,
        "notes": None,
    }
    assert event.operation is DELETE and event.key == (("id", 3),)
    ((_, order),) = events(PLAIN, "delete_order")
    assert dict(order.row) == {"id": 2, "customer_id": 0, "amount": Decimal("0.00")}


def test_key_change_headers_name_the_other_key() -> None:
    delete, tombstone, create = (r for r in records(PLAIN) if r.step == "key_change")
    assert delete.envelope["op"] == "d" and tombstone.value is None
    assert create.envelope["op"] == "c"
    assert "__debezium.newkey" in delete.headers
    assert "__debezium.oldkey" in create.headers


# --- ordering -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", VARIANTS)
def test_source_positions_increase_in_commit_order_across_topics(name: str) -> None:
    order = step_order(name)
    by_step: dict[str, list[str]] = {}
    for record, event in streamed(name):
        assert event.position is not None and event.ordering == event.position
        by_step.setdefault(record.step, []).append(event.position)
    ranges = [(min(by_step[s]), max(by_step[s])) for s in order]
    for (_, high), (low, _) in itertools.pairwise(ranges):
        assert high < low


@pytest.mark.parametrize("name", VARIANTS)
def test_positions_never_decrease_within_a_partition(name: str) -> None:
    last: dict[tuple[str, int], str] = {}
    for record, event in streamed(name):
        where = (record.topic, record.partition)
        assert event.position is not None
        assert event.position >= last.get(where, "")
        last[where] = event.position


def test_a_later_commit_orders_higher_even_with_a_lower_lsn() -> None:
    ((_, late),) = events(PLAIN, "interleaved_last_commit")
    early = [e for _, e in events(PLAIN, "interleaved_first_commit")]
    (late_source,) = sources("interleaved_last_commit")
    late_lsn = int(late_source["lsn"])
    assert all(late_lsn < int(source["lsn"]) for source in sources("interleaved_first_commit"))
    assert all(late.position is not None and e.position is not None for e in early)
    assert all(late.position > e.position for e in early)  # type: ignore[operator]


def test_first_transaction_after_the_snapshot_has_no_last_commit_and_still_orders_above() -> None:
    # source.sequence is [end LSN of the previous commit, LSN of the change]: the first
    # transaction the connector streams has no previous commit (null, read as 0)
    (first, _) = sources("insert")
    assert json.loads(first["sequence"])[0] is None
    (later,) = sources("update_keeps_toast")
    assert json.loads(later["sequence"])[0] is not None
    snapshot = max(e.position for _, e in events(PLAIN, "snapshot") if e.position)
    assert all(e.position is not None and e.position > snapshot for _, e in events(PLAIN, "insert"))


def test_snapshot_positions_order_below_every_streamed_change() -> None:
    snapshot = [e.position for _, e in events(PLAIN, "snapshot")]
    first_streamed = min(e.position for _, e in streamed(PLAIN) if e.position is not None)
    assert all(p is not None and p < first_streamed for p in snapshot)


def test_one_transaction_over_two_tables_shares_its_transaction_id() -> None:
    found = sources("two_tables")
    assert {s["table"] for s in found} == {"customers", "orders"}
    assert len({s["txId"] for s in found}) == 1


# --- with and without the schema wrapper ---------------------------------------------------------


def _by_place(name: str) -> dict[tuple[str, str, int], ChangeEvent | None]:
    """Events keyed by step, table and their index among that table's records of the step."""
    out: dict[tuple[str, str, int], ChangeEvent | None] = {}
    counts: dict[tuple[str, str], int] = {}
    for record, event in decoded(name):
        n = counts.get((record.step, record.table), 0)
        counts[(record.step, record.table)] = n + 1
        out[(record.step, record.table, n)] = event
    return out


def test_wrapped_and_plain_envelopes_decode_to_the_same_changes() -> None:
    plain, wrapped = _by_place(PLAIN), _by_place(WRAPPED)
    assert plain.keys() == wrapped.keys()
    for place, event in plain.items():
        other = wrapped[place]
        if event is None or other is None:
            assert event is other, place
            continue
        assert (other.operation, other.key, dict(other.row), other.unavailable) == (
            event.operation,
            event.key,
            dict(event.row),
            event.unavailable,
        ), place
        if place[0] != "snapshot":  # both slots decode the same WAL
            assert other.position == event.position, place


def test_wrapped_envelope_without_table_types_keeps_string_decimals() -> None:
    # string decimal mode leaves no decimal type in the converter's schema: the table's row
    # schema (lakesink's value.schema) gives it
    record = next(r for r in records(WRAPPED) if r.step == "insert")
    plain = DebeziumDecoder(("id",)).decode_json(record.value, record.key)
    assert plain is not None and plain.row["balance"] == "99.99"
    assert plain.row["photo"] == base64.b64encode(LONG_PHOTO).decode()


def test_placeholder_in_bytea_is_recognised_from_the_wrapped_schema_alone() -> None:
    record = next(r for r in records(WRAPPED) if r.step == "update_keeps_toast")
    event = DebeziumDecoder(("id",)).decode_json(record.value, record.key)
    assert event is not None and event.unavailable == frozenset({"notes", "photo"})
