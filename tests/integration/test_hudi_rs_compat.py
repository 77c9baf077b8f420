"""hudi-rs (PyPI `hudi`) reads lakesink's tables exactly as lakesink's TableReader does:
snapshot, time travel and incremental queries over tables with many commits, partitions, a
rollback, a replacecommit and a leftover inflight instant with real files and markers."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from pathlib import Path

import hudi
import pyarrow as pa
import pytest

from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.markers import list_marked_files
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.table.rollback import rollback
from lakesink.formats.hudi.table.view import FileSystemView
from lakesink.formats.hudi.table.writer import PartitionedWriter
from lakesink.protocol.instant import Action, Instant, InstantTime

pytestmark = pytest.mark.integration

DAYS = ("2024-01-01", "2024-01-02", "2024-01-03")


@dataclass
class Built:
    table: HudiTable
    completed: list[InstantTime] = field(default_factory=list)
    rolled_back: InstantTime | None = None
    inflight: InstantTime | None = None
    replace: InstantTime | None = None
    rows: int = 0


def _rows(commit: int, n: int) -> pa.Table:
    ids = [commit * 1000 + i for i in range(n)]
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "day": pa.array([DAYS[i % len(DAYS)] for i in range(n)], pa.string()),
            "name": pa.array([None if i % 7 == 0 else f"n{i}" for i in ids], pa.string()),
            "ts": pa.array(
                [dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i) for i in ids],
                pa.timestamp("us", tz="UTC"),
            ),
            "amount": pa.array([i / 4 for i in ids], pa.float64()),
        }
    )


class _Clock:
    def __init__(self) -> None:
        self.ms = int(time.time() * 1000) - 3_600_000

    def next(self) -> InstantTime:
        self.ms += 1000
        return InstantTime.from_epoch_ms(self.ms)


def _write(
    table: HudiTable, t: InstantTime, rows: pa.Table, token: str = "0-1-0"
) -> PartitionedWriter:
    w = PartitionedWriter(table, t, token, target_file_size_bytes=4096)
    w.write(rows)
    return w


def _commit(built: Built, clock: _Clock, commit_no: int, n: int) -> InstantTime:
    t = clock.next()
    inst = built.table.timeline().begin(Action.COMMIT, t)
    w = _write(built.table, t, _rows(commit_no, n))
    writes = w.close()
    md = CommitMetadata(
        "BULK_INSERT",
        tuple(writes),
        schema=w.avro_schema or "",
        extra={"lakesink.commit_id": f"c{commit_no}"},
    )
    built.table.timeline().publish(inst, md)
    built.completed.append(t)
    built.rows += n
    return t


def _cluster(built: Built, clock: _Clock, partition: str) -> InstantTime:
    table = built.table
    t = clock.next()
    inst = table.timeline().begin(Action.REPLACE_COMMIT, t)
    view = FileSystemView(table)
    old = view.latest_base_files([partition])
    rows = TableReader(table).snapshot(partition_filter={"day": partition.split("=")[1]})
    w = PartitionedWriter(table, t, "0-2-0", preserve_commit_time=True)
    w.write(rows)
    writes = w.close()
    md = CommitMetadata(
        "CLUSTER",
        tuple(writes),
        replaced_file_ids={partition: tuple(s.file_id for s in old)},
        schema=w.avro_schema or "",
    )
    table.timeline().publish(inst, md)
    built.completed.append(t)
    built.replace = t
    return t


def build_table(path: Path, version: int) -> Built:
    cfg = TableConfig("trips", ("id",), ("day",), version=version)  # type: ignore[arg-type]
    built = Built(HudiTable.create(path, cfg))
    clock = _Clock()
    for c in range(1, 5):
        _commit(built, clock, c, 40 + c * 5)
    # a failed instant: files and markers written, then rolled back
    t = clock.next()
    inst = built.table.timeline().begin(Action.COMMIT, t)
    _write(built.table, t, _rows(90, 30)).close()
    assert list_marked_files(built.table.base_path, t)
    rollback(built.table, inst)
    built.rolled_back = t
    _commit(built, clock, 5, 33)
    _cluster(built, clock, "day=2024-01-01")
    _commit(built, clock, 6, 21)
    # a writer that is still running (or crashed): inflight with real files and markers
    t = clock.next()
    built.table.timeline().begin(Action.COMMIT, t)
    _write(built.table, t, _rows(99, 25), token="3-1-0").close()
    built.inflight = t
    return built


def _hudi_read(path: Path, options: hudi.HudiReadOptions | None = None) -> pa.Table:
    table = hudi.HudiTableBuilder.from_base_uri(str(path)).build()
    batches = table.read(options) if options is not None else table.read()
    ours_schema = None
    if not batches:
        return pa.table({})
    ours_schema = batches[0].schema
    return pa.Table.from_batches(batches, schema=ours_schema)


def _rows_of(t: pa.Table) -> list[dict[str, object]]:
    if t.num_columns == 0:
        return []
    return sorted(
        t.to_pylist(),
        key=lambda r: (str(r.get("_hoodie_record_key")), str(r.get("_hoodie_commit_time"))),
    )


def _assert_same(hudi_rs: pa.Table, ours: pa.Table) -> None:
    assert _rows_of(hudi_rs) == _rows_of(ours)
    if hudi_rs.num_columns:
        assert hudi_rs.schema.names == ours.schema.names
        assert [f.type for f in hudi_rs.schema] == [f.type for f in ours.schema]


@pytest.fixture(params=[6, 8], ids=["v6", "v8"])
def built(request: pytest.FixtureRequest, tmp_path: Path) -> Built:
    return build_table(tmp_path / f"trips_v{request.param}", request.param)


def test_snapshot_matches_hudi_rs_and_hides_inflight_and_rolled_back(built: Built) -> None:
    path = built.table.base_path
    ours = TableReader(built.table).snapshot()
    theirs = _hudi_read(path)
    _assert_same(theirs, ours)
    assert ours.num_rows == built.rows
    times = set(theirs.column("_hoodie_commit_time").to_pylist())
    assert str(built.inflight) not in times and str(built.rolled_back) not in times
    keys = theirs.column("_hoodie_record_key").to_pylist()
    assert len(keys) == len(set(keys))
    # the inflight instant really left files and markers on disk
    assert built.inflight is not None
    assert list_marked_files(path, built.inflight)
    assert list((path / "day=2024-01-02").glob(f"*_{built.inflight}.parquet"))
    # the rolled-back instant left nothing
    assert not list(path.glob(f"day=*/*_{built.rolled_back}.parquet"))


def test_time_travel_matches_hudi_rs_at_every_instant(built: Built) -> None:
    reader = TableReader(built.table)
    for t in built.completed:
        opts = hudi.HudiReadOptions().with_as_of_timestamp(str(t))
        _assert_same(_hudi_read(built.table.base_path, opts), reader.as_of(t))
    # a time between two commits
    mid = InstantTime.from_epoch_ms(built.completed[2].to_epoch_ms() + 500)
    opts = hudi.HudiReadOptions().with_as_of_timestamp(str(mid))
    _assert_same(_hudi_read(built.table.base_path, opts), reader.as_of(mid))


def _boundaries(built: Built) -> list[InstantTime]:
    """Incremental query bounds: completion times in layout 2, instant times in layout 1."""
    tl = built.table.timeline()
    out = []
    for t in built.completed:
        inst = tl.get(t)
        assert inst is not None
        out.append(inst.completion_time or inst.time)
    return out


def test_incremental_matches_hudi_rs(built: Built) -> None:
    """hudi-rs 0.5 ranges incremental queries by completion time on version 8 tables and by
    instant time on version 6 tables; TableReader.incremental does the same by default."""
    reader = TableReader(built.table)
    bounds = _boundaries(built)
    starts = ["19700101000000000", *[str(t) for t in bounds]]
    for i, start in enumerate(starts):
        for end in bounds[i:]:
            opts = (
                hudi.HudiReadOptions()
                .with_query_type(hudi.HudiQueryType.Incremental)
                .with_start_timestamp(start)
                .with_end_timestamp(str(end))
            )
            _assert_same(_hudi_read(built.table.base_path, opts), reader.incremental(start, end))
    # open-ended: everything after the second commit
    opts = (
        hudi.HudiReadOptions()
        .with_query_type(hudi.HudiQueryType.Incremental)
        .with_start_timestamp(str(bounds[1]))
    )
    _assert_same(_hudi_read(built.table.base_path, opts), reader.incremental(bounds[1]))


def test_projection_and_partition_pruning_match_hudi_rs(built: Built) -> None:
    opts = hudi.HudiReadOptions(
        filters=[("day", "=", "2024-01-02")], projection=["id", "day", "ts"]
    )
    theirs = _hudi_read(built.table.base_path, opts)
    ours = TableReader(built.table).snapshot(
        columns=["id", "day", "ts"], partition_filter={"day": "2024-01-02"}
    )
    key = lambda r: r["id"]  # noqa: E731
    assert sorted(theirs.to_pylist(), key=key) == sorted(ours.to_pylist(), key=key)
    assert ours.num_rows > 0


def test_replacecommit_hides_replaced_files_and_keeps_commit_times(built: Built) -> None:
    theirs = _hudi_read(built.table.base_path)
    d1 = theirs.filter(pa.compute.equal(theirs.column("day"), "2024-01-01"))
    file_times = {f.rsplit("_", 1)[1][:17] for f in d1.column("_hoodie_file_name").to_pylist()}
    assert str(built.replace) in file_times
    assert all(t >= str(built.replace) for t in file_times)  # replaced file groups are hidden
    assert str(built.replace) not in set(d1.column("_hoodie_commit_time").to_pylist())


@pytest.mark.parametrize("version", [6, 8])
def test_an_inflight_instant_older_than_the_latest_commit_stays_hidden(
    tmp_path: Path, version: int
) -> None:
    """A slow (or crashed) writer's files stay hidden when newer commits complete — the
    concurrent-writer case — in hudi-rs and in lakesink's reader, and rollback keeps it so."""
    cfg = TableConfig("t", ("id",), ("day",), version=version)  # type: ignore[arg-type]
    built = Built(HudiTable.create(tmp_path / "t", cfg))
    clock = _Clock()
    _commit(built, clock, 1, 10)
    slow = clock.next()
    inst = built.table.timeline().begin(Action.COMMIT, slow)
    _write(built.table, slow, _rows(50, 10), token="1-1-0").close()
    _commit(built, clock, 2, 10)
    theirs = _hudi_read(built.table.base_path)
    assert theirs.num_rows == 20
    assert str(slow) not in set(theirs.column("_hoodie_commit_time").to_pylist())
    _assert_same(theirs, TableReader(built.table).snapshot())
    rollback(built.table, inst)
    _assert_same(_hudi_read(built.table.base_path), TableReader(built.table).snapshot())
    assert not list(built.table.base_path.glob(f"day=*/*_{slow}.parquet"))


def test_inflight_instant_is_not_listed_as_completed(built: Built) -> None:
    tl = built.table.timeline()
    assert built.inflight is not None
    inst = tl.get(built.inflight)
    assert isinstance(inst, Instant) and not inst.is_completed
    assert tl.get(built.rolled_back) is None  # requested/inflight removed by the rollback
    assert [i.time for i in tl.completed_data_instants()] == built.completed
    table = hudi.HudiTableBuilder.from_base_uri(str(built.table.base_path)).build()
    rs = [i.timestamp for i in table.get_timeline().get_completed_commits()]
    rs += [i.timestamp for i in table.get_timeline().get_completed_replacecommits()]
    assert sorted(rs) == [str(t) for t in built.completed]
