"""A sample change stream, for `lakesink demo --cdc` and the benchmarks: the change events a
Debezium PostgreSQL connector sends for an `accounts` table (JSON values without the schema
wrapper, JSON keys `{"id": n}`), made up here so that the demo needs no database.

The stream opens with one create per account, then runs `changes` random changes, each its own
transaction: balance updates (most), owner renames, deletes (each followed by its tombstone, as
Debezium sends them), creates of new accounts and primary-key changes (a delete of the old key,
its tombstone and a create of the new one). Every event carries `source.sequence` as
PostgreSQL's connector does (`["<last committed lsn>", "<lsn>"]`), so that lakesink orders the
versions of a key by their source position. The account's partition is `id % partitions`, as
Debezium's record key places all changes of one key in one partition.

`SampleChanges.rows` is the table as the database would hold it after the last change: what a
current-state table built from the stream must equal.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from lakesink.errors import KafkaError
from lakesink.protocol.offsets import TopicPartition

ACCOUNTS_DDL = "id INT NOT NULL, owner STRING, balance DECIMAL(12,2), updated_at STRING"
"""The value schema of the sample stream: the columns of `before` and `after`."""
_OWNERS = ("Ada", "Grace", "Edsger", "Barbara", "Alan", "Frances", "Donald", "Margaret")
_FIRST_LSN = 0x1_6000_0000


@dataclass(frozen=True, slots=True)
class ChangeRecord:
    """One Kafka record of the stream: its partition, key and value (None: a tombstone)."""

    partition: int
    key: bytes
    value: bytes | None


@dataclass
class SampleChanges:
    """The records of a sample stream, in produce order, and the rows they leave."""

    records: list[ChangeRecord] = field(default_factory=list)
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    """id → the account's row (id, owner, balance as Decimal, updated_at) after the stream."""

    @property
    def counts(self) -> dict[str, int]:
        """Creates, updates, deletes and tombstones in the stream."""
        out = {"c": 0, "u": 0, "d": 0, "tombstone": 0}
        for r in self.records:
            out["tombstone" if r.value is None else json.loads(r.value)["op"]] += 1
        return out


class _Stream:
    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.out = SampleChanges()
        self.committed_lsn: int | None = None
        self.lsn = _FIRST_LSN
        self.clock_s = 1_795_766_400  # 2026-11-27T08:00:00Z

    def _timestamp(self) -> str:
        self.clock_s += 1
        from datetime import UTC, datetime

        return datetime.fromtimestamp(self.clock_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.000000Z")

    def transaction(self, *events: tuple[str, int, dict[str, Any] | None]) -> None:
        """One transaction: (op, key, row) events; a delete's row is the key only."""
        for op, key, row in events:
            self.lsn += 64
            source = {
                "connector": "postgresql",
                "name": "demo",
                "db": "bank",
                "schema": "public",
                "table": "accounts",
                "lsn": self.lsn,
                "sequence": json.dumps(
                    [
                        None if self.committed_lsn is None else str(self.committed_lsn),
                        str(self.lsn),
                    ],
                    separators=(",", ":"),
                ),
                "ts_ms": self.clock_s * 1000,
            }
            before = {"id": key} if op == "d" else None
            after = None if op == "d" else _as_json(row or {})
            value = {"before": before, "after": after, "source": source, "op": op}
            key_bytes = json.dumps({"id": key}, separators=(",", ":")).encode()
            partition = key % self.partitions
            self.out.records.append(ChangeRecord(partition, key_bytes, _compact(value)))
            if op == "d":
                self.out.records.append(ChangeRecord(partition, key_bytes, None))
                self.out.rows.pop(key, None)
            else:
                assert row is not None
                self.out.rows[key] = dict(row)
        self.lsn += 64
        self.committed_lsn = self.lsn


def _as_json(row: Mapping[str, Any]) -> dict[str, Any]:
    # Debezium's decimal.handling.mode=string: decimals as text
    return {k: str(v) if isinstance(v, Decimal) else v for k, v in row.items()}


def _compact(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def sample_changes(accounts: int, changes: int, partitions: int, *, seed: int = 0) -> SampleChanges:
    """The records of a sample stream over `accounts` accounts with `changes` changes after
    their creates (see the module doc); the same for the same arguments."""
    if accounts < 1 or changes < 0 or partitions < 1:
        raise ValueError("a sample stream needs accounts >= 1, changes >= 0 and partitions >= 1")
    rng = random.Random(seed)
    stream = _Stream(partitions)

    def account(key: int) -> dict[str, Any]:
        return {
            "id": key,
            "owner": rng.choice(_OWNERS),
            "balance": Decimal(rng.randrange(0, 1_000_000)) / 100,
            "updated_at": stream._timestamp(),
        }

    for key in range(1, accounts + 1):
        stream.transaction(("c", key, account(key)))
    next_key = accounts + 1
    for _ in range(changes):
        rows = stream.out.rows
        live = sorted(rows)
        roll = rng.random()
        if not live or roll < 0.05:
            stream.transaction(("c", next_key, account(next_key)))
            next_key += 1
        elif roll < 0.75:
            key = rng.choice(live)
            row = dict(rows[key])
            row["balance"] += Decimal(rng.randrange(-5_000, 5_000)) / 100
            row["updated_at"] = stream._timestamp()
            stream.transaction(("u", key, row))
        elif roll < 0.85:
            key = rng.choice(live)
            row = {**rows[key], "owner": rng.choice(_OWNERS), "updated_at": stream._timestamp()}
            stream.transaction(("u", key, row))
        elif roll < 0.95:
            stream.transaction(("d", rng.choice(live), None))
        else:  # a primary-key change: delete + tombstone + create, in one transaction
            key = rng.choice(live)
            row = {**rows[key], "id": next_key, "updated_at": stream._timestamp()}
            stream.transaction(("d", key, None), ("c", next_key, row))
            next_key += 1
    return stream.out


def produce_sample_changes(
    bootstrap: str,
    topic: str,
    accounts: int,
    changes: int,
    partitions: int,
    *,
    seed: int = 0,
    create: bool = True,
    timeout_s: float = 120.0,
) -> SampleChanges:
    """Produce a sample stream (`sample_changes`) to `topic` (created first unless
    `create=False`); KafkaError if a record was not delivered."""
    from lakesink.kafka.client import create_topic
    from lakesink.kafka.producer import make_producer

    stream = sample_changes(accounts, changes, partitions, seed=seed)
    if create:
        create_topic(bootstrap, topic, partitions)
    producer = make_producer(bootstrap)
    failures: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    for record in stream.records:
        while True:
            try:
                producer.produce(
                    topic,
                    record.value,
                    record.key,
                    partition=record.partition,
                    on_delivery=delivered,
                )
                break
            except BufferError:
                producer.poll(0.05)
    remaining = producer.flush(timeout_s)
    if remaining or failures:
        raise KafkaError(
            f"{remaining + len(failures)} sample changes to {topic!r} not delivered"
            + (f": {failures[0]}" if failures else f" in {timeout_s:.0f} s")
        )
    return stream


def records_per_partition(stream: SampleChanges, topic: str) -> dict[TopicPartition, int]:
    out: dict[TopicPartition, int] = {}
    for r in stream.records:
        tp = TopicPartition(topic, r.partition)
        out[tp] = out.get(tp, 0) + 1
    return out
