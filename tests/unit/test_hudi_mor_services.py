"""Clean, archival, rollback and clustering on merge-on-read tables: the cleaner deletes a
superseded file slice whole (base file and log files) and names the log files in its clean
metadata; archival moves deltacommits and compactions (their plan files too) and keeps each live
slice's log files in the archived view; a pending compaction holds back what its plan reads;
lakesink's reader and hudi-rs read the same rows after each step; the CLI and the inline
services run them, and clustering is refused naming `lakesink table compact`."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from unit.test_hudi_compaction import (
    _clock,
    _Crash,
    _crash_at,
    _settings,
    _write,
    deltacommit,
    rows_of,
)
from unit.test_hudi_mor_upsert import _config
from unit.test_hudi_upsert import CHANGES, DELETE, INSERT, UPDATE, _row, _time

from lakesink.errors import UnsupportedTableError
from lakesink.formats.hudi.services.archival import (
    ArchivePolicy,
    archive,
    archived_instants,
    merge_on_read_holds,
)
from lakesink.formats.hudi.services.clean import (
    RetainPolicy,
    clean,
    failed_log_files,
    list_data_files,
    pending_compaction_plans,
    plan_clean,
)
from lakesink.formats.hudi.services.clustering import cluster
from lakesink.formats.hudi.services.compaction import compact, pending_compactions
from lakesink.formats.hudi.services.inline import after_commit
from lakesink.formats.hudi.table.archive import VIEWS_KEY, load_archived_view
from lakesink.formats.hudi.table.compaction_plan import CompactionOperation
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.log_file import LogFileName, is_log_file_name
from lakesink.formats.hudi.table.timeline import Timeline
from lakesink.formats.hudi.table.view import FileSystemView, active_commits_and_base
from lakesink.protocol.instant import Action, Instant, InstantTime, State, TimelineLayout


@pytest.fixture(params=[6, 8], ids=["v6", "v8"])
def table(request: pytest.FixtureRequest, tmp_path: Path) -> HudiTable:
    """Two buckets: a slice of base files and log files, compacted, then log files over the
    compacted slices."""
    t = HudiTable.create(tmp_path / "t", _config(request.param, True, "ts", 2))
    deltacommit(t, *((k, INSERT, 1) for k in range(6)))
    deltacommit(t, (1, UPDATE, 2), (2, UPDATE, 2), (4, DELETE, 3))
    deltacommit(t, (2, UPDATE, 5), (3, UPDATE, 0), (5, DELETE, None))
    assert compact(t, _clock).instant is not None
    deltacommit(t, (0, UPDATE, 7), (6, INSERT, 1))
    deltacommit(t, (1, UPDATE, 8), (3, DELETE, 9))
    return t


def _slices(table: HudiTable) -> list[Any]:
    return FileSystemView(table).latest_base_files()


def _files_of(slices: list[Any]) -> set[str]:
    return {p for s in slices for p in (s.path, *s.log_paths) if p}


def _on_storage(table: HudiTable) -> set[str]:
    base, logs = list_data_files(table)
    return {*base, *logs}


def _clean_metadata(table: HudiTable, instant: Instant) -> dict[str, Any]:
    data = table.storage.read(table.timeline().key_of(instant))
    (record,) = list(fastavro.reader(io.BytesIO(data)))
    assert isinstance(record, dict)
    return record


def test_clean_deletes_a_compacted_slice_whole_then_archival_keeps_the_rows(
    table: HudiTable,
) -> None:
    before = rows_of(table)
    live = _files_of(_slices(table))
    old = _on_storage(table) - live  # the slices the compaction superseded
    assert any(is_log_file_name(p.rsplit("/", 1)[-1]) for p in old)
    assert any(p.endswith(".parquet") for p in old)
    # superseded slices on storage: archival keeps the compaction that superseded them active
    held = archive(table, _clock, ArchivePolicy(1, 2))
    assert "not live" in held.held_back_by
    assert held.archived and Action.COMMIT not in {i.action for i in held.archived}
    assert rows_of(table) == before
    result = clean(table, _clock, RetainPolicy(commits=1))
    assert set(result.deleted) == old and result.instant is not None
    assert _on_storage(table) == live
    assert rows_of(table) == before
    # the clean metadata names every deleted file, log files too, by partition and name
    md = _clean_metadata(table, result.instant)
    named = {
        f"{p}/{n}" for p, m in md["partitionMetadata"].items() for n in m["successDeleteFiles"]
    }
    assert named == old and md["totalFilesDeleted"] == len(old)
    archived = archive(table, _clock, ArchivePolicy(1, 2))
    actions = {i.action for i in archived.archived}
    assert {Action.DELTA_COMMIT, Action.COMMIT} <= actions
    # the compaction left with its plan and inflight files: no compaction reads as pending,
    # and the archive reads it back as the commit it completed as
    assert pending_compactions(table) == ()
    names = table.storage.list_names(table.timeline().folder_key)
    assert not any(".compaction." in n for n in names)
    assert set(archived.archived) <= set(archived_instants(table))
    # the archived view keeps the live slices' log files of archived deltacommits
    view = load_archived_view(table.storage)
    assert view is not None and any(s.log_paths for s in view.slices)
    assert _files_of(_slices(table)) == live
    assert rows_of(table) == before
    # a deltacommit after archival names its log file after the archived ones (version 6
    # numbers a slice's log files), and every reader still agrees
    deltacommit(table, (0, UPDATE, 20), (1, DELETE, 20), (9, INSERT, 1))
    for s in _slices(table):
        names_ = [LogFileName.parse(p.rsplit("/", 1)[-1]) for p in s.log_paths]
        assert len({(n.instant_time, n.version) for n in names_}) == len(names_)
    after = {r["id"]: r for r in rows_of(table)}
    assert after[0]["ts"] == 20 and 1 not in after and 9 in after


def test_a_pending_compaction_keeps_its_slices_and_holds_archival(table: HudiTable) -> None:
    before = rows_of(table)
    with pytest.raises(_Crash):
        compact(table, _clock, crash=_crash_at("compaction-written"))
    (t,) = pending_compactions(table)
    plan = pending_compaction_plans(table)[t]
    planned = {op.relative(n) for op in plan for n in (op.base_file, *op.log_files) if n}
    written = {p for p in _on_storage(table) if p.endswith(f"_{t.value}.parquet")}
    assert planned and written
    held = archive(table, _clock, ArchivePolicy(1, 2))
    assert held.archived and all(
        i.time < min(op.base_instant for op in plan) for i in held.archived
    )
    assert f"pending compaction {t}" in held.held_back_by
    assert rows_of(table) == before
    # the clean plans with the compaction pending (its instant then finishes the compaction,
    # as every instant lakesink begins does)
    cleaned = clean(table, _clock, RetainPolicy(commits=1), rollback_failed=False)
    assert not (set(cleaned.deleted) & (planned | written))
    assert planned <= _on_storage(table)
    assert pending_compactions(table) == ()
    assert rows_of(table) == before
    # completed, the compaction superseded the planned slices: the cleaner deletes them whole
    assert planned <= set(clean(table, _clock, RetainPolicy(commits=1)).deleted)
    assert rows_of(table) == before


def test_the_plan_of_a_pending_compaction_keeps_an_older_slice_from_the_cleaner(
    table: HudiTable,
) -> None:
    """Hudi's rule, whatever scheduled the plan: no slice of a planned group at or after the
    planned slice's base instant is deleted, and the views kept start at the compaction."""
    timeline = table.timeline()
    commits, base = active_commits_and_base(timeline)
    base_files, _ = list_data_files(table)

    def plan(pending: dict[InstantTime, tuple[CompactionOperation, ...]]) -> Any:
        return plan_clean(
            commits,
            timeline.instants,
            base_files,
            RetainPolicy(1),
            0,
            base,
            pending_compactions=pending,
        )

    def group_of(path: str) -> str:
        return path.rsplit("/", 1)[-1].lstrip(".").split("_", 1)[0]

    free = plan({})
    old = sorted(p for p in free.replaced if p.endswith(".parquet"))
    assert len({group_of(p) for p in old}) == 2  # both buckets' first slices go
    name = old[0].rsplit("/", 1)[-1]
    first = timeline.completed_data_instants()[0].time
    op = CompactionOperation(old[0].rpartition("/")[0], group_of(name), first, name, ())
    newest = max(i.time for i in timeline.instants)
    at = InstantTime.from_epoch_ms(newest.to_epoch_ms() + 1)
    held = plan({at: (op,)})
    assert held.earliest_retained == free.earliest_retained
    assert {group_of(p) for p in held.replaced} == {group_of(p) for p in old} - {group_of(name)}
    # and the views kept start no later than a pending compaction
    early = InstantTime.from_epoch_ms(first.to_epoch_ms() + 1)
    capped = plan({early: ()})
    assert capped.earliest_retained == early and capped.is_empty


def test_leftover_log_files_are_cleaned_and_those_of_an_inflight_deltacommit_kept(
    table: HudiTable,
) -> None:
    before = rows_of(table)
    live_log = next(p for s in _slices(table) for p in s.log_paths)
    parsed = LogFileName.parse(live_log.rsplit("/", 1)[-1])
    folder = live_log.rpartition("/")[0]
    # a failed task attempt's copy of a committed log file: no instant lists it, no marker
    copy = LogFileName(parsed.instant_time, parsed.version, "9-9-9", parsed.file_id)
    stray = f"{folder}/{copy.name}"
    table.storage.write(stray, table.storage.read(live_log))
    # a deltacommit in flight: its log files are marked, listed by no completed instant
    t = _clock.next_instant_time(table)
    table.timeline().begin(Action.DELTA_COMMIT, t)
    pending = _write(table, t, pa.Table.from_pylist([_row(0, UPDATE, 30, 99)], schema=CHANGES))
    pending_logs = {w.path for w in pending if is_log_file_name(w.path.rsplit("/", 1)[-1])}
    assert pending_logs
    result = clean(table, _clock, RetainPolicy(commits=30), rollback_failed=False)
    assert stray in result.deleted
    assert not (pending_logs & set(result.deleted))
    assert pending_logs <= _on_storage(table)
    assert rows_of(table) == before


def test_failed_log_files_by_table_version() -> None:
    def log(n: int, token: str = "0-1-0") -> str:
        return f"p/{LogFileName(_time(n), 1, token, 'g-0').name}"

    done = Instant(_time(2), Action.DELTA_COMMIT, State.COMPLETED, _time(2))
    pending = Instant(_time(4), Action.DELTA_COMMIT, State.INFLIGHT)
    later = Instant(_time(9), Action.CLEAN, State.COMPLETED, _time(9))
    instants = [done, pending, later]
    logs = [log(2), log(2, "0-1-7"), log(3), log(4), log(1), log(5, "0-2-0")]
    listed, marked = {log(2)}, {log(5, "0-2-0")}
    # version 8: the name's instant is the writer's: its rules are a base file's
    v8 = failed_log_files(logs, instants, listed, marked, named_by_writer=True)
    assert v8 == [log(2, "0-1-7"), log(3)]
    # version 6: the name says the slice's base instant: unlisted and unmarked is garbage
    v6 = failed_log_files(logs, instants, listed, marked, named_by_writer=False)
    assert v6 == sorted([log(2, "0-1-7"), log(3), log(4), log(1)])


def test_archival_keeps_the_deltacommits_since_the_last_compaction_for_its_trigger(
    table: HudiTable,
) -> None:
    clean(table, _clock, RetainPolicy(commits=1))
    last = table.timeline().last_completed(Action.COMMIT)
    assert last is not None
    since = [i for i in table.timeline().completed(Action.DELTA_COMMIT) if i.time > last.time]
    assert since
    # fewer deltacommits than the trigger's N since it: the compaction stays too (Hudi's rule)
    kept = archive(table, _clock, ArchivePolicy(1, 2, compaction_every_commits=len(since) + 1))
    assert kept.archived and all(i.time < last.time for i in kept.archived)
    assert "the last compaction and the deltacommits since" in kept.held_back_by
    assert list(table.timeline().completed(Action.DELTA_COMMIT)) == since
    assert table.timeline().last_completed(Action.COMMIT) == last
    # N of them: the last N stay, the compaction goes
    kept = archive(table, _clock, ArchivePolicy(1, 2, compaction_every_commits=len(since)))
    assert [i.time for i in kept.archived] == [last.time]
    assert f"the last {len(since)} deltacommits" in kept.held_back_by
    assert list(table.timeline().completed(Action.DELTA_COMMIT)) == since
    # without the trigger to feed, archival goes on to the newest deltacommit
    free = archive(table, _clock, ArchivePolicy(1, 1))
    assert [i.action for i in free.archived] == [Action.DELTA_COMMIT]


@pytest.mark.parametrize("compacted", [True, False], ids=["compacted", "never-compacted"])
def test_the_compaction_trigger_holds_archival_as_hudi_does(
    tmp_path: Path, compacted: bool
) -> None:
    """Hudi's CompactionUtils.getEarliestInstantToRetainForCompaction on the timeline of its
    own unit test: deltacommits 100..500, a compaction 600 (or none), deltacommits 700, 800
    and 900 inflight."""

    def at(n: int) -> InstantTime:
        return InstantTime(f"20240101000000{n // 100:03d}")

    def inst(n: int, action: Action = Action.DELTA_COMMIT, done: bool = True) -> Instant:
        if done:
            return Instant(at(n), action, State.COMPLETED, at(n))
        return Instant(at(n), action, State.INFLIGHT)

    instants = [inst(n) for n in (100, 200, 300, 400, 500, 700, 800)]
    instants.append(inst(900, done=False))
    if compacted:
        instants.append(inst(600, Action.COMMIT))
    timeline = Timeline(tmp_path, TimelineLayout.V2, instants)

    def hold(every: int) -> InstantTime | None:
        found = merge_on_read_holds(timeline, {}, every)
        return min((h.time for h in found), default=None)

    assert hold(20) == (at(600) if compacted else at(100))
    assert hold(3) == at(700)
    assert hold(2) == at(800)
    assert hold(0) is None  # no compaction trigger to feed
    # a pending compaction's plan holds at the oldest slice it reads
    plan = {at(900): (CompactionOperation("p", "g", at(300), "b.parquet", ()),)}
    assert min(h.time for h in merge_on_read_holds(timeline, plan, 0)) == at(300)


def test_a_table_never_compacted_archives_all_but_the_last_n_deltacommits(
    tmp_path: Path,
) -> None:
    """A merge-on-read table whose compaction never ran (fewer deltacommits than its trigger's
    N, or compaction off): nothing is archived while fewer than N deltacommits exist, then all
    but the last N, base files and log files of archived deltacommits read as committed by
    lakesink's reader and hudi-rs; a later compaction and deltacommit read the same."""
    from lakesink.formats.hudi.audit import hudi_rs_batches

    for version in (6, 8):
        t = HudiTable.create(tmp_path / f"v{version}", _config(version, True, "ts", 2))
        deltacommit(t, *((k, INSERT, 1) for k in range(6)))  # base files
        deltacommit(t, (1, UPDATE, 2), (2, UPDATE, 2), (4, DELETE, 3))
        deltacommit(t, (2, UPDATE, 5), (3, UPDATE, 0), (5, DELETE, None), (6, INSERT, 1))
        deltacommit(t, (0, UPDATE, 7), (6, UPDATE, 2))
        deltacommit(t, (1, DELETE, 9), (7, INSERT, 1))
        before = rows_of(t)
        held = archive(t, _clock, ArchivePolicy(1, 2, compaction_every_commits=6))
        assert held.archived == () and "never compacted, fewer than 6" in held.held_back_by
        deltas = list(t.timeline().completed(Action.DELTA_COMMIT))
        done = archive(t, _clock, ArchivePolicy(1, 2, compaction_every_commits=3))
        assert list(done.archived) == deltas[:2]
        assert list(t.timeline().completed(Action.DELTA_COMMIT)) == deltas[2:]
        assert "the last 3 deltacommits" in done.held_back_by
        # the live slices read log files of archived deltacommits (and, version 6, log files
        # named by an archived base instant): every reader takes them as committed
        view = load_archived_view(t.storage)
        assert view is not None and any(s.log_paths for s in view.slices)
        assert _on_storage(t) == _files_of(_slices(t))
        assert rows_of(t) == before
        batches = hudi_rs_batches(str(t.base_path), {})
        assert sum(b.num_rows for b in batches) == len(before)
        # compaction off (N = 0): all but the newest deltacommit may go
        free = archive(t, _clock, ArchivePolicy(1, 1))
        assert list(free.archived) == deltas[2:4]
        assert rows_of(t) == before
        assert compact(t, _clock).instant is not None
        deltacommit(t, (0, DELETE, 20), (8, INSERT, 1))
        after = {r["id"]: r for r in rows_of(t)}
        assert 0 not in after and 8 in after and 7 in after


def test_an_archived_view_written_before_log_files_reads_without_them(tmp_path: Path) -> None:
    t = HudiTable.create(tmp_path / "t", _config(8, False, "ts", 1))
    deltacommit(t, *((k, INSERT, 1) for k in range(3)))
    deltacommit(t, (0, UPDATE, 2))
    deltacommit(t, (1, UPDATE, 2))
    archive(t, _clock, ArchivePolicy(1, 1))
    (name,) = t.storage.list_names(VIEWS_KEY)
    key = f"{VIEWS_KEY}/{name}"
    view = pq.read_table(pa.BufferReader(t.storage.read(key)))
    assert "log_paths" in view.column_names
    old = view.drop_columns(["log_paths"])
    sink = pa.BufferOutputStream()
    pq.write_table(old.replace_schema_metadata(view.schema.metadata), sink)
    t.storage.write(key, sink.getvalue().to_pybytes())
    loaded = load_archived_view(t.storage)
    assert loaded is not None and loaded.slices
    assert all(s.log_paths == () for s in loaded.slices)


def test_the_cli_cleans_archives_and_rolls_back_and_refuses_clustering(
    table: HudiTable, capsys: pytest.CaptureFixture[str]
) -> None:
    from lakesink.cli.main import main

    before = rows_of(table)
    path = str(table.base_path)
    assert main(["table", "clean", path, "--retain-commits", "1", "--json"]) == 0
    deleted = json.loads(capsys.readouterr().out)["deleted"]
    assert any(is_log_file_name(p.rsplit("/", 1)[-1]) for p in deleted)
    assert main(["table", "archive", path, "--min-instants", "1", "--max-instants", "2"]) == 0
    assert "archive: moved" in capsys.readouterr().out
    assert rows_of(table) == before
    # a deltacommit left inflight: `rollback --instant` deletes its log files
    t = _clock.next_instant_time(table)
    table.timeline().begin(Action.DELTA_COMMIT, t)
    written = _write(table, t, pa.Table.from_pylist([_row(2, UPDATE, 40, 100)], schema=CHANGES))
    assert written and all(table.storage.exists(w.path) for w in written)
    assert main(["table", "rollback", path, "--instant", t.value]) == 0
    assert not any(table.storage.exists(w.path) for w in written)
    assert table.timeline().get(t) is None
    assert rows_of(table) == before
    assert main(["table", "cluster", path]) != 0
    assert "`lakesink table compact` rewrites" in capsys.readouterr().err
    with pytest.raises(UnsupportedTableError, match="lakesink table compact"):
        cluster(table, _clock)


def test_inline_services_compact_then_clean_and_archive_a_merge_on_read_table(
    table: HudiTable,
) -> None:
    from dataclasses import replace

    settings = _settings(2)
    services = replace(
        settings.services,
        inline_every_commits=1,
        clean_retain_commits=1,
        archive_min_instants=1,
        archive_max_instants=2,
    )
    settings = replace(settings, services=services)
    before = rows_of(table)
    last = table.timeline().last_completed()
    assert last is not None
    result = after_commit(table, settings, _clock, last.time)
    assert result is not None and not result.errors
    assert result.compaction is not None and result.compaction.instant is not None
    assert result.clean is not None and result.clean.deleted
    assert result.archive is not None and result.archive.archived
    assert result.clustering is None  # skipped on a merge-on-read table
    assert _on_storage(table) == _files_of(_slices(table))
    assert rows_of(table) == before
