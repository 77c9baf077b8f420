"""Readers lakesink did not write read its Iceberg tables: Java Iceberg (Spark 4.1 with
Iceberg's Spark runtime, opening the SQL catalog's SQLite file through its JdbcCatalog) returns
exactly the rows pyiceberg's scan returns — for the current snapshot, time travel by snapshot id
and by timestamp, and the incremental append scan between two snapshots — for several tables,
all read in one Spark session and one round trip."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from iceberg_tables import ROWS, Backend, expected, ingest
from interop.java_iceberg import IcebergRead, JavaIceberg, JavaIcebergError

from lakesink.errors import ReaderError
from lakesink.formats.iceberg.catalog import CatalogSettings, warehouse_uri
from lakesink.formats.iceberg.table import IcebergTable
from lakesink.protocol.offsets import OffsetRange, TopicPartition

pytestmark = pytest.mark.integration

P0, P1 = TopicPartition("events", 0), TopicPartition("events", 1)
PARTITIONINGS = {
    "plain": "",
    "partitioned": "kafka_partition, day(kafka_timestamp), bucket[4](user)",
}
BATCHES = [  # (writer, ranges) per snapshot
    ("wa", [OffsetRange(P0, 0, 6), OffsetRange(P1, 0, 4)]),
    ("wb", [OffsetRange(TopicPartition("clicks", 0), 0, 5)]),
    ("wa", [OffsetRange(P0, 6, 9), OffsetRange(P1, 4, 4)]),
]


@dataclass(frozen=True)
class Built:
    catalog: str
    tables: dict[str, IcebergTable]
    snapshots: dict[str, list[int]]
    timestamps: dict[str, list[int]]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    root = tmp_path_factory.mktemp("iceberg-interop")
    name = "lake_" + uuid.uuid4().hex[:8]
    backend = Backend(CatalogSettings(warehouse=str(root / "wh"), name=name))
    tables, snapshots, stamps = {}, {}, {}
    for t, spec in PARTITIONINGS.items():
        table = backend.table(f"db.{t}", partition=spec)
        ids, ts = [], []
        for writer, ranges in BATCHES:
            result = ingest(table, writer, ranges)
            snap = table.pyiceberg.metadata.snapshot_by_id(result.snapshot_id)
            assert snap is not None
            ids.append(snap.snapshot_id)
            ts.append(snap.timestamp_ms)
            time.sleep(0.01)  # distinct commit times for the time-travel read
        tables[t], snapshots[t], stamps[t] = table, ids, ts
    return Built(name, tables, snapshots, stamps)


@pytest.fixture(scope="module")
def java_iceberg() -> Iterator[JavaIceberg]:
    session = JavaIceberg()
    try:
        yield session
    finally:
        session.close()


def _spark_timestamp(ms: int) -> str:
    """Epoch milliseconds as the UTC timestamp text Spark's timestampAsOf takes."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _rows(t: pa.Table) -> list[dict[str, object]]:
    t = t.select([f.name for f in ROWS])
    order = pa.compute.sort_indices(
        t, [("kafka_topic", "ascending"), ("kafka_partition", "ascending"),
            ("kafka_offset", "ascending")],
    )  # fmt: skip
    return t.take(order).to_pylist()  # type: ignore[no-any-return]


def test_spark_reads_what_pyiceberg_reads_now_in_the_past_and_incrementally(
    built: Built, java_iceberg: JavaIceberg
) -> None:
    first = next(iter(built.tables.values()))
    sqlite_file = Path(first.pyiceberg.catalog.engine.url.database)  # type: ignore[attr-defined]
    java_iceberg.register_catalog(
        built.catalog, sqlite_file, warehouse_uri(str(sqlite_file.parent))
    )
    reads, wanted = [], []
    for t, table in built.tables.items():
        ident = f"{built.catalog}.db.{t}"
        s1, s2, s3 = built.snapshots[t]
        scan = table.pyiceberg.scan
        reads += [
            IcebergRead(ident),
            IcebergRead(ident, {"versionAsOf": str(s1)}),
            IcebergRead(ident, {"timestampAsOf": _spark_timestamp(built.timestamps[t][1])}),
            IcebergRead(ident, {"start-snapshot-id": str(s1), "end-snapshot-id": str(s3)}),
        ]
        wanted += [
            _rows(scan().to_arrow()),
            _rows(scan(snapshot_id=s1).to_arrow()),
            _rows(scan(snapshot_id=s2).to_arrow()),
            None,  # the appends of s2 and s3: checked by their Kafka coordinates below
        ]
    results = java_iceberg.run(reads)
    errors = [r for r in results if isinstance(r, JavaIcebergError)]
    assert not errors, errors[0]
    for i, (got, want) in enumerate(zip(results, wanted, strict=True)):
        assert isinstance(got, pa.Table)
        t = list(built.tables)[i // 4]
        if want is None:
            coords = sorted(
                zip(got["kafka_topic"].to_pylist(), got["kafka_partition"].to_pylist(),
                    got["kafka_offset"].to_pylist(), strict=True)
            )  # fmt: skip
            assert coords == expected(*BATCHES[1][1], *BATCHES[2][1]), t
        else:
            assert _rows(got) == want, (t, i % 4)
    # the pyiceberg side is itself what the writers committed
    now = _rows(next(iter(built.tables.values())).pyiceberg.scan().to_arrow())
    all_ranges = [r for _, ranges in BATCHES for r in ranges]
    assert sorted((r["kafka_topic"], r["kafka_partition"], r["kafka_offset"]) for r in now) == (
        expected(*all_ranges)
    )


def test_audit_with_spark_passes_on_a_table_of_kafka_records(
    java_iceberg: JavaIceberg, kafka_bootstrap: str, tmp_path: Path
) -> None:
    from integration.conftest import ingest_config

    from lakesink.formats.iceberg.audit import audit_iceberg
    from lakesink.formats.iceberg.format import open_iceberg_table
    from lakesink.kafka.producer import produce_sample_events

    topic = "iceberg-spark-audit-" + uuid.uuid4().hex[:8]
    counts = produce_sample_events(kafka_bootstrap, topic, 30, 2)
    name = "audit_" + uuid.uuid4().hex[:8]
    cfg = ingest_config(
        kafka_bootstrap, topic, tmp_path / "wh", table__format="iceberg",
        table__name="events", iceberg__catalog__name=name,
    )  # fmt: skip
    table = open_iceberg_table(cfg.settings, ROWS)
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    ingest(table, cfg.writer_id, [OffsetRange(p0, 0, 4), OffsetRange(p1, 0, counts[p1])])
    ingest(table, cfg.writer_id, [OffsetRange(p0, 4, counts[p0])])
    java_iceberg.register_catalog(
        name, tmp_path / "wh" / "catalog.db", warehouse_uri(str(tmp_path / "wh"))
    )

    def spark(t: IcebergTable) -> pa.Table:
        (got,) = java_iceberg.run([IcebergRead(f"{name}.lakesink.events")])
        assert isinstance(got, pa.Table), got
        return got

    report = audit_iceberg(
        table, cfg.writer_id, bootstrap=kafka_bootstrap, from_log_start=True,
        extra_readers={"spark": spark},
    )  # fmt: skip
    assert report.ok, report.problems
    total = counts[p0] + counts[p1]
    assert report.readers == {"pyiceberg": total, "duckdb": total, "spark": total}
    assert report.kafka_records == total and report.commits == 2
    assert not any("Spark" in why for why in report.not_run)

    def broken(t: IcebergTable) -> pa.Table:
        raise RuntimeError("no catalog named lakesink_missing")

    # an engine that fails is reported as that engine's failure, not as a corrupted table
    with pytest.raises(ReaderError, match=r"^spark cannot read lakesink.events: no catalog named"):
        audit_iceberg(
            table, cfg.writer_id, bootstrap=kafka_bootstrap, from_log_start=True,
            extra_readers={"spark": broken},
        )  # fmt: skip


def _keyed_batch(coordinator: Any, batch_id: int, changes: pa.Table) -> None:
    """One batch of `changes` (one Kafka partition, contiguous offsets) through the writer's
    task target and commit, as the sink runs it, in one task."""
    from lakesink.formats import plugin_for
    from lakesink.formats.task import TaskAttempt
    from lakesink.protocol.mutation import CHANGE_COLUMNS
    from lakesink.protocol.write_status import WriteStatus

    offsets = changes.column("kafka_offset").to_pylist()
    ranges = [OffsetRange(TopicPartition("orders", 0), offsets[0], offsets[-1] + 1)]
    t = coordinator.begin_batch(batch_id, ranges)
    plugin = plugin_for("iceberg")
    w = plugin.task_target(coordinator, t.value, 0).open(TaskAttempt(0, 1, 0, "1.0.0"))
    for batch in changes.to_batches():
        w.write(batch)
    files, extra = w.close()
    status = WriteStatus(t.value, "1.0.0", None, tuple(files), extra=extra)
    data = pa.schema([f for f in changes.schema if f.name not in CHANGE_COLUMNS])
    coordinator.complete_batch(t, batch_id, ranges, [status], plugin.commit_schema(data, "orders"))


def test_spark_reads_a_merge_on_read_table_of_keys_as_pyiceberg_does(
    java_iceberg: JavaIceberg, tmp_path: Path
) -> None:
    from lakesink.formats.iceberg.coordinator import IcebergCoordinator
    from lakesink.formats.iceberg.format import IcebergFormat
    from lakesink.formats.iceberg.keyed import (
        MERGE_ON_READ,
        keyed_partition_fields,
        keyed_properties,
        required_keys,
    )
    from lakesink.protocol.mutation import OPERATION_COLUMN, RowOperation

    name = "mor_" + uuid.uuid4().hex[:8]
    settings = CatalogSettings(warehouse=str(tmp_path / "wh"), name=name)
    schema = pa.schema(
        [("id", pa.int64()), ("v", pa.string()), ("kafka_topic", pa.string()),
         ("kafka_partition", pa.int32()), ("kafka_offset", pa.int64())]
    )  # fmt: skip
    table = IcebergTable.open(
        Backend(settings).catalog(), ("db", "orders"), required_keys(schema, ("id",)),
        keyed_partition_fields((), ("id",), 2), properties=keyed_properties(None, MERGE_ON_READ),
        identifier_fields=("id",),
    )  # fmt: skip
    coordinator = IcebergCoordinator(IcebergFormat(table), "w1", query_id="q")
    coordinator.operation_type = "UPSERT"
    coordinator.start()
    ins, upd, dele = (
        op.code for op in (RowOperation.INSERT, RowOperation.UPDATE, RowOperation.DELETE)
    )
    batches = [
        [(k, ins) for k in range(8)],
        [(1, upd), (2, dele), (5, upd), (9, ins)],
        [(1, upd), (5, dele), (9, upd)],
    ]
    offset = 0
    for n, batch in enumerate(batches, start=1):
        changes = pa.Table.from_pylist(
            [
                {"id": k, "v": f"v{offset + i}", "kafka_topic": "orders", "kafka_partition": 0,
                 "kafka_offset": offset + i, OPERATION_COLUMN: op}
                for i, (k, op) in enumerate(batch)
            ],
            schema=pa.schema([*schema, (OPERATION_COLUMN, pa.int8())]),
        )  # fmt: skip
        offset += len(batch)
        _keyed_batch(coordinator, n, changes)
    table.refresh()
    assert any(t.delete_files for t in table.pyiceberg.scan().plan_files())
    sqlite_file = Path(table.pyiceberg.catalog.engine.url.database)  # type: ignore[attr-defined]
    java_iceberg.register_catalog(name, sqlite_file, warehouse_uri(str(sqlite_file.parent)))
    (got,) = java_iceberg.run([IcebergRead(f"{name}.db.orders")])
    assert isinstance(got, pa.Table), got

    def by_key(t: pa.Table) -> list[tuple[int, str]]:
        return sorted(zip(t["id"].to_pylist(), t["v"].to_pylist(), strict=True))

    want = by_key(table.pyiceberg.scan().to_arrow())
    assert [k for k, _ in want] == [0, 1, 3, 4, 6, 7, 9]
    assert by_key(got) == want
