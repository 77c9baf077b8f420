"""Table services on real tables (versions 6 and 8), read back by hudi-rs and lakesink's reader:
clustering keeps commit times (incremental readers do not re-read rows), clean and archival keep
every retained view and the writers' offsets, and a slow backfill that finishes late is not
missed by an incremental reader ordering by completion time (version 8)."""

from __future__ import annotations

from pathlib import Path

import pytest
from integration.test_multi_writer import (
    COORDS,
    ROWS_PER_BATCH,
    commit_one_batch,
    rows,
    services_for,
)

from lakesink.audit import read_with_hudi_rs
from lakesink.protocol.instant import Action
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import WriteStatus
from lakesink.services.archival import ArchivePolicy, archive
from lakesink.services.clean import RetainPolicy, clean
from lakesink.services.clustering import ClusteringOptions, cluster
from lakesink.spark.commit_state import committed_offsets
from lakesink.spark.coordinator import Coordinator
from lakesink.table.config import TableConfig
from lakesink.table.files import write_token
from lakesink.table.hudi_table import HudiTable
from lakesink.table.reader import TableReader
from lakesink.table.writer import PartitionedWriter

pytestmark = pytest.mark.integration


def _table(path: Path, version: int) -> HudiTable:
    return HudiTable.create(
        path,
        TableConfig(
            name="svc",
            record_key_fields=tuple(COORDS),
            partition_fields=("kafka_partition",),
            version=8 if version == 8 else 6,
        ),
    )


def _coords(t: object) -> list[tuple[object, ...]]:
    return sorted(zip(*(t.column(c).to_pylist() for c in COORDS), strict=True))  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", [6, 8])
def test_cluster_clean_archive_keep_reads_time_travel_and_offsets(
    version: int, tmp_path: Path
) -> None:
    path = tmp_path / "t"
    table = _table(path, version)
    services = services_for(path, "filesystem", None, "w-a")
    coord = Coordinator(table, "w-a", services=services)
    coord.start()
    for b in range(12):
        commit_one_batch(coord, "topic-a", b)
    before = TableReader(table).snapshot(columns=COORDS)
    last_commit = table.timeline().completed(Action.COMMIT)[-1]

    result = cluster(table, services, ClusteringOptions(min_files=2))
    assert (result.files_before, result.files_after) == (12, 2)
    # clustering keeps commit times: reading increments after the last commit shows nothing new
    assert TableReader(table).incremental(last_commit.time, by="requested").num_rows == 0
    cleaned = clean(table, services, RetainPolicy(commits=1))
    assert len(cleaned.deleted) == 12 and cleaned.instant is not None
    for b in range(12, 15):
        commit_one_batch(coord, "topic-a", b)
    done = archive(table, services, ArchivePolicy(min_instants=3, max_instants=4))
    assert done.archived and done.active_after < done.active_before

    after = TableReader(table).snapshot(columns=COORDS)
    assert _coords(read_with_hudi_rs(str(path))) == _coords(after)
    assert _coords(after) == sorted(
        _coords(before)
        + _coords(rows("topic-a", 0, 120, 20))
        + _coords(rows("topic-a", 1, 120, 20))
        + _coords(rows("topic-a", 0, 140, 20))
    )
    retained = table.timeline().completed_data_instants()[0]
    assert TableReader(table).as_of(retained.time).num_rows == 12 * ROWS_PER_BATCH
    # the writer's offsets survive archival; a new coordinator continues where it stopped
    assert committed_offsets(table, "w-a").to_json() == {"topic-a:0": 160, "topic-a:1": 140}
    coord2 = Coordinator(HudiTable.open(path), "w-a", services=services)
    coord2.start()
    commit_one_batch(coord2, "topic-a", 15)
    assert TableReader(table).snapshot().num_rows == 16 * ROWS_PER_BATCH


def test_slow_backfill_finishing_late_is_not_missed_by_completion_time_reads(
    tmp_path: Path,
) -> None:
    # backfill B begins first, streaming writer A begins and completes after it; an incremental
    # reader checkpoints at A's completion; B completes later with an instant time before A's
    path = tmp_path / "t"
    table = _table(path, 8)
    services = services_for(path, "filesystem", None, "w-a")
    stream = Coordinator(table, "w-a", services=services)
    stream.start()
    commit_one_batch(stream, "topic-a", 0)
    checkpoint0 = table.timeline().last_completed()
    assert checkpoint0 is not None and checkpoint0.completion_time is not None

    backfill = Coordinator(table, "backfill-1", services=services)
    rng = OffsetRange(TopicPartition("history", 0), 0, 50)
    t_b = backfill.begin(0, [rng])
    assert t_b is not None
    commit_one_batch(stream, "topic-a", 1)  # A: instant after B's, completes first
    checkpoint1 = table.timeline().last_completed()
    assert checkpoint1 is not None and checkpoint1.completion_time is not None
    first = TableReader(table).incremental(checkpoint0.completion_time)
    assert first.num_rows == ROWS_PER_BATCH

    writer = PartitionedWriter(table, t_b, write_token(0, 0, 0))
    writer.write(rows("history", 0, 0, 50))
    files = writer.close()
    status = WriteStatus(t_b.value, "b", rng, tuple(files), 50, 50)
    backfill.complete(t_b, 0, [rng], [status], schema=writer.avro_schema or "")
    done_b = table.timeline().get(t_b)
    assert done_b is not None and done_b.completion_time is not None
    assert t_b < checkpoint1.time and done_b.completion_time > checkpoint1.completion_time

    late = TableReader(table).incremental(checkpoint1.completion_time)
    assert late.num_rows == 50  # by completion time: the late backfill is read
    assert set(late.column("kafka_topic").to_pylist()) == {"history"}
    missed = TableReader(table).incremental(checkpoint1.time, by="requested")
    assert missed.num_rows == 0  # by instant time it would have been skipped
