"""The Iceberg half of a backfill (lakesink.formats.iceberg.backfill) on a real SQL catalog,
without Spark: the tasks are its task target's writers called in this process.

Scenarios (one comment each): a backfill is one snapshot whose commit id is the backfill id;
a run of the same writer that landed first leaves nothing of the late one; another writer's
run of the same backfill fails the late one's requirement, whose files go; a commit that
fails before publishing deletes what the tasks wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from iceberg_tables import ROWS, Backend, expected, keys, rows

from lakesink.errors import CommitError, CorruptTableError
from lakesink.formats.backfill import BackfillResult
from lakesink.formats.iceberg.backfill import IcebergBackfill
from lakesink.formats.iceberg.catalog import CatalogSettings
from lakesink.formats.iceberg.table import IcebergTable
from lakesink.formats.task import TaskAttempt
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import WriteStatus

pytestmark = pytest.mark.integration

HIST = TopicPartition("history", 0)
BACKFILL_ID = "0123456789abcdef"
RELAXED = pa.schema([f.with_nullable(True) for f in ROWS])


@pytest.fixture
def table(tmp_path: Path) -> IcebergTable:
    return Backend(CatalogSettings(warehouse=str(tmp_path / "wh"))).table("db.events")


def _backfill(table: IcebergTable, writer_id: str | None = None) -> IcebergBackfill:
    return IcebergBackfill(
        table,
        writer_id=writer_id or f"backfill-{BACKFILL_ID}",
        backfill_id=BACKFILL_ID,
        sources=["/history/part-0.parquet"],
    )


def _run_tasks(backfill: IcebergBackfill, start: int, end: int) -> list[WriteStatus]:
    """What two Spark tasks of the job return, each writing half of the offsets."""
    assert backfill.rows_schema().names == ROWS.names
    target = backfill.begin()
    statuses = []
    middle = (start + end) // 2
    for n, (lo, hi) in enumerate(((start, middle), (middle, end))):
        writer = target.open(TaskAttempt(n, 0, 0, f"0.{n}.0"))
        # Spark reads the source with every field nullable: the target restores the table's
        for batch in rows(HIST, lo, hi).cast(RELAXED).to_batches():
            writer.write(batch)
        files, extra = writer.close()
        statuses.append(
            WriteStatus(target.instant_time, f"0.{n}.0", files=tuple(files), extra=extra)
        )
    return statuses


def _files_of(statuses: list[WriteStatus]) -> list[Path]:
    return [Path(f.path.removeprefix("file://")) for s in statuses for f in s.files]


def test_a_backfill_is_one_snapshot_whose_commit_id_is_the_backfill_id(
    table: IcebergTable,
) -> None:
    backfill = _backfill(table)
    assert not backfill.already_committed()
    result = backfill.commit(_run_tasks(backfill, 0, 10))
    assert (result.records, result.files, result.already_committed) == (10, 2, False)
    table.refresh()
    snapshot = table.pyiceberg.current_snapshot()
    assert snapshot is not None and result.snapshot_id == snapshot.snapshot_id
    summary = snapshot.summary
    assert summary is not None
    assert summary["lakesink.commit-id"] == summary["lakesink.backfill-id"] == BACKFILL_ID
    assert summary["lakesink.writer-id"] == f"backfill-{BACKFILL_ID}"
    assert json.loads(summary["lakesink.backfill-source"]) == ["/history/part-0.parquet"]
    assert keys(table) == expected(OffsetRange(HIST, 0, 10))
    assert _backfill(table).already_committed() and _backfill(table, "other").already_committed()


@pytest.mark.parametrize("late_writer", ["same", "other"])
def test_a_run_that_lands_second_leaves_nothing_of_its_own(
    table: IcebergTable, late_writer: str
) -> None:
    first, late = _backfill(table), _backfill(table, None if late_writer == "same" else "other")
    late_statuses = _run_tasks(late, 0, 10)  # both began before either committed
    first.commit(_run_tasks(first, 0, 10))
    written = _files_of(late_statuses)
    assert all(p.exists() for p in written)
    if late_writer == "same":
        # the same writer's run landed first: its commit is on the table, nothing appended
        assert late.commit(late_statuses) == BackfillResult(late.writer_id, BACKFILL_ID, None)
    else:
        # another writer's run of the same files: the requirement fails, the job aborts
        with pytest.raises(CommitError, match=f"backfill {BACKFILL_ID} was committed"):
            try:
                late.commit(late_statuses)
            except CommitError as e:
                late.abort(e)
                raise
    assert not any(p.exists() for p in written)
    assert keys(table) == expected(OffsetRange(HIST, 0, 10))


def test_a_commit_that_fails_before_publishing_deletes_what_the_tasks_wrote(
    table: IcebergTable,
) -> None:
    backfill = _backfill(table)
    statuses = _run_tasks(backfill, 0, 10)
    lost, *kept = _files_of(statuses)
    lost.unlink()  # a snapshot must never reference a missing file
    with pytest.raises(CorruptTableError, match="is missing"):
        try:
            backfill.commit(statuses)
        except CorruptTableError as e:
            backfill.abort(e)
            raise
    assert kept and not any(p.exists() for p in kept)
    assert keys(table) == [] and not backfill.already_committed()
