"""Table services on real tables (versions 6 and 8), read back by hudi-rs and lakesink's reader:
clustering keeps commit times (incremental readers do not re-read rows), clean and archival keep
every retained view and the writers' offsets, and a slow backfill that finishes late is not
missed by an incremental reader ordering by completion time (version 8)."""

from __future__ import annotations

from pathlib import Path

import hudi
import pyarrow as pa
import pytest
from integration.test_multi_writer import (
    COORDS,
    ROWS_PER_BATCH,
    commit_one_batch,
    rows,
    services_for,
)

from lakesink.errors import InstantArchivedError
from lakesink.formats.hudi.audit import read_with_hudi_rs
from lakesink.formats.hudi.control import LockedCommitControl
from lakesink.formats.hudi.coordinator import HudiCoordinator
from lakesink.formats.hudi.services import archival
from lakesink.formats.hudi.services.archival import ArchivePolicy, archive
from lakesink.formats.hudi.services.clean import RetainPolicy, clean
from lakesink.formats.hudi.services.clustering import ClusteringOptions, cluster
from lakesink.formats.hudi.table.archive import ARCHIVE_DIR, load_archived_view
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.files import write_token
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.table.writer import PartitionedWriter
from lakesink.formats.hudi.writer_state import committed_offsets
from lakesink.protocol.commit import Verdict
from lakesink.protocol.instant import Action
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import WriteStatus

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


def _streamed(
    path: Path, version: int, batches: int
) -> tuple[HudiTable, LockedCommitControl, HudiCoordinator]:
    """A table with `batches` batches committed by writer w-a through its coordinator."""
    table = _table(path, version)
    services = services_for(path, "filesystem", None, "w-a")
    coord = HudiCoordinator(table, "w-a", control=services)
    coord.start()
    for b in range(batches):
        commit_one_batch(coord, "topic-a", b)
    return table, services, coord


def _coords(t: object) -> list[tuple[object, ...]]:
    return sorted(zip(*(t.column(c).to_pylist() for c in COORDS), strict=True))  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", [6, 8])
def test_cluster_clean_archive_keep_reads_time_travel_and_offsets(
    version: int, tmp_path: Path
) -> None:
    path = tmp_path / "t"
    table, services, coord = _streamed(path, version, 12)
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
    # time travel to a retained instant sees the rows committed up to it; not before them
    retained = table.timeline().completed_data_instants()[0]
    as_of = TableReader(table).as_of(retained.time)
    full = TableReader(table).snapshot()
    upto = [t <= retained.time.value for t in full.column("_hoodie_commit_time").to_pylist()]
    assert as_of.num_rows == sum(upto) and as_of.num_rows > 0
    with pytest.raises(InstantArchivedError, match="archived"):
        TableReader(table).as_of(done.archived[0].time)
    # the writer's offsets survive archival; a new coordinator continues where it stopped
    assert committed_offsets(table, "w-a").to_json() == {"topic-a:0": 160, "topic-a:1": 140}
    coord2 = HudiCoordinator(HudiTable.open(path), "w-a", control=services)
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
    stream = HudiCoordinator(table, "w-a", control=services)
    stream.start()
    commit_one_batch(stream, "topic-a", 0)
    checkpoint0 = table.timeline().last_completed()
    assert checkpoint0 is not None and checkpoint0.completion_time is not None

    backfill = HudiCoordinator(table, "backfill-1", control=services)
    rng = OffsetRange(TopicPartition("history", 0), 0, 50)
    t_b = backfill.begin_batch(0, [rng])
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
    backfill.complete_batch(t_b, 0, [rng], [status], schema=writer.avro_schema or "")
    done_b = table.timeline().get(t_b)
    assert done_b is not None and done_b.completion_time is not None
    assert t_b < checkpoint1.time and done_b.completion_time > checkpoint1.completion_time

    late = TableReader(table).incremental(checkpoint1.completion_time)
    assert late.num_rows == 50  # by completion time: the late backfill is read
    assert set(late.column("kafka_topic").to_pylist()) == {"history"}
    missed = TableReader(table).incremental(checkpoint1.time, by="requested")
    assert missed.num_rows == 0  # by instant time it would have been skipped


def _stray_copy(table: HudiTable, between: tuple[str, str]) -> Path:
    """A base file a failed write left: a copy of a committed file under an instant time that
    lies between two committed ones and is on no timeline."""
    src = next((table.base_path / "kafka_partition=0").glob("*.parquet"))
    t = str(int(between[0]) + 1)
    assert t < between[1]
    stray = src.with_name(f"00000000-0000-0000-0000-00000000dead-0_9-9-9_{t}.parquet")
    stray.write_bytes(src.read_bytes())
    return stray


def _hudi_rs(path: Path, options: hudi.HudiReadOptions) -> pa.Table:
    batches = hudi.HudiTableBuilder.from_base_uri(str(path)).build().read(options)
    return pa.Table.from_batches(batches).select(COORDS) if batches else pa.table({})


def _assert_readers_agree(table: HudiTable, expected_rows: int) -> None:
    mine = TableReader(table).snapshot(columns=COORDS)
    assert mine.num_rows == expected_rows
    assert _coords(read_with_hudi_rs(str(table.base_path))) == _coords(mine)


@pytest.mark.parametrize("version", [6, 8])
def test_archival_of_a_stream_without_clustering_keeps_reads_and_commits_flat(
    version: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t"
    table, services, coord = _streamed(path, version, 10)
    # tiny packs, merged two by two: every read of archived instants below goes through packs
    policy = ArchivePolicy(min_instants=3, max_instants=4, pack_files=4, pack_fan_in=2)

    # a failed write left a file inside the timeline: hudi-rs would read it as committed once
    # the instants around it were archived, so archival stops before it until clean removes it
    done = table.timeline().completed_data_instants()
    stray = _stray_copy(table, (done[3].time.value, done[4].time.value))
    held = archive(table, services, policy)
    assert [i.time for i in held.archived] == [i.time for i in done[:3]]
    assert stray.name in held.held_back_by
    _assert_readers_agree(table, 10 * ROWS_PER_BATCH)
    cleaned = clean(table, services, RetainPolicy(commits=3))
    assert str(stray.relative_to(path)) in cleaned.deleted
    full = archive(table, services, policy)
    assert full.active_after == 3 and not full.held_back_by
    assert len(table.timeline().completed_data_instants()) == 2  # + the clean instant
    _assert_readers_agree(table, 10 * ROWS_PER_BATCH)

    # hudi-rs time travel to every retained instant, and incremental reads from the archive
    # boundary, return what lakesink's reader returns
    archived_view = load_archived_view(path)
    assert archived_view is not None
    for inst in table.timeline().completed_data_instants():
        opts = hudi.HudiReadOptions().with_as_of_timestamp(inst.time.value)
        assert _coords(_hudi_rs(path, opts)) == _coords(
            TableReader(table).as_of(inst.time, columns=COORDS)
        )
    reach = archived_view.completed_upto if version == 8 else archived_view.upto
    opts = (
        hudi.HudiReadOptions()
        .with_query_type(hudi.HudiQueryType.Incremental)
        .with_start_timestamp(reach.value)
    )
    incremental = TableReader(table).incremental(reach, columns=COORDS)
    assert incremental.num_rows > 0
    assert _coords(_hudi_rs(path, opts)) == _coords(incremental)

    # reads reach back to the archive boundary, and say so before it
    first_active = table.timeline().completed_data_instants()[0]
    with pytest.raises(InstantArchivedError, match="time travel reaches back"):
        TableReader(table).as_of(done[0].time)
    assert TableReader(table).as_of(first_active.time).num_rows == 9 * ROWS_PER_BATCH
    with pytest.raises(InstantArchivedError, match="incremental read can start"):
        TableReader(table).incremental(done[0].time)
    since = done[7].completion_time or done[7].time
    assert TableReader(table).incremental(since).num_rows == 2 * ROWS_PER_BATCH

    # the writer resumes from the archived offsets and keeps committing; archival goes on from
    # the previous archived view
    assert committed_offsets(table, "w-a").to_json() == {"topic-a:0": 100, "topic-a:1": 100}
    for b in range(10, 16):
        commit_one_batch(coord, "topic-a", b)
    assert archive(table, services, policy).archived
    _assert_readers_agree(table, 16 * ROWS_PER_BATCH)

    # clustering rewrites archived small files too; once the cleaner deleted the replaced
    # files, the replacecommit itself can be archived
    clustered = cluster(table, services, ClusteringOptions(min_files=2))
    assert clustered.files_after == 2 and clustered.files_before >= 14
    for b in range(16, 20):
        commit_one_batch(coord, "topic-a", b)
    clean(table, services, RetainPolicy(commits=1))
    after = archive(table, services, ArchivePolicy(2, 3, pack_files=4, pack_fan_in=2))
    assert any(i.action is Action.REPLACE_COMMIT for i in after.archived), after.held_back_by
    packs = sorted(p.name for p in (path / ARCHIVE_DIR / "timeline").glob("pack-L*.parquet"))
    levels = [int(p.split("-")[1].removeprefix("L")) for p in packs]
    # merged: fewer packs than the fan-in (2) at every level, and some above level 0
    assert len(set(levels)) == len(levels) and max(levels) > 0, packs
    _assert_readers_agree(table, 20 * ROWS_PER_BATCH)
    assert len(list(path.glob("kafka_partition=*/*.parquet"))) == 2 + 4  # clustered + 4 new

    # an archival that dies after writing its view and moving part of the instants: readers
    # still see every row once, and the next archival finishes the move
    for b in range(20, 26):
        commit_one_batch(coord, "topic-a", b)
    moved: list[object] = []
    real_move = archival._move

    def dying_move(src: Path, folder: Path) -> None:
        if len(moved) == 4:
            raise OSError("injected: archival killed while moving instants")
        moved.append(src)
        real_move(src, folder)

    monkeypatch.setattr(archival, "_move", dying_move)
    with pytest.raises(OSError, match="injected"):
        archive(table, services, policy)
    monkeypatch.setattr(archival, "_move", real_move)
    _assert_readers_agree(table, 26 * ROWS_PER_BATCH)
    archive(table, services, policy)
    upto = load_archived_view(path)
    assert upto is not None
    assert all(i.time > upto.upto for i in table.timeline().instants)
    _assert_readers_agree(table, 26 * ROWS_PER_BATCH)
    commit_one_batch(coord, "topic-a", 26)
    _assert_readers_agree(table, 27 * ROWS_PER_BATCH)


def test_publish_of_an_archived_instant_is_already_committed(tmp_path: Path) -> None:
    # a writer died between publishing and forgetting its pre-committed epoch; meanwhile other
    # commits let archival move its instant away: the publish at restart must not fail or repeat
    path = tmp_path / "t"
    table = _table(path, 8)
    services = services_for(path, "filesystem", None, "w-a")
    coord = HudiCoordinator(table, "w-a", control=services)
    coord.start()
    tp = TopicPartition("topic-a", 0)
    rng = OffsetRange(tp, 0, ROWS_PER_BATCH)
    t = coord.begin_batch(0, [rng])
    assert t is not None
    writer = PartitionedWriter(table, t, write_token(0, 0, 0))
    writer.write(rows("topic-a", 0, 0, ROWS_PER_BATCH))
    status = WriteStatus(t.value, "a0", rng, tuple(writer.close()), ROWS_PER_BATCH, ROWS_PER_BATCH)
    prepared = coord.precommit(t, 0, [rng], [status], schema=writer.avro_schema or "")
    coord.commit(prepared)
    coord.accept_offsets(prepared.next_offsets)
    for b in range(1, 8):
        commit_one_batch(coord, "topic-a", b)
    assert t in [i.time for i in archive(table, services, ArchivePolicy(2, 3)).archived]
    again = coord.commit(prepared)
    assert again.verdict is Verdict.ALREADY_COMMITTED
    _assert_readers_agree(table, 8 * ROWS_PER_BATCH)
