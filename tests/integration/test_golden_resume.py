"""Golden tables written by earlier lakesink read and resume with today's code, for both formats:
the Hudi tables `cow_v6`, `cow_v8` (tests/golden/build_golden.py) and the Iceberg warehouse
`iceberg` written by lakesink before issue 28 (tests/golden/build_iceberg_golden.py).

Each is copied out of the tree, read (rows, and for Iceberg the golden writer's committed offsets
and snapshot summaries), then resumed: one more batch commits through today's coordinator and
the table reads right (Hudi: lakesink's reader and hudi-rs; Iceberg: pyiceberg), and a replay
of the last committed batch commits nothing. No Spark, no Kafka.
"""

from __future__ import annotations

import fcntl
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import hudi
import pyarrow as pa
import pytest

from lakesink.engine.schema import TableSchema
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.coordinator import HudiCoordinator
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.table.writer import PartitionedWriter
from lakesink.formats.iceberg.catalog import CatalogSettings, open_catalog
from lakesink.formats.iceberg.coordinator import FILES_KEY, IcebergCoordinator
from lakesink.formats.iceberg.datafiles import write_data_files
from lakesink.formats.iceberg.format import IcebergFormat
from lakesink.formats.iceberg.snapshots import (
    KEY_COMMIT_ID,
    KEY_INCARNATION,
    KEY_LAYOUT,
    KEY_OFFSETS,
    KEY_VTTS,
    KEY_WRITER_ID,
)
from lakesink.formats.iceberg.table import IcebergTable
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets
from lakesink.protocol.write_status import FileWrite, WriteStatus

pytestmark = pytest.mark.integration

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
# where build_iceberg_golden.py wrote the warehouse: its metadata names files by this path
ICEBERG_WAREHOUSE = Path("/tmp/lakesink-golden-iceberg/warehouse")
ICEBERG_WRITER = "golden-writer"
P0, P1 = TopicPartition("events", 0), TopicPartition("events", 1)
# the golden's batches (build_iceberg_golden.BATCHES) and the offsets after each
ICEBERG_BATCHES = [
    [OffsetRange(P0, 0, 5), OffsetRange(P1, 0, 4)],
    [OffsetRange(P0, 5, 12), OffsetRange(P1, 4, 9)],
    [OffsetRange(P0, 12, 20), OffsetRange(P1, 9, 15)],
]
BASE_TS_US = 1_704_153_590_000_000  # offset o was produced at 2024-01-01T23:59:50Z + o s
HUDI_WRITER = "w"


@dataclass(frozen=True)
class Row:
    """What the golden Iceberg builder wrote for one offset (its `rows`)."""

    partition: int
    offset: int

    def expected(self) -> dict[str, object]:
        return {
            "kafka_partition": self.partition,
            "kafka_offset": self.offset,
            "kafka_key": f"k{self.partition}-{self.offset}".encode(),
            "user": f"u{self.offset % 3}",
            "amount": 100 * self.partition + self.offset,
        }


def _iceberg_rows(r: OffsetRange, schema: pa.Schema) -> pa.Table:
    offsets = list(range(r.start, r.end))
    n = len(offsets)
    return pa.Table.from_pydict(
        {
            "kafka_topic": [r.partition.topic] * n,
            "kafka_partition": [r.partition.partition] * n,
            "kafka_offset": offsets,
            "kafka_timestamp": [BASE_TS_US + o * 1_000_000 for o in offsets],
            "kafka_key": [f"k{r.partition.partition}-{o}".encode() for o in offsets],
            "kafka_headers": [[{"key": "h", "value": b"v"}] for _ in offsets],
            "user": [f"u{o % 3}" for o in offsets],
            "amount": [100 * r.partition.partition + o for o in offsets],
        },
        schema=schema,
    )


def _expected_iceberg(*ranges: OffsetRange) -> list[dict[str, object]]:
    return sorted(
        (Row(r.partition.partition, o).expected() for r in ranges for o in range(r.start, r.end)),
        key=lambda d: (d["kafka_partition"], d["kafka_offset"]),
    )


def _read_iceberg(table: IcebergTable) -> list[dict[str, object]]:
    table.refresh()
    columns = ("kafka_partition", "kafka_offset", "kafka_key", "user", "amount")
    got = table.pyiceberg.scan(selected_fields=columns).to_arrow().to_pylist()
    return sorted(got, key=lambda d: (d["kafka_partition"], d["kafka_offset"]))


@pytest.fixture
def iceberg_golden() -> Iterator[Path]:
    """The golden warehouse at the absolute place its metadata names (removed before and
    after), held by one test process at a time."""
    with open(f"{ICEBERG_WAREHOUSE.parent}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(ICEBERG_WAREHOUSE.parent, ignore_errors=True)
        shutil.copytree(GOLDEN / "iceberg", ICEBERG_WAREHOUSE)
        try:
            yield ICEBERG_WAREHOUSE
        finally:
            shutil.rmtree(ICEBERG_WAREHOUSE.parent, ignore_errors=True)


def _open_golden_iceberg(warehouse: Path) -> IcebergTable:
    catalog = open_catalog(CatalogSettings(warehouse=str(warehouse), create=False))
    return IcebergTable.open(catalog, ("golden", "events"), create=False)


def test_iceberg_golden_reads_and_resumes(iceberg_golden: Path) -> None:
    table = _open_golden_iceberg(iceberg_golden)
    # read: every row once, the writer's offsets and its summaries as the old code wrote them
    assert _read_iceberg(table) == _expected_iceberg(*(r for b in ICEBERG_BATCHES for r in b))
    assert table.committed_offsets(ICEBERG_WRITER) == WriterOffsets({P0: 20, P1: 15})
    snapshots = sorted(table.pyiceberg.metadata.snapshots, key=lambda s: s.sequence_number)
    assert len(snapshots) == len(ICEBERG_BATCHES)
    for snapshot, batch in zip(snapshots, ICEBERG_BATCHES, strict=True):
        summary = snapshot.summary
        assert summary is not None
        lakesink_keys = {k for k in summary.additional_properties if k.startswith("lakesink.")}
        assert lakesink_keys == {
            KEY_LAYOUT,
            KEY_WRITER_ID,
            KEY_COMMIT_ID,
            KEY_OFFSETS,
            KEY_VTTS,
            KEY_INCARNATION,
        }
        assert summary[KEY_WRITER_ID] == ICEBERG_WRITER and summary[KEY_INCARNATION] == "1"
        assert json.loads(summary[KEY_OFFSETS]) == {r.partition.key(): r.end for r in batch}
        # the valid-through timestamp: the older of the partitions' newest records
        assert int(summary[KEY_VTTS]) == min(BASE_TS_US // 1000 + (r.end - 1) * 1000 for r in batch)
    spec = table.pyiceberg.spec()
    assert [(f.name, str(f.transform)) for f in spec.fields] == [
        ("kafka_partition", "identity"),
        ("kafka_timestamp_day", "day"),
    ]

    # resume: a new incarnation of the writer; a replay of the golden's last batch commits
    # nothing, the next batch commits once
    coordinator = IcebergCoordinator(IcebergFormat(table), ICEBERG_WRITER, query_id="today")
    coordinator.start()
    assert coordinator.incarnation == 2
    assert coordinator.begin_batch(2, ICEBERG_BATCHES[-1]) is None
    assert coordinator.begin_batch(0, ICEBERG_BATCHES[-1]) is None  # a deleted checkpoint
    following = [OffsetRange(P0, 20, 26), OffsetRange(P1, 15, 18)]
    t = coordinator.begin_batch(3, following)
    assert t is not None
    statuses = []
    for task, r in enumerate(following):
        described = write_data_files(
            table.write_context(), _iceberg_rows(r, table.schema()), attempt_id=f"{t}-0.{task}.0"
        )
        statuses.append(
            WriteStatus(
                instant_time=t.value,
                task_attempt=f"0.{task}.0",
                offset_range=r,
                files=tuple(
                    FileWrite("", d.path, d.path, d.record_count, d.size_bytes) for d in described
                ),
                records_read=r.span,
                records_written=r.span,
                extra={FILES_KEY: [d.to_json() for d in described]},
            )
        )
    outcome = coordinator.complete_batch(t, 3, following, statuses, TableSchema())
    assert outcome.records == 9

    fresh = _open_golden_iceberg(iceberg_golden)
    everything = [r for b in ICEBERG_BATCHES for r in b] + following
    assert _read_iceberg(fresh) == _expected_iceberg(*everything)
    assert fresh.committed_offsets(ICEBERG_WRITER) == WriterOffsets({P0: 26, P1: 18})
    newest = fresh.last_commit(ICEBERG_WRITER)
    assert newest is not None and newest.incarnation == 2
    assert len(fresh.pyiceberg.metadata.snapshots) == len(ICEBERG_BATCHES) + 1
    # the resumed batch replayed (Spark re-runs it after a crash): nothing more
    again = IcebergCoordinator(IcebergFormat(fresh), ICEBERG_WRITER)
    again.start()
    assert again.begin_batch(3, following) is None
    assert _read_iceberg(_open_golden_iceberg(iceberg_golden)) == _expected_iceberg(*everything)


def _hudi_ids(path: Path) -> tuple[list[int], list[int]]:
    """The ids lakesink's reader and hudi-rs read."""
    ours = TableReader(HudiTable.open(path)).snapshot(columns=["id"]).column("id").to_pylist()
    rs = hudi.HudiTableBuilder.from_base_uri(str(path)).build()
    theirs = pa.Table.from_batches(rs.read()).column("id").to_pylist()
    return sorted(ours), sorted(theirs)


@pytest.mark.parametrize("name", ["cow_v6", "cow_v8"])
def test_hudi_golden_resumes_with_a_writers_batch(name: str, tmp_path: Path) -> None:
    path = tmp_path / name
    shutil.copytree(GOLDEN / name, path)
    assert _hudi_ids(path) == ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6])

    table = HudiTable.open(path)
    version = table.config.version
    coordinator = HudiCoordinator(table, HUDI_WRITER, query_id="today", control=CommitControl())
    coordinator.start()
    batch = [OffsetRange(P0, 0, 3)]
    t = coordinator.begin_batch(0, batch)
    assert t is not None
    rows = pa.table(
        {"id": [7, 8, 9], "day": ["2024-01-02", "2024-01-03", "2024-01-03"]}
        | {"name": ["n7", "n8", "n9"]},
        schema=pa.schema([("id", pa.int64()), ("day", pa.string()), ("name", pa.string())]),
    )
    writer = PartitionedWriter(table, t, "0-1-0")
    writer.write(rows)
    files = writer.close()
    status = WriteStatus(
        instant_time=t.value,
        task_attempt="0.0.0",
        offset_range=batch[0],
        files=tuple(files),
        records_read=3,
        records_written=3,
    )
    schema = TableSchema.from_text(writer.avro_schema or "")
    assert coordinator.complete_batch(t, 0, batch, [status], schema).records == 3

    assert _hudi_ids(path) == (list(range(1, 10)), list(range(1, 10)))
    reopened = HudiTable.open(path)
    assert reopened.config.version == version  # resumed in its own table version
    restarted = HudiCoordinator(reopened, HUDI_WRITER, control=CommitControl())
    restarted.start()
    assert restarted.committed == WriterOffsets({P0: 3})
    assert restarted.begin_batch(0, batch) is None  # the replay commits nothing
    assert _hudi_ids(path) == (list(range(1, 10)), list(range(1, 10)))
