"""Maintenance of Iceberg tables (expire-snapshots, rewrite-data-files, remove-orphan-files) on
real SQL catalogs (a SQLite file; the session's PostgreSQL) with rows read back by pyiceberg's
scan.

Scenarios (one comment each): a rewrite is one REPLACE snapshot that keeps rows and offsets; a
rewrite that lost files to a concurrent rewrite plans again without duplicating a row; an append
between a rewrite's plan and its commit is kept, and so is one whose base snapshot a concurrent
expiry removed; expiry after a rewrite keeps every writer's
offsets; orphan removal spares a batch in flight; maintenance running while a writer appends
loses and duplicates nothing (nor does one that commits while orphan removal lists); the inline
hook; the CLI.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from iceberg_tables import Backend, expected, ingest, keys, write

from lakesink.config import load_config
from lakesink.engine.tiers import size_tier
from lakesink.formats.iceberg import rewrite as rewrite_module
from lakesink.formats.iceberg import services as maint
from lakesink.formats.iceberg.catalog import CatalogSettings
from lakesink.formats.iceberg.maintenance import referenced_files, remove_orphans
from lakesink.formats.iceberg.rewrite import RewriteOptions
from lakesink.formats.iceberg.snapshots import KEY_MAINTENANCE
from lakesink.formats.iceberg.table import CommitOutcome, IcebergTable
from lakesink.protocol.offsets import OffsetRange, TopicPartition

pytest_plugins = ["pg_fixture"]
pytestmark = pytest.mark.integration

P0, P1 = TopicPartition("events", 0), TopicPartition("events", 1)
OTHER = TopicPartition("clicks", 0)
SMALL = RewriteOptions(small_file_bytes=1 << 20, target_file_bytes=64 << 20)


def R(tp: TopicPartition, start: int, end: int) -> OffsetRange:
    return OffsetRange(tp, start, end)


@pytest.fixture
def local(tmp_path: Path) -> Backend:
    return Backend(CatalogSettings(warehouse=str(tmp_path / "wh")))


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        yield Backend(CatalogSettings(warehouse=str(tmp_path / "wh")))
    else:
        pg = request.getfixturevalue("postgres_server")
        uri = f"postgresql://postgres:{pg.password}@127.0.0.1:{pg.port}/postgres"
        name = "m" + uuid.uuid4().hex[:10]  # one catalog per test in the shared database
        yield Backend(CatalogSettings(warehouse=str(tmp_path / "wh"), uri=uri, name=name))


def live_files(table: IcebergTable) -> list[str]:
    table.refresh()
    return sorted(t.file.file_path for t in table.pyiceberg.scan().plan_files())


def on_disk(path: str) -> bool:
    return Path(path.removeprefix("file://").removeprefix("file:")).exists()


def test_rewrite_is_one_replace_snapshot_keeping_rows_and_offsets(local: Backend) -> None:
    table = local.table("db.events")
    for i in range(3):
        ingest(table, "wa", [R(P0, i * 4, i * 4 + 4), R(P1, i * 2, i * 2 + 2)])
    before = live_files(table)
    assert len(before) == 6
    result = maint.rewrite_data_files(table, SMALL)
    assert (result.files_before, result.files_after, result.rows) == (6, 2, 18)
    snap = table.pyiceberg.current_snapshot()
    assert snap is not None and snap.snapshot_id == result.snapshot_id
    assert snap.summary is not None and snap.summary.operation.value == "replace"
    assert snap.summary[KEY_MAINTENANCE] == "rewrite-data-files"
    assert set(live_files(table)) == set(result.added) and set(result.removed) == set(before)
    assert keys(table) == expected(R(P0, 0, 12), R(P1, 0, 6))
    # the writer's offsets are read past the replace snapshot; its next batch and a replay
    # are judged against them
    fresh = local.table("db.events")
    assert fresh.committed_offsets("wa").next_offsets == {P0: 12, P1: 6}
    assert ingest(fresh, "wa", [R(P0, 12, 14)]).outcome is CommitOutcome.COMMITTED
    assert ingest(fresh, "wa", [R(P0, 12, 14)]).outcome is CommitOutcome.REPLAYED
    # a second run has nothing left to do but the one new small file per partition
    assert maint.rewrite_data_files(fresh, SMALL).snapshot_id is not None
    assert maint.rewrite_data_files(fresh, SMALL).snapshot_id is None
    assert keys(fresh) == expected(R(P0, 0, 14), R(P1, 0, 6))


def test_rewrite_writes_one_file_per_group_by_size_on_disk_not_in_memory(local: Backend) -> None:
    """A group is bin-packed to the target by its files' sizes on disk; it is written as one
    file even when its rows take many times the target in memory (pyiceberg's own writer cut
    by Arrow's in-memory sizes and left files so small that every run rewrote them again)."""
    table = local.table("db.events")
    for i in range(4):
        ingest(table, "wa", [R(P0, i * 2000, i * 2000 + 2000)])
    sizes = [int(t.file.file_size_in_bytes) for t in table.pyiceberg.scan().plan_files()]
    in_memory = table.pyiceberg.scan().to_arrow().nbytes
    target = sum(sizes) + 1
    assert in_memory > 2 * target  # what made pyiceberg cut the group into several files
    result = maint.rewrite_data_files(
        table, RewriteOptions(small_file_bytes=target, target_file_bytes=target)
    )
    assert (result.files_before, result.files_after, result.rows) == (4, 1, 8000)
    assert len(live_files(table)) == 1
    assert keys(table) == expected(R(P0, 0, 8000))


def test_a_tiered_rewrite_takes_only_the_size_tiers_holding_enough_files(local: Backend) -> None:
    """With a tier ratio (the inline runs) a rewrite takes the files of a size tier together
    once it holds `ratio` of them; the lone small files of another tier wait (`engine.tiers`),
    and a rewrite without tiers (by hand) takes them all."""
    table = local.table("db.events")
    for i in range(4):
        ingest(table, "wa", [R(P0, i * 2000, i * 2000 + 2000)])
    for i in range(2):
        ingest(table, "wa", [R(P0, 8000 + i, 8001 + i)])
    sizes = [int(t.file.file_size_in_bytes) for t in table.pyiceberg.scan().plan_files()]
    # the four large files in tier 1 (a sixteenth to a quarter of the target: together they
    # fit one target-size file), the two one-row files lower
    target = 16 * sorted(sizes)[-4]
    tiers = [size_tier(s, target, 4) for s in sizes]
    assert tiers.count(1) == 4 and max(sizes) < target // 4
    tiered = RewriteOptions(target, target, tier_ratio=4)
    result = maint.rewrite_data_files(table, tiered)
    assert (result.files_before, result.files_after, result.rows) == (4, 1, 8000)
    assert len(live_files(table)) == 3
    assert maint.rewrite_data_files(table, tiered).snapshot_id is None  # 3 files, 2 tiers
    assert maint.rewrite_data_files(table, RewriteOptions(target, target)).files_before == 3
    assert len(live_files(table)) == 1
    assert keys(table) == expected(R(P0, 0, 8002))


def _racing(
    monkeypatch: pytest.MonkeyPatch, competitor: Callable[[], None]
) -> list[rewrite_module.ReplaceOutcome]:
    """Run `competitor` once between a rewrite's plan and its commit."""
    real = rewrite_module.replace_files
    calls: list[Any] = []
    raced: list[bool] = []

    def replace_files(*args: Any, **kwargs: Any) -> rewrite_module.ReplaceOutcome:
        if not raced:
            raced.append(True)
            competitor()  # its own rewrite goes through here too, without racing again
            calls.clear()
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(maint, "replace_files", replace_files)
    return calls


def test_rewrite_that_lost_files_to_a_concurrent_rewrite_plans_again(
    local: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = local.table("db.events")
    for i in range(3):
        ingest(table, "wa", [R(P0, i * 3, i * 3 + 3)])
    ingest(table, "wa", [R(P1, 0, 2)])  # one file in P1: only P0 is rewritten
    other = local.table("db.events")
    won: list[maint.RewriteResult] = []
    written: list[set[str]] = []

    def competitor() -> None:
        before = {p.name for p in Path(table.location.removeprefix("file://")).rglob("*.parquet")}
        won.append(maint.rewrite_data_files(other, SMALL))
        written.append(before)

    calls = _racing(monkeypatch, competitor)
    result = maint.rewrite_data_files(table, SMALL)
    # the competitor replaced P0's files first; ours failed on a removed file, deleted what it
    # wrote, planned again on fresh metadata and found nothing left to rewrite
    assert won[0].snapshot_id is not None and won[0].files_before == 3
    assert len(calls) == 1 and result.attempts == 2 and result.snapshot_id is None
    assert keys(table) == expected(R(P0, 0, 9), R(P1, 0, 2))
    assert table.committed_offsets("wa").next_offsets == {P0: 9, P1: 2}
    data = Path(table.location.removeprefix("file://"))
    left = {p.name for p in data.rglob("*.parquet")} - written[0]
    assert left == {Path(p).name for p in won[0].added}  # none of our first attempt's files


def test_append_between_a_rewrites_plan_and_commit_is_kept(
    local: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = local.table("db.events")
    for i in range(3):
        ingest(table, "wa", [R(P0, i * 3, i * 3 + 3)])
    writer = local.table("db.events")
    _racing(monkeypatch, lambda: ingest(writer, "wb", [R(OTHER, 0, 5)]).outcome)
    result = maint.rewrite_data_files(table, SMALL)
    assert result.attempts == 1 and (result.files_before, result.files_after) == (3, 1)
    assert keys(table) == expected(R(P0, 0, 9), R(OTHER, 0, 5))
    assert table.committed_offsets("wb").next_offsets == {OTHER: 5}
    assert table.committed_offsets("wa").next_offsets == {P0: 9}


def test_append_whose_base_snapshot_was_expired_meanwhile_lands_on_the_fresh_one(
    local: Backend,
) -> None:
    writer = local.table("db.events")
    for i in range(2):
        ingest(writer, "wa", [R(P0, i * 3, i * 3 + 3)])
    maint.rewrite_data_files(writer, SMALL)  # the replace snapshot is the writer's base
    base = writer.pyiceberg.metadata.current_snapshot_id
    files = write(writer, [R(P0, 6, 9)])  # the batch in flight, planned on `base`
    other = local.table("db.events")
    ingest(other, "wb", [R(OTHER, 0, 2)])
    maint.rewrite_data_files(other, SMALL)
    maint.expire_snapshots(other, 0, now_ms=int(time.time() * 1000) + 60_000)
    assert base not in {s.snapshot_id for s in other.pyiceberg.metadata.snapshots}
    result = writer.commit_append(files, writer.begin("wa", [R(P0, 6, 9)]).requirement)
    assert result.outcome is CommitOutcome.COMMITTED and result.attempts == 2
    assert keys(writer) == expected(R(P0, 0, 9), R(OTHER, 0, 2))


def test_expiry_after_a_rewrite_keeps_every_writers_offsets(local: Backend) -> None:
    table = local.table("db.events")
    ingest(table, "wa", [R(P0, 0, 3)])
    ingest(table, "wa", [R(P0, 3, 6)])
    ingest(table, "wb", [R(OTHER, 0, 2)])
    maint.rewrite_data_files(table, SMALL)
    for i in range(1, 4):
        ingest(table, "wb", [R(OTHER, i * 2, i * 2 + 2)])
    # everything but the current snapshot is older than the cut-off: wa's newest commit stays,
    # behind the rewrite and wb's commits, and the walk reaches it past the cut chain
    result = maint.expire_snapshots(table, 0, now_ms=int(time.time() * 1000) + 60_000)
    assert len(result.expired) == 5 and result.retained == 2
    record = json.loads(table.pyiceberg.properties["lakesink.maintenance.last-expire"])
    assert record[KEY_MAINTENANCE] == "expire-snapshots" and record["expired"] == "5"
    fresh = local.table("db.events")
    assert fresh.committed_offsets("wa").next_offsets == {P0: 6}
    assert fresh.committed_offsets("wb").next_offsets == {OTHER: 8}
    assert keys(fresh) == expected(R(P0, 0, 6), R(OTHER, 0, 8))
    assert ingest(fresh, "wa", [R(P0, 3, 6)]).outcome is CommitOutcome.REPLAYED
    assert ingest(fresh, "wa", [R(P0, 6, 7)]).outcome is CommitOutcome.COMMITTED


def test_orphan_removal_never_deletes_a_batch_in_flight(local: Backend) -> None:
    table = local.table("db.events")
    ingest(table, "wa", [R(P0, 0, 3)])
    failed = write(table, [R(P0, 3, 6)])  # a task attempt whose batch was given up
    append = table.begin("wa", [R(P0, 3, 6)])
    in_flight = write(table, [R(P0, 3, 6)])  # written, not yet committed
    append.stage(in_flight)
    later = time.time() + 3600
    # younger than the window: nothing goes, the given-up attempt included
    assert maint.remove_orphan_files(table, 2.0, now=time.time()).deleted == ()
    # past the window, a file an in-flight batch names is still spared
    gone = maint.remove_orphan_files(
        table, 0.0, now=later, in_flight=[f.path for f in in_flight]
    ).deleted
    assert {Path(f.path.removeprefix("file://")).name for f in failed} <= {
        Path(p).name for p in gone
    }
    assert all(on_disk(f.path) for f in in_flight) and not any(on_disk(f.path) for f in failed)
    assert append.commit().outcome is CommitOutcome.COMMITTED
    assert keys(table) == expected(R(P0, 0, 6))


def test_orphan_removal_spares_a_batch_that_committed_while_it_listed(local: Backend) -> None:
    table = local.table("db.events")
    ingest(table, "wa", [R(P0, 0, 3)])
    append = table.begin("wa", [R(P0, 3, 6)])
    append.stage(write(table, [R(P0, 3, 6)]))  # older than the window when the listing runs
    keep = referenced_files(table.pyiceberg)

    def committed_meanwhile() -> set[str]:
        assert append.commit().outcome is CommitOutcome.COMMITTED
        table.refresh()
        return referenced_files(table.pyiceberg)

    gone = remove_orphans(
        table.location, keep, older_than_s=0, now=time.time() + 3600, recheck=committed_meanwhile
    )
    assert gone == []
    assert all(on_disk(f.path) for f in append.files)
    assert keys(local.table("db.events")) == expected(R(P0, 0, 6))


def test_maintenance_while_a_writer_appends_loses_and_duplicates_nothing(
    backend: Backend,
) -> None:
    backend.table("db.events")  # created before the writer starts
    least_batches, most_batches = 10, 60
    errors: list[BaseException] = []
    runs: list[maint.MaintenanceRun] = []
    written: list[int] = []
    started, done = threading.Event(), threading.Event()

    def rewrites_landed() -> int:
        return sum(1 for r in runs if r.rewrite is not None and r.rewrite.snapshot_id)

    def writer() -> None:
        try:
            table = backend.table("db.events", sleep=lambda s: time.sleep(s / 10))
            # Goes on until two replace snapshots landed between its appends, however slow the
            # machine's maintenance runs are, so the interleaving is tested, not the timing.
            for i in range(most_batches):
                if i >= least_batches and rewrites_landed() >= 2:
                    break
                table.refresh()
                ranges = [R(P0, i * 3, i * 3 + 3), R(P1, i * 2, i * 2 + 2)]
                result = table.commit_append(
                    write(table, ranges), table.begin("w", ranges).requirement
                )
                assert result.outcome is CommitOutcome.COMMITTED, result
                written.append(i)
                started.set()
                time.sleep(0.05)  # a stream's pace: maintenance runs between and during commits
        except BaseException as e:  # reported below
            errors.append(e)
        finally:
            started.set()
            done.set()

    thread = threading.Thread(target=writer)
    table = backend.table("db.events", sleep=lambda s: time.sleep(s / 10))
    thread.start()
    options = maint.IcebergMaintenanceOptions(
        expire_older_than_hours=0.0, rewrite=SMALL, orphan_older_than_hours=30 / 3600
    )
    assert started.wait(60)
    while not done.is_set():
        runs.append(maint.run_iceberg_maintenance(table, options))
        offsets = table.committed_offsets("w").next_offsets
        assert offsets.get(P0, 0) // 3 == offsets.get(P1, 0) // 2  # one batch's offsets
    thread.join(120)
    assert not errors, errors[0]
    assert not [e for r in runs for e in r.errors], [r.errors for r in runs]
    assert rewrites_landed() >= 2, runs  # replace snapshots landed between the writer's appends
    assert any(r.expire is not None and r.expire.expired for r in runs)
    maint.run_iceberg_maintenance(table, options)  # and once more at rest
    batches = len(written)
    fresh = backend.table("db.events")
    assert keys(fresh) == expected(R(P0, 0, batches * 3), R(P1, 0, batches * 2))
    assert fresh.committed_offsets("w").next_offsets == {P0: batches * 3, P1: batches * 2}
    assert len(live_files(fresh)) == 2  # one file per partition after the last rewrite


def hook_keys(local: Backend, **more: str) -> dict[str, str]:
    """An ingestion's keys for the table `db.events` of `local` (the services' process opens
    the table of the settings), with `more`; rewrites take every small file (no size tiers: the
    tests' few files would never fill one)."""
    return {
        "table.services.clustering.tier.ratio": "0",
        "kafka.bootstrap.servers": "127.0.0.1:9",
        "kafka.topics": "events",
        "value.format": "raw",
        "table.path": local.settings.warehouse,
        "table.format": "iceberg",
        "iceberg.namespace": "db",
        "table.name": "events",
        **more,
    }


def test_inline_hook_runs_the_configured_actions_every_n_commits(local: Backend) -> None:
    table = local.table("db.events")
    cfg = load_config(
        None,
        hook_keys(
            local,
            **{"table.services.inline.every.commits": "2", "table.services.inline": "cluster"},
        ),
    )
    hook = maint.iceberg_maintenance_hook(table, cfg.settings)
    ran = [hook(ingest(table, "wa", [R(P0, i * 2, i * 2 + 2)])) for i in range(4)]
    assert [r is not None for r in ran] == [False, True, False, True]
    # two small files, then the rewritten one and two new ones
    assert [r.rewrite.files_before for r in ran if r and r.rewrite] == [2, 3]
    assert ran[1] is not None and ran[1].expire is None and ran[1].orphans is None
    assert hook(ingest(table, "wa", [R(P0, 6, 8)])) is None  # a replay is no commit
    assert keys(table) == expected(R(P0, 0, 8))
    assert len(live_files(table)) == 1


def test_inline_orphan_removal_runs_at_most_once_per_its_interval(local: Backend) -> None:
    """table.services.orphans.every.hours: the first due run removes orphans, the next ones
    within the interval skip it (the other actions still run); 0 removes them at every run."""
    table = local.table("db.events")
    keys_of = hook_keys(
        local,
        **{
            "table.services.inline.every.commits": "1",
            "table.services.inline": "expire-snapshots,remove-orphan-files",
            "table.services.run": "before",
        },
    )
    hourly = load_config(None, keys_of).settings
    assert hourly.services.orphans_every_hours == 1.0  # the default
    hook = maint.iceberg_maintenance_hook(table, hourly)
    ran = [hook(ingest(table, "wa", [R(P0, i, i + 1)])) for i in range(3)]
    assert [r is not None and r.expire is not None for r in ran] == [True] * 3
    assert [r is not None and r.orphans is not None for r in ran] == [True, False, False]
    always = load_config(None, {**keys_of, "table.services.orphans.every.hours": "0"})
    hook = maint.iceberg_maintenance_hook(table, always.settings)
    ran = [hook(ingest(table, "wa", [R(P0, i, i + 1)])) for i in range(3, 5)]
    assert [r is not None and r.orphans is not None for r in ran] == [True, True]
    assert keys(table) == expected(R(P0, 0, 5))


def test_inline_hook_beside_hands_the_run_to_the_runner_and_the_writer_commits_on(
    local: Backend,
) -> None:
    """table.services.run=beside: the due rewrite and expiry run in the services' process
    (handed over by the runner's thread) on a handle of their own; the writer's handle, stale
    after the rewrite, still commits every row once. A run with orphan removal and no safety
    window stays in the hook, whole."""
    from lakesink.engine.services import ServicesRunner

    table = local.table("db.events")
    keys_of = hook_keys(
        local,
        **{
            "table.services.inline.every.commits": "2",
            "table.services.inline": "cluster,expire-snapshots",
        },
    )
    cfg = load_config(None, keys_of)
    assert cfg.settings.services.run == "beside"
    runner = ServicesRunner("events")
    hook = maint.iceberg_maintenance_hook(table, cfg.settings, runner=runner)
    assert hook(ingest(table, "wa", [R(P0, 0, 2)])) is None  # not due
    assert not runner.busy
    assert hook(ingest(table, "wa", [R(P0, 2, 4)])) is None  # due: handed to the runner
    assert runner.wait_idle(60)
    assert (runner.stats.runs, runner.stats.failed) == (1, 0)
    current = local.table("db.events").pyiceberg.current_snapshot()
    assert current is not None and current.summary is not None
    assert current.summary[KEY_MAINTENANCE] == "rewrite-data-files"  # by the runner's handle
    # the writer's handle still shows the table before the rewrite; it commits on
    assert hook(ingest(table, "wa", [R(P0, 4, 6)])) is None
    assert runner.close(60)
    assert keys(local.table("db.events")) == expected(R(P0, 0, 6))
    assert local.table("db.events").committed_offsets("wa").next_offsets == {P0: 6}
    assert len(live_files(local.table("db.events"))) == 2  # the rewritten file and a new one

    unsafe = load_config(
        None,
        {
            **keys_of,
            "table.services.inline": "cluster,clean",
            "table.services.orphans.retain.hours": "0",
        },
    )
    runner = ServicesRunner("events")
    hook = maint.iceberg_maintenance_hook(table, unsafe.settings, runner=runner)
    assert hook(ingest(table, "wa", [R(P0, 6, 8)])) is None
    done = hook(ingest(table, "wa", [R(P0, 8, 10)]))
    assert done is not None and done.rewrite is not None and done.orphans is not None
    assert done.errors == [] and not runner.busy and runner.stats.runs == 0
    assert keys(local.table("db.events")) == expected(R(P0, 0, 10))


def test_cli_runs_each_action_on_the_configured_table(
    tmp_path: Path, cli: Callable[..., Any]
) -> None:
    wh = tmp_path / "wh"
    table = Backend(CatalogSettings(warehouse=str(wh))).table("lake.events")
    for i in range(3):
        ingest(table, "wa", [R(P0, i * 2, i * 2 + 2)])
    conf = tmp_path / "c.yaml"
    conf.write_text(
        "kafka.bootstrap.servers: 127.0.0.1:9\nkafka.topics: events\nvalue.format: raw\n"
        f"table.path: {wh}\ntable.name: events\ntable.format: iceberg\n"
        "iceberg.namespace: lake\ntable.services.clustering.small.file.bytes: 1048576\n"
    )
    out = cli(["iceberg", "rewrite-data-files", "--config", str(conf), "--json"])
    assert out.returncode == 0, out.stdout
    rewritten = json.loads(out.stdout)
    assert (rewritten["table"], rewritten["files_before"], rewritten["files_after"]) == (
        "lake.events", 3, 1,
    )  # fmt: skip
    out = cli(["iceberg", "expire-snapshots", "-c", str(conf), "--older-than-hours", "0", "--json"])
    assert out.returncode == 0, out.stdout
    assert len(json.loads(out.stdout)["expired"]) == 2  # kept: the current and wa's newest
    out = cli(["iceberg", "remove-orphan-files", "-c", str(conf), "--json"])
    assert out.returncode == 0, out.stdout
    assert json.loads(out.stdout)["deleted"] == []  # everything is younger than 3 days
    fresh = Backend(CatalogSettings(warehouse=str(wh))).table("lake.events")
    assert keys(fresh) == expected(R(P0, 0, 6))
    assert fresh.committed_offsets("wa").next_offsets == {P0: 6}
    bad = cli(["iceberg", "expire-snapshots", "-c", str(conf), "--set", "iceberg.namespace=nope"])
    assert bad.returncode != 0 and "no Iceberg table nope.events" in bad.stdout
    assert "Traceback" not in bad.stdout
