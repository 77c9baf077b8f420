"""Build the Iceberg golden warehouse `iceberg/` beside this script, written by lakesink as it was
before issue 28 (commit 555d211): a SQL catalog in the warehouse (`catalog.db`, SQLite) and one
table `golden.events`, partitioned by `kafka_partition` and `day(kafka_timestamp)`, holding three
batches of one writer (`golden-writer`, incarnation 1) committed through that version's
`IcebergCoordinator` (one snapshot each, lakesink's summary keys, no dead-letter table):

    batch 0: events:0 [0, 5)    events:1 [0, 4)
    batch 1: events:0 [5, 12)   events:1 [4, 9)
    batch 2: events:0 [12, 20)  events:1 [9, 15)

35 rows; record timestamps cross midnight (2024-01-01 to 2024-01-02), so both days hold files.

Iceberg metadata names its files by absolute path (the catalog row, the metadata's location,
manifest lists, manifests), so the warehouse is built at, and must be read from, one fixed place:
`WAREHOUSE` (/tmp/lakesink-golden-iceberg/warehouse). A test copies `iceberg/` there, after
removing whatever was there (tests/integration/test_golden_resume.py).

Run with the old code's import paths, from a worktree of that commit:
    PYTHONPATH=/path/to/worktree-at-555d211 python tests/golden/build_iceberg_golden.py
"""

# ruff: noqa: I001 - lakesink.commit and lakesink.iceberg exist only in the old tree, so the
# import sorter takes them for another package

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pyarrow as pa

# lakesink as it was before issue 28 (these modules moved to lakesink.engine and
# lakesink.formats.iceberg since)
from lakesink.commit.iceberg import IcebergFormat
from lakesink.commit.iceberg_coordinator import FILES_KEY, MAX_TS_KEY, IcebergCoordinator
from lakesink.iceberg.catalog import CatalogSettings, open_catalog
from lakesink.iceberg.datafiles import write_data_files
from lakesink.iceberg.schema import parse_partition_spec
from lakesink.iceberg.table import IcebergTable
from lakesink.kafka.reader import METADATA_FIELDS
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import FileWrite, WriteStatus

HERE = Path(__file__).resolve().parent / "iceberg"
WAREHOUSE = Path("/tmp/lakesink-golden-iceberg/warehouse")
IDENT = ("golden", "events")
WRITER = "golden-writer"
PARTITIONING = "kafka_partition, day(kafka_timestamp)"
ROWS = pa.schema([*METADATA_FIELDS, pa.field("user", pa.string()), pa.field("amount", pa.int64())])
# offset o of either partition was produced at 2024-01-01T23:59:50Z + o s
BASE_TS_US = 1_704_153_590_000_000
P0, P1 = TopicPartition("events", 0), TopicPartition("events", 1)
BATCHES = [
    [OffsetRange(P0, 0, 5), OffsetRange(P1, 0, 4)],
    [OffsetRange(P0, 5, 12), OffsetRange(P1, 4, 9)],
    [OffsetRange(P0, 12, 20), OffsetRange(P1, 9, 15)],
]


def rows(r: OffsetRange) -> pa.Table:
    """The decoded rows of one range (the same function of the offset as the test expects)."""
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
        schema=ROWS,
    )


def build() -> Path:
    shutil.rmtree(WAREHOUSE.parent, ignore_errors=True)
    catalog = open_catalog(CatalogSettings(warehouse=str(WAREHOUSE)))
    table = IcebergTable.open(catalog, IDENT, ROWS, parse_partition_spec(PARTITIONING))
    coordinator = IcebergCoordinator(IcebergFormat(table), WRITER, query_id="golden-query")
    coordinator.start()
    for batch_id, ranges in enumerate(BATCHES):
        t = coordinator.begin_batch(batch_id, ranges)
        assert t is not None
        statuses = []
        for task, r in enumerate(ranges):
            batch = rows(r)
            described = write_data_files(table.write_context(), batch, attempt_id=f"{t}-0.{task}.0")
            newest_ms = max(batch.column("kafka_timestamp").to_pylist()).timestamp() * 1000
            statuses.append(
                WriteStatus(
                    instant_time=t.value,
                    task_attempt=f"0.{task}.0",
                    offset_range=r,
                    files=tuple(
                        FileWrite("", d.path, d.path, d.record_count, d.size_bytes)
                        for d in described
                    ),
                    records_read=r.end - r.start,
                    records_written=batch.num_rows,
                    extra={
                        FILES_KEY: [d.to_json() for d in described],
                        MAX_TS_KEY: {r.partition.key(): int(newest_ms)},
                    },
                )
            )
        coordinator.complete_batch(t, batch_id, ranges, statuses, "")
    shutil.rmtree(HERE, ignore_errors=True)
    shutil.copytree(WAREHOUSE, HERE)
    return HERE


if __name__ == "__main__":
    if not Path(sys.modules["lakesink"].__file__ or "").parent.joinpath("commit").is_dir():
        sys.exit("run with PYTHONPATH at a worktree of commit 555d211 (lakesink.commit exists)")
    print("built", build())
