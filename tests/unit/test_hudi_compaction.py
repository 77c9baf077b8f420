"""Compaction of merge-on-read tables (lakesink.formats.hudi.services.compaction): the slices with
log files become base files at the compaction's instant, read by lakesink's reader and hudi-rs
as the same rows as before; a crash at each step leaves the rows unchanged and the next
compaction (or writer) finishes the plan; the plan is Hudi's HoodieCompactionPlan; the inline
trigger and the timeline's compaction instants."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from unit.test_hudi_mor_upsert import _config
from unit.test_hudi_upsert import (
    CHANGES,
    DELETE,
    INSERT,
    UPDATE,
    _row,
    data_rows,
    hudi_rs_rows,
    lakesink_rows,
)

from lakesink.errors import CorruptTableError, LockError, UnsupportedTableError
from lakesink.formats.hudi.audit import hudi_rs_batches
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.services.compaction import (
    compact,
    complete_pending_compactions,
    deltacommits_since_compaction,
    pending_compactions,
)
from lakesink.formats.hudi.services.inline import compact_inline
from lakesink.formats.hudi.table.avro_schema import avro_schema_for, with_meta_columns
from lakesink.formats.hudi.table.compaction_plan import PLAN_VERSION, read_compaction_plan
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.delta_upsert import delta_writes
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.merge_on_read import encode_delta_commit
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.timeline import _apply_states
from lakesink.formats.hudi.table.view import FileSystemView
from lakesink.protocol.instant import Action, Instant, InstantTime, State, TimelineLayout
from lakesink.protocol.mutation import CHANGE_COLUMNS
from lakesink.settings import MutationSettings, Settings

# Hudi 1.2.0's HoodieCompactionPlan fields, in order, and its operation's
PLAN_FIELDS = [
    "operations",
    "extraMetadata",
    "version",
    "strategy",
    "preserveHoodieMetadata",
    "missingSchedulePartitions",
]
OPERATION_FIELDS = [
    "baseInstantTime",
    "deltaFilePaths",
    "dataFilePath",
    "fileId",
    "partitionPath",
    "metrics",
    "bootstrapFilePath",
]


class _Crash(Exception):
    pass


def _crash_at(point: str) -> Any:
    def crash(at: str) -> None:
        if at == point:
            raise _Crash(at)

    return crash


_offsets = itertools.count()
_clock = CommitControl(clock_ms=lambda: 0)  # instant times right after the table's last one


def deltacommit(table: HudiTable, *changes: tuple[int, int, int]) -> None:
    """One deltacommit of (key, operation, ts) versions at the next instant time."""
    rows = pa.Table.from_pylist(
        [_row(k, op, ts, next(_offsets)) for k, op, ts in changes], schema=CHANGES
    )
    t = _clock.next_instant_time(table)
    inst = table.timeline().begin(Action.DELTA_COMMIT, t)
    writes = _write(table, t, rows)
    data = pa.schema([f for f in rows.schema if f.name not in CHANGE_COLUMNS])
    metadata = CommitMetadata(
        "UPSERT", tuple(writes), schema=avro_schema_for(with_meta_columns(data), "t_record")
    )
    encoded = encode_delta_commit(table.layout, inst, metadata, delta_writes(table, writes))
    table.timeline().publish(inst, metadata, encoded=encoded)


def _write(table: HudiTable, t: InstantTime, rows: pa.Table) -> list[Any]:
    import pickle

    from lakesink.formats.hudi.table.delta_upsert import HudiDeltaTaskTarget
    from lakesink.formats.task import TaskAttempt

    target = pickle.loads(pickle.dumps(HudiDeltaTaskTarget.for_table(table, t.value, 1 << 20)))
    writer = target.open(TaskAttempt(0, 1, 0, "1.0.0"))
    writer.write(rows.combine_chunks().to_batches()[0])
    return list(writer.close()[0])


def rows_of(table: HudiTable) -> list[dict[str, Any]]:
    """The table's rows, asserting lakesink's reader and hudi-rs read the same."""
    ours = data_rows(lakesink_rows(table))
    assert hudi_rs_rows(table) == ours
    return ours


@pytest.fixture(params=[6, 8], ids=["v6", "v8"])
def table(request: pytest.FixtureRequest, tmp_path: Path) -> HudiTable:
    t = HudiTable.create(tmp_path / "t", _config(request.param, True, "ts", 2))
    deltacommit(t, *((k, INSERT, 1) for k in range(6)))  # base files
    deltacommit(t, (1, UPDATE, 2), (2, UPDATE, 2), (4, DELETE, 3))  # log files
    deltacommit(t, (2, UPDATE, 5), (3, UPDATE, 0), (5, DELETE, None), (6, INSERT, 1))
    return t


def _logs(table: HudiTable) -> int:
    return sum(len(s.log_paths) for s in FileSystemView(table).latest_base_files())


def test_compaction_merges_every_slice_with_logs_into_a_base_file_reading_the_same(
    table: HudiTable,
) -> None:
    before = rows_of(table)
    assert _logs(table) > 0
    result = compact(table, _clock)
    assert result.instant is not None and result.instant.action is Action.COMMIT
    # after every deltacommit's completion (version 8 readers place logs by it), though the
    # clock (`_clock`) is behind them
    done_at = [i.completion_time for i in table.timeline().completed(Action.DELTA_COMMIT)]
    assert all(c is None or c < result.instant.time for c in done_at)
    slices = FileSystemView(table).latest_base_files()
    compacted = [s for s in slices if s.instant_time == result.instant.time]
    assert len(compacted) == result.file_groups > 0
    assert result.rows == sum(s.num_records for s in compacted)
    assert all(s.has_base_file and not s.log_paths for s in compacted)
    assert _logs(table) == 0
    assert rows_of(table) == before
    # the timeline shows the compaction's files and its commit at one instant time
    names = table.storage.list_names(table.timeline().folder_key)
    t = result.instant.time.value
    assert f"{t}.compaction.requested" in names and f"{t}.compaction.inflight" in names
    assert table.timeline().get(result.instant.time) == result.instant
    assert deltacommits_since_compaction(table) == 0
    # a deltacommit after it joins the new slices, as every reader sees
    deltacommit(table, (1, UPDATE, 9), (2, DELETE, 9), (7, INSERT, 1))
    after = {r["id"]: r for r in rows_of(table)}
    assert after[1]["ts"] == 9 and 2 not in after and 7 in after
    assert {k: r for k, r in after.items() if k not in (1, 2, 7)} == {
        r["id"]: r for r in before if r["id"] not in (1, 2, 7)
    }


def test_nothing_to_compact_without_log_files_or_with_a_pending_deltacommit(
    table: HudiTable,
) -> None:
    table.timeline().begin(Action.DELTA_COMMIT, _clock.next_instant_time(table))
    pending = compact(table, _clock)
    assert pending.instant is None and "deltacommit is pending" in pending.reason
    assert pending_compactions(table) == ()


@pytest.mark.parametrize(
    ("point", "finish"),
    [
        ("compaction-requested", "compact"),
        ("compaction-inflight", "restart"),
        ("compaction-written", "compact"),
    ],
)
def test_a_crashed_compaction_is_finished_never_rolled_back_rows_unchanged(
    table: HudiTable, point: str, finish: str
) -> None:
    before = rows_of(table)
    with pytest.raises(_Crash):
        compact(table, _clock, crash=_crash_at(point))
    (t,) = pending_compactions(table)
    assert rows_of(table) == before  # readers read the planned slices as before
    if finish == "compact":
        result = compact(table, _clock)
        assert result.instant is not None and result.instant.time == t
    else:
        (result,) = complete_pending_compactions(table, _clock)
        assert result.instant is not None and result.instant.time == t
    assert pending_compactions(table) == ()
    assert _logs(table) == 0
    assert rows_of(table) == before


def test_the_plan_is_hudis_compaction_plan_version_2_of_file_names(table: HudiTable) -> None:
    with pytest.raises(_Crash):
        compact(table, _clock, crash=_crash_at("compaction-requested"))
    (t,) = pending_compactions(table)
    key = table.timeline().key_of(Instant(t, Action.COMPACTION, State.REQUESTED))
    data = table.storage.read(key)
    reader = fastavro.reader(io.BytesIO(data))
    schema = reader.writer_schema
    assert isinstance(schema, dict)
    assert schema["name"] == "org.apache.hudi.avro.model.HoodieCompactionPlan"
    assert [f["name"] for f in schema["fields"]] == PLAN_FIELDS
    operation = schema["fields"][0]["type"][1]["items"]
    assert [f["name"] for f in operation["fields"]] == OPERATION_FIELDS
    (plan,) = list(reader)
    assert isinstance(plan, dict)
    assert plan["version"] == PLAN_VERSION == 2
    slices = {
        (s.partition_path, s.file_id): s
        for s in FileSystemView(table).latest_base_files()
        if s.log_paths
    }
    assert len(plan["operations"]) == len(slices)
    for op in plan["operations"]:
        s = slices[(op["partitionPath"], op["fileId"])]
        assert op["baseInstantTime"] == s.instant_time.value
        assert op["dataFilePath"] == s.base_file_name  # a file name, not a path
        assert op["deltaFilePaths"] == [p.rsplit("/", 1)[-1] for p in s.log_paths]
    assert len(read_compaction_plan(data, key)) == len(slices)
    with pytest.raises(CorruptTableError, match="not a HoodieCompactionPlan"):
        read_compaction_plan(b"garbage", "x")


def test_inline_compaction_runs_after_every_n_deltacommits_and_finishes_pending_ones(
    table: HudiTable,
) -> None:
    assert deltacommits_since_compaction(table) == 3
    off = _settings(0)
    assert compact_inline(table, off, _clock).compaction is None
    later = _settings(4)
    assert compact_inline(table, later, _clock).compaction is None
    now = _settings(3)
    done = compact_inline(table, now, _clock).compaction
    assert done is not None and done.instant is not None
    # a pending compaction is finished after the next deltacommit, whatever the count
    deltacommit(table, (1, UPDATE, 20))
    with pytest.raises(_Crash):
        compact(table, _clock, crash=_crash_at("compaction-inflight"))
    finished = compact_inline(table, off, _clock).compaction
    assert finished is not None and finished.instant is not None
    assert pending_compactions(table) == ()


def _settings(every: int) -> Settings:
    from lakesink.config import build_config

    cfg = build_config(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9092",
            "kafka.topics": "orders",
            "value.schema": "id BIGINT NOT NULL, ts BIGINT",
            "table.path": "/tmp/orders",
            "write.operation": "upsert",
            "table.record.key.fields": "id",
            "table.type": "MERGE_ON_READ",
            "table.compaction.every.commits": str(every),
        }
    )
    assert isinstance(cfg.settings.mutation, MutationSettings)
    return cfg.settings


def test_the_compaction_key_is_a_non_negative_count() -> None:
    assert _settings(0).mutation.compaction_every_commits == 0
    assert MutationSettings().compaction_every_commits == 5
    from lakesink.errors import ConfigError

    with pytest.raises(ConfigError, match=r"table\.compaction\.every\.commits"):
        _settings(-1)


def test_a_copy_on_write_table_has_nothing_to_compact(tmp_path: Path) -> None:
    cow = HudiTable.create(tmp_path / "cow", TableConfig("t", ("id",), ()))
    with pytest.raises(UnsupportedTableError, match="only merge-on-read"):
        compact(cow, _clock)


def test_the_timeline_takes_a_compaction_and_its_commit_at_one_instant_time() -> None:
    t = InstantTime("20240101000000123")
    requested = Instant(t, Action.COMPACTION, State.REQUESTED)
    inflight = requested.with_state(State.INFLIGHT)
    done = Instant(t, Action.COMMIT, State.COMPLETED)
    files = [(i.file_name(TimelineLayout.V1), i) for i in (requested, inflight, done)]
    for order in (files, files[::-1]):
        by_value: dict[str, Instant] = {}
        _apply_states(by_value, order, "timeline")
        assert by_value == {t.value: done}
    assert Instant.parse(requested.file_name(TimelineLayout.V2)) == requested
    # a pending commit is not a compaction's: two actions at one time stay corrupt
    with pytest.raises(CorruptTableError, match="two actions"):
        _apply_states({}, [files[0], ("x.inflight", done.with_state(State.INFLIGHT))], "timeline")


def test_the_writer_compacts_inline_and_finishes_a_crashed_compaction_before_its_batch(
    tmp_path: Path,
) -> None:
    from unit.test_hudi_mor_upsert import _batch, _ts_by_key, _writer

    from lakesink.formats.hudi.plugin import PLUGIN

    settings = _writer(tmp_path)
    settings = dataclasses.replace(
        settings, mutation=dataclasses.replace(settings.mutation, compaction_every_commits=2)
    )
    table = PLUGIN.open_table(settings, partition_fields=(), rows=lambda: pa.schema([]))
    control = PLUGIN.writer_control(settings)
    coord = PLUGIN.open_coordinator(settings, table, control, query_id="q")
    coord.start()
    for batch_id, versions in enumerate([[(k, 1) for k in range(6)], [(1, 2), (2, 0), (3, 5)]]):
        t, ranges, statuses, schema = _batch(PLUGIN, coord, batch_id, versions)
        coord.complete_batch(t, batch_id, ranges, statuses, schema)
    want = {**dict.fromkeys(range(6), 1), 1: 2, 3: 5}
    (compaction,) = table.timeline().completed(Action.COMMIT)  # inline, after the 2nd
    assert compaction.time > t and _logs(table) == 0
    assert _ts_by_key(table) == want
    t, ranges, statuses, schema = _batch(PLUGIN, coord, 2, [(4, 7)])
    coord.complete_batch(t, 2, ranges, statuses, schema)
    with pytest.raises(_Crash):  # a `lakesink table compact` dies after its plan
        compact(table, control, crash=_crash_at("compaction-requested"))
    (pending,) = pending_compactions(table)
    t, ranges, statuses, schema = _batch(PLUGIN, coord, 3, [(5, 9), (4, 8)])
    assert pending_compactions(table) == ()  # finished under the lock before the batch began
    assert pending < t
    done = table.timeline().get(pending)
    assert done is not None and done.action is Action.COMMIT and done.is_completed
    coord.complete_batch(t, 3, ranges, statuses, schema)
    assert _ts_by_key(table) == {**want, 4: 8, 5: 9}
    by_hudi_rs = pa.Table.from_batches(hudi_rs_batches(str(table.base_path))).to_pylist()
    assert {r["id"]: r["ts"] for r in by_hudi_rs} == {**want, 4: 8, 5: 9}


def test_lakesink_table_compact_compacts_then_has_nothing_to_do(
    table: HudiTable, capsys: pytest.CaptureFixture[str]
) -> None:
    from lakesink.cli.main import main

    before = rows_of(table)
    assert main(["table", "compact", str(table.base_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["instant"] == table.timeline().last_completed(Action.COMMIT).time.value
    assert info["file_groups"] > 0 and info["rows"] > 0
    assert rows_of(table) == before
    assert main(["table", "compact", str(table.base_path)]) == 0
    assert "nothing to do (no file slice has log files)" in capsys.readouterr().out


def _base_files_at(table: HudiTable, t: InstantTime) -> set[str]:
    """The base files on disk at instant `t`, relative to the table's base path."""
    root = Path(table.base_path)
    return {str(p.relative_to(root)) for p in root.rglob(f"*_{t.value}.parquet")}


def _tree(table: HudiTable) -> dict[str, tuple[int, int]]:
    """Every file of the table with its size and modification time."""
    root = Path(table.base_path)
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def _commit_paths(table: HudiTable, instant: Instant) -> set[str]:
    return {w.path for w in table.timeline().commit_metadata(instant).writes}


def test_a_stalled_attempt_resuming_after_another_completed_the_compaction_touches_nothing(
    table: HudiTable,
) -> None:
    before = rows_of(table)
    seen: dict[str, Any] = {}

    def stall(at: str) -> None:
        # attempt A stalls after its first slice; meanwhile attempt B executes and publishes
        if at == "compaction-slice-written" and not seen:
            seen["first"] = set(_base_files_at(table, pending_compactions(table)[0]))
            seen["b"] = compact(table, _clock)
            seen["tree"] = _tree(table)

    a = compact(table, _clock, crash=stall)
    b = seen["b"]
    assert b.instant is not None and b.file_groups >= 2  # A had slices left to compact
    assert a.instant is None and "completed by another executor" in a.reason
    assert _tree(table) == seen["tree"]  # A deleted and wrote nothing after B's commit
    on_disk = _base_files_at(table, b.instant.time)
    assert on_disk == _commit_paths(table, b.instant)  # every file B's commit names exists
    assert seen["first"] and seen["first"].isdisjoint(on_disk)  # A's slice: B deleted it
    assert pending_compactions(table) == ()
    assert rows_of(table) == before  # lakesink's reader and hudi-rs


def test_each_attempt_writes_its_own_files_and_a_rerun_leaves_one_base_file_per_group(
    table: HudiTable,
) -> None:
    before = rows_of(table)
    with pytest.raises(_Crash):
        compact(table, _clock, crash=_crash_at("compaction-written"))
    (t,) = pending_compactions(table)
    first = _base_files_at(table, t)
    result = compact(table, _clock)
    assert result.instant is not None and result.instant.time == t
    second = _base_files_at(table, t)
    assert len(first) == len(second) == result.file_groups > 0
    assert first.isdisjoint(second)  # the two attempts' write tokens differ
    assert second == _commit_paths(table, result.instant)
    file_ids = {name.rsplit("/", 1)[-1].split("_")[0] for name in second}
    assert len(file_ids) == len(second)  # one base file per file group at t
    assert rows_of(table) == before


def test_the_compaction_commit_says_compacted_as_hudis_compactor_writes(
    table: HudiTable,
) -> None:
    result = compact(table, _clock)
    assert result.instant is not None
    timeline = table.timeline()

    def compacted(instant: Instant) -> object:
        data = table.storage.read(timeline.key_of(instant))
        if data[:1] == b"{":  # layout 1: JSON
            return json.loads(data)["compacted"]
        (record,) = list(fastavro.reader(io.BytesIO(data)))
        assert isinstance(record, dict)
        return record["compacted"]

    assert compacted(result.instant) is True
    assert {compacted(i) for i in timeline.completed(Action.DELTA_COMMIT)} == {False}


class _LeaseLostAfter(CommitControl):
    """A control whose lease is lost after `renewals` renewals (an executor that stalled)."""

    def __init__(self, renewals: int) -> None:
        super().__init__(clock_ms=lambda: 0)
        self.left = renewals

    def renew_lock(self) -> None:
        if self.left == 0:
            raise LockError("lease lost")
        self.left -= 1


def test_an_attempt_that_lost_its_lease_stops_before_its_next_slice(table: HudiTable) -> None:
    before = rows_of(table)
    with pytest.raises(LockError):
        compact(table, _LeaseLostAfter(1))
    (t,) = pending_compactions(table)
    assert len(_base_files_at(table, t)) == 1  # the first slice only; nothing published
    result = compact(table, _clock)
    assert result.instant is not None and result.file_groups >= 2
    assert _base_files_at(table, t) == _commit_paths(table, result.instant)
    assert rows_of(table) == before
