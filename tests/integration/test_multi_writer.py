"""Several writers and table services on one table, with the real lock providers.

Scenario table (one comment per case), run with threads and with separate processes
(multiprocessing spawn); writers use the table layer and the Coordinator directly (no Spark):
- append vs append: two ingestion writers commit at once; both land, no conflict;
- append vs clustering: clustering rewrites small files while a writer appends; both land;
- clustering vs clustering: two clusterings at once; never the same file group twice;
- clean during a write: the cleaner (retain 1 commit) runs while a writer appends; nothing
  a reader needs is deleted;
- a writer killed mid-commit (SIGKILL after reconcile): lazy rollback (the cleaner) removes its
  instant; its restart re-commits the batch once;
- an expired lease: a holder stalled past its lease is taken over and must not publish;
- an expired heartbeat: the cleaner rolls back the paused writer's instant; the writer aborts;
- a lock holder killed: the next writer gets the lock (after the lease, or at once in PostgreSQL);
- both lock providers: the concurrent cases run with the filesystem lock and PostgreSQL;
- upsert vs upsert: two `lakesink ingest` processes upsert overlapping keys from two topics into
  one table of keys (2 buckets): a batch that loses a bucket to the other is written again, and
  the table ends as the fold of both topics by key.
After each: hudi-rs and lakesink's reader return the same rows, and the exactly-once audit of
every writer passes (readers agree, no duplicates, contiguous committed ranges).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from integration.table_stores import EMULATED, STORES, table_uri_in_env

from lakesink.errors import CommitConflictError, HeartbeatExpiredError, LakesinkError, LockError
from lakesink.formats.hudi.audit import audit, read_with_hudi_rs
from lakesink.formats.hudi.concurrency.lock import FileLockProvider
from lakesink.formats.hudi.control import LockedCommitControl
from lakesink.formats.hudi.coordinator import HudiCoordinator
from lakesink.formats.hudi.services.archival import ArchivePolicy, archive, archived_instants
from lakesink.formats.hudi.services.clean import RetainPolicy, clean
from lakesink.formats.hudi.services.clustering import ClusteringOptions, cluster
from lakesink.formats.hudi.table.archive import load_archived_view
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.files import write_token
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.table.view import FileSystemView
from lakesink.formats.hudi.table.writer import PartitionedWriter
from lakesink.protocol.instant import Action
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import WriteStatus

pytest_plugins = ["pg_fixture"]
pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
COORDS = ["kafka_topic", "kafka_partition", "kafka_offset"]
ROWS_PER_BATCH = 20


# --- writers built on the table layer -------------------------------------------------------


def create_table(path: Path | str) -> HudiTable:
    return HudiTable.create(
        path,
        TableConfig(
            name="multi", record_key_fields=tuple(COORDS), partition_fields=("kafka_partition",)
        ),
    )


def services_for(
    path: Path | str, lock: str, dsn: str | None, writer_id: str, **kw: Any
) -> LockedCommitControl:
    return LockedCommitControl(
        path,
        lock_provider=lock,
        postgres_dsn=dsn,
        lock_timeout_s=kw.pop("lock_timeout_s", 30.0),
        lock_lease_s=kw.pop("lock_lease_s", 5.0),
        heartbeat_interval_s=kw.pop("heartbeat_interval_s", 0.5),
        heartbeat_tolerance_s=kw.pop("heartbeat_tolerance_s", 5.0),
        writer_id=writer_id,
        **kw,
    )


def rows(topic: str, partition: int, start: int, n: int) -> pa.Table:
    return pa.table(
        {
            "kafka_topic": pa.array([topic] * n, pa.string()),
            "kafka_partition": pa.array([partition] * n, pa.int32()),
            "kafka_offset": pa.array(range(start, start + n), pa.int64()),
            "payload": pa.array([f"v{start + i}" for i in range(n)], pa.string()),
        }
    )


def commit_one_batch(
    coord: HudiCoordinator, topic: str, batch_id: int, n: int = ROWS_PER_BATCH
) -> int:
    """One batch of `n` records of partition batch_id % 2, committed through the coordinator."""
    tp = TopicPartition(topic, batch_id % 2)
    start = coord.committed.get(tp) or 0
    rng = OffsetRange(tp, start, start + n)
    t = coord.begin_batch(batch_id, [rng])
    assert t is not None
    writer = PartitionedWriter(coord.table, t, write_token(batch_id % 7, 0, 0))
    writer.write(rows(topic, tp.partition, start, n))
    files = writer.close()
    status = WriteStatus(t.value, f"a{batch_id}", rng, tuple(files), n, n)
    try:
        coord.complete_batch(t, batch_id, [rng], [status], schema=writer.avro_schema or "")
    except BaseException:
        coord.abort(t)
        raise
    return n


def ingest(path: str, writer_id: str, topic: str, batches: int, lock: str, dsn: str | None) -> int:
    """A streaming writer: `batches` batches, retried on a conflict (never expected here)."""
    table = HudiTable.open(path)
    coord = HudiCoordinator(table, writer_id, control=services_for(path, lock, dsn, writer_id))
    coord.start()
    done = 0
    batch = 0
    while batch < batches:
        try:
            done += commit_one_batch(coord, topic, batch)
            batch += 1
        except CommitConflictError:
            coord.recover()
    return done


def run_clusterings(path: str, lock: str, dsn: str | None, rounds: int, pause_s: float) -> int:
    table = HudiTable.open(path)
    services = services_for(path, lock, dsn, "clusterer")
    ok = 0
    for _ in range(rounds):
        try:
            if cluster(table, services, ClusteringOptions(min_files=2)).instant is not None:
                ok += 1
        except CommitConflictError:
            pass
        time.sleep(pause_s)
    return ok


def run_cleans(path: str, lock: str, dsn: str | None, rounds: int, pause_s: float) -> int:
    table = HudiTable.open(path)
    services = services_for(path, lock, dsn, "cleaner")
    deleted = 0
    for _ in range(rounds):
        deleted += len(clean(table, services, RetainPolicy(commits=1)).deleted)
        time.sleep(pause_s)
    return deleted


def run_archivals(path: str, lock: str, dsn: str | None, rounds: int, pause_s: float) -> int:
    """Clean then archive down to 2 active instants, again and again, packing the archive in
    packs of 4 files merged two by two (readers of archived instants race with the packing)."""
    table = HudiTable.open(path)
    services = services_for(path, lock, dsn, "archiver")
    moved = 0
    for _ in range(rounds):
        clean(table, services, RetainPolicy(commits=2))
        policy = ArchivePolicy(min_instants=2, max_instants=3, pack_files=4, pack_fan_in=2)
        moved += len(archive(table, services, policy).archived)
        time.sleep(pause_s)
    return moved


# --- running things at once ------------------------------------------------------------------


def run_together(mode: str, jobs: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
    """Run the jobs at once, as threads or as spawned processes; fail if any failed."""
    if mode == "thread":
        errors: list[BaseException] = []

        def wrap(fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
            try:
                fn(*args)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=wrap, args=job) for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        return
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=fn, args=args) for fn, args in jobs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * len(procs)


def assert_consistent(path: Path | str, writers: list[str], expected_rows: int) -> None:
    """hudi-rs and lakesink's reader see the same rows, once each; every writer's audit passes."""
    table = HudiTable.open(path)
    by_rs = read_with_hudi_rs(table.uri, table.storage.reader_options())
    by_ls = TableReader(table).snapshot(columns=COORDS)
    as_set = lambda t: sorted(zip(*(t.column(c).to_pylist() for c in COORDS), strict=True))  # noqa: E731
    assert as_set(by_rs) == as_set(by_ls)
    assert by_rs.num_rows == len(set(as_set(by_rs))) == expected_rows
    assert not table.timeline().inflight_or_requested(Action.COMMIT)
    for w in writers:
        report = audit(table.storage, w, bootstrap=None)
        assert report.ok, report.problems


MODES = ["thread", "process"]


@pytest.fixture(params=["filesystem", "postgres"])
def lock(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    if request.param == "postgres":
        return "postgres", request.getfixturevalue("postgres_dsn")
    return "filesystem", None


# --- the scenarios ---------------------------------------------------------------------------


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("mode", MODES)
def test_append_vs_append_both_land_without_conflict(
    mode: str,
    store: str,
    lock: tuple[str, str | None],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    # two ingestion writers, separate topics, commit at the same time: appends never conflict
    path = table_uri_in_env(store, tmp_path, request)
    create_table(path)
    kind, dsn = lock
    run_together(
        mode,
        [
            (ingest, (str(path), "w-a", "topic-a", 6, kind, dsn)),
            (ingest, (str(path), "w-b", "topic-b", 6, kind, dsn)),
        ],
    )
    assert_consistent(path, ["w-a", "w-b"], 12 * ROWS_PER_BATCH)


@pytest.mark.parametrize("mode", MODES)
def test_append_vs_clustering_both_land_and_rows_stay_once(
    mode: str, lock: tuple[str, str | None], tmp_path: Path
) -> None:
    # clustering rewrites small files of completed commits while a writer appends new ones
    path = tmp_path / "t"
    create_table(path)
    kind, dsn = lock
    ingest(str(path), "w-a", "topic-a", 4, kind, dsn)
    run_together(
        mode,
        [
            (ingest, (str(path), "w-b", "topic-b", 6, kind, dsn)),
            (run_clusterings, (str(path), kind, dsn, 3, 0.05)),
        ],
    )
    table = HudiTable.open(path)
    assert table.timeline().completed(Action.REPLACE_COMMIT)
    assert_consistent(path, ["w-a", "w-b"], 10 * ROWS_PER_BATCH)


@pytest.mark.parametrize("mode", MODES)
def test_clustering_vs_clustering_rewrites_each_file_group_once(mode: str, tmp_path: Path) -> None:
    # two clusterings at once: plans exclude each other's file groups, or the later one conflicts
    path = tmp_path / "t"
    create_table(path)
    ingest(str(path), "w-a", "topic-a", 8, "filesystem", None)
    before = len(FileSystemView(HudiTable.open(path)).latest_base_files())
    run_together(
        mode,
        [
            (run_clusterings, (str(path), "filesystem", None, 1, 0)),
            (run_clusterings, (str(path), "filesystem", None, 1, 0)),
        ],
    )
    table = HudiTable.open(path)
    replaced: list[tuple[str, str]] = []
    for inst in table.timeline().completed(Action.REPLACE_COMMIT):
        md = table.timeline().commit_metadata(inst)
        replaced += [(p, f) for p, ids in md.replaced_file_ids.items() for f in ids]
    assert replaced and len(replaced) == len(set(replaced))
    assert len(FileSystemView(table).latest_base_files()) < before
    assert_consistent(path, ["w-a"], 8 * ROWS_PER_BATCH)


@pytest.mark.parametrize("mode", MODES)
def test_clean_during_a_write_never_deletes_what_a_reader_needs(mode: str, tmp_path: Path) -> None:
    # the cleaner keeps only the latest view, runs again and again while a writer appends
    # and a clustering replaces file groups
    path = tmp_path / "t"
    create_table(path)
    ingest(str(path), "w-a", "topic-a", 4, "filesystem", None)
    run_together(
        mode,
        [
            (ingest, (str(path), "w-b", "topic-b", 6, "filesystem", None)),
            (run_cleans, (str(path), "filesystem", None, 6, 0.02)),
            (run_clusterings, (str(path), "filesystem", None, 2, 0.05)),
        ],
    )
    table = HudiTable.open(path)
    services = services_for(path, "filesystem", None, "cleaner")
    clean(table, services, RetainPolicy(commits=1))
    on_storage = {p.relative_to(path).as_posix() for p in path.rglob("*.parquet")}
    needed = {s.path for s in FileSystemView(table).latest_base_files()}
    assert on_storage == needed  # replaced groups deleted, nothing visible lost
    assert_consistent(path, ["w-a", "w-b"], 10 * ROWS_PER_BATCH)


ARCHIVER = """
import sys
sys.path[:0] = [{tests!r}]
from integration.test_multi_writer import run_archivals
run_archivals({path!r}, "filesystem", None, 1, 0)
"""


def test_archival_killed_mid_move_keeps_reads_whole_and_is_finished_later(tmp_path: Path) -> None:
    # SIGKILL after archival wrote its archived view and moved its first instant, holding the
    # lock: readers still see every row once; the next archival (once the dead holder's lease
    # expired) finishes the move; the writer goes on
    path = tmp_path / "t"
    create_table(path)
    ingest(str(path), "w-a", "topic-a", 8, "filesystem", None)
    code = ARCHIVER.format(tests=str(REPO / "tests"), path=str(path))
    env = {**os.environ, "LAKESINK_CRASH_AT": "during-archival"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL
    view = load_archived_view(path)
    assert view is not None
    assert any(i.time <= view.upto for i in HudiTable.open(path).timeline().completed())
    assert_consistent(path, ["w-a"], 8 * ROWS_PER_BATCH)
    run_archivals(str(path), "filesystem", None, 1, 0)
    assert all(i.time > view.upto for i in HudiTable.open(path).timeline().instants)
    assert_consistent(path, ["w-a"], 8 * ROWS_PER_BATCH)
    ingest(str(path), "w-a", "topic-a", 1, "filesystem", None)
    assert_consistent(path, ["w-a"], 9 * ROWS_PER_BATCH)


@pytest.mark.parametrize("mode", MODES)
def test_archival_during_writes_keeps_every_row_and_offset(mode: str, tmp_path: Path) -> None:
    # two writers append and a clustering runs while the cleaner and archival move completed
    # instants out of the active timeline; readers, offsets and audits (which read the archive)
    # see every row once
    path = tmp_path / "t"
    create_table(path)
    ingest(str(path), "w-a", "topic-a", 4, "filesystem", None)
    run_together(
        mode,
        [
            (ingest, (str(path), "w-a", "topic-a", 6, "filesystem", None)),
            (ingest, (str(path), "w-b", "topic-b", 6, "filesystem", None)),
            (run_clusterings, (str(path), "filesystem", None, 2, 0.05)),
            (run_archivals, (str(path), "filesystem", None, 8, 0.02)),
        ],
    )
    table = HudiTable.open(path)
    services = services_for(path, "filesystem", None, "archiver")
    clean(table, services, RetainPolicy(commits=1))
    last = archive(table, services, ArchivePolicy(min_instants=2, max_instants=3))
    assert archived_instants(table)
    # at most max_instants (3) completed instants stay active; more only when they follow the
    # newest data instants (kept for hudi-rs), or when archival says what held it back
    active, active_data = table.timeline().completed(), table.timeline().completed_data_instants()
    assert len(active) <= 3 or len(active_data) <= 2 or last.held_back_by, active
    assert_consistent(path, ["w-a", "w-b"], 16 * ROWS_PER_BATCH)
    ingest(str(path), "w-b", "topic-b", 1, "filesystem", None)  # resumes from archived offsets
    assert_consistent(path, ["w-a", "w-b"], 17 * ROWS_PER_BATCH)


WORKER = """
import sys
sys.path[:0] = [{tests!r}]
from integration.test_multi_writer import ingest
ingest({path!r}, {writer!r}, {topic!r}, {batches}, "filesystem", None)
"""


@pytest.mark.parametrize("store", ["local", *EMULATED])
def test_writer_killed_mid_commit_is_rolled_back_lazily_and_restarts_once(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # SIGKILL after reconcile of the 3rd batch: its instant stays inflight with a stale
    # heartbeat; the cleaner's lazy rollback removes it; the restart re-commits from the table
    # (on Azure Blob too: Azurite, its settings in the environment the killed writer inherits)
    path = table_uri_in_env(store, tmp_path, request)
    create_table(path)
    code = WORKER.format(
        tests=str(REPO / "tests"), path=str(path), writer="w-a", topic="topic-a", batches=5
    )
    env = {
        **os.environ,
        "LAKESINK_CRASH_AT": "after-reconcile",
        "LAKESINK_CRASH_AFTER_BATCHES": "2",
    }
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL
    table = HudiTable.open(path)
    assert len(table.timeline().inflight_or_requested(Action.COMMIT)) == 1
    assert_consistent_rows = TableReader(table).snapshot(columns=COORDS).num_rows
    assert assert_consistent_rows == 2 * ROWS_PER_BATCH  # the killed batch is invisible
    cleaner = services_for(path, "filesystem", None, "cleaner", heartbeat_tolerance_s=1.0)
    time.sleep(1.2)
    result = clean(table, cleaner, RetainPolicy(commits=5))
    assert [i.action for i in result.rolled_back] == [Action.COMMIT]
    assert not table.timeline().inflight_or_requested()
    ingest(str(path), "w-a", "topic-a", 3, "filesystem", None)
    assert_consistent(path, ["w-a"], 5 * ROWS_PER_BATCH)


def test_expired_lease_holder_is_taken_over_and_must_not_publish(tmp_path: Path) -> None:
    # writer A's lease (0.3 s, not renewed) runs out while it stalls inside the lock;
    # B takes the lock over and commits; A's check before publishing fails: nothing of A lands
    path = tmp_path / "t"
    create_table(path)
    slow_lock = FileLockProvider(path, "w-a", lease_s=0.3, auto_renew=False)
    services_a = services_for(path, "filesystem", None, "w-a", provider=slow_lock)
    stalled = threading.Event()
    original = services_a.check_alive

    def stall_then_check(table: HudiTable, t: Any) -> None:
        stalled.set()
        time.sleep(0.8)
        original(table, t)

    services_a.check_alive = stall_then_check  # type: ignore[method-assign]
    coord_a = HudiCoordinator(HudiTable.open(path), "w-a", control=services_a)
    outcome: list[BaseException] = []

    def run_a() -> None:
        try:
            commit_one_batch(coord_a, "topic-a", 0)
        except LakesinkError as e:
            outcome.append(e)

    thread = threading.Thread(target=run_a)
    thread.start()
    assert stalled.wait(30)
    ingest(str(path), "w-b", "topic-b", 2, "filesystem", None)  # takes the expired lease over
    thread.join(30)
    assert outcome and isinstance(outcome[0], LockError)
    assert_consistent(path, ["w-a", "w-b"], 2 * ROWS_PER_BATCH)


def test_expired_heartbeat_instant_is_rolled_back_and_its_writer_aborts(tmp_path: Path) -> None:
    # writer A pauses (its heartbeat stops) longer than the tolerance; the cleaner rolls back
    # A's instant; A wakes up, fails its liveness check and publishes nothing; a retry lands
    path = tmp_path / "t"
    create_table(path)
    services_a = services_for(
        path, "filesystem", None, "w-a", heartbeat_interval_s=0.2, heartbeat_tolerance_s=0.6
    )
    coord_a = HudiCoordinator(HudiTable.open(path), "w-a", control=services_a)
    tp = TopicPartition("topic-a", 0)
    rng = OffsetRange(tp, 0, ROWS_PER_BATCH)
    t = coord_a.begin_batch(0, [rng])
    assert t is not None
    writer = PartitionedWriter(coord_a.table, t, write_token(0, 0, 0))
    writer.write(rows("topic-a", 0, 0, ROWS_PER_BATCH))
    files = writer.close()
    services_a.heartbeats[t.value].stop()  # a long GC pause: no more beats
    time.sleep(0.8)
    cleaner = services_for(path, "filesystem", None, "cleaner", heartbeat_tolerance_s=0.6)
    rolled = clean(HudiTable.open(path), cleaner).rolled_back
    assert [i.time for i in rolled] == [t]
    status = WriteStatus(t.value, "a", rng, tuple(files), ROWS_PER_BATCH, ROWS_PER_BATCH)
    with pytest.raises((HeartbeatExpiredError, LakesinkError)):
        coord_a.complete_batch(t, 0, [rng], [status], schema=writer.avro_schema or "")
    assert not HudiTable.open(path).timeline().completed(Action.COMMIT)
    assert read_with_hudi_rs(str(path)).num_rows == 0
    assert not list(path.rglob("*.parquet"))  # rolled back by markers, nothing left
    ingest(str(path), "w-a", "topic-a", 1, "filesystem", None)
    assert_consistent(path, ["w-a"], ROWS_PER_BATCH)


HOLDER = """
import sys, time
{make}
lease = p.acquire(30)
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("kind", ["filesystem", "postgres"])
def test_lock_holder_killed_then_next_writer_gets_the_lock(
    kind: str, store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # a process holding the table lock is SIGKILLed: a file lease is taken over once it
    # expired, a PostgreSQL advisory lock is freed with the session; the next writer commits
    path = table_uri_in_env(store, tmp_path, request)
    create_table(path)
    dsn = request.getfixturevalue("postgres_dsn") if kind == "postgres" else None
    if kind == "postgres":
        make = (
            "from lakesink.formats.hudi.concurrency.pg_lock import PostgresLockProvider\n"
            f"p = PostgresLockProvider({dsn!r}, {str(path)!r}, 'holder')"
        )
    else:
        make = (
            "from lakesink.formats.hudi.concurrency.lock import FileLockProvider\n"
            f"p = FileLockProvider({str(path)!r}, 'holder', lease_s=1.0)"
        )
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(make=make)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        started = time.monotonic()
        ingest(str(path), "w-b", "topic-b", 2, kind, dsn)
        assert time.monotonic() - started < 20
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(10)
    assert_consistent(path, ["w-b"], 2 * ROWS_PER_BATCH)


UPSERT_DDL = "id INT NOT NULL, seq BIGINT NOT NULL, writer STRING, note STRING"
# Per topic, 50 per batch: 4 batches each, every one over both buckets. A batch's attempt
# conflicts only with a commit of the other writer that completed after the attempt began, so
# with at most 4 commits of the other no batch can lose all its CONFLICT_ATTEMPTS: both
# ingestions end. (Under unbounded contention a loser that keeps beginning its retry after the
# winner began its next batch could lose them all, random pauses between attempts aside: that
# ingestion stops, and its restart resumes.)
# The first batch of each takes seconds longer than the rest (its Python workers start), so
# the two overlap and at least one conflicts.
UPSERT_RECORDS = 200
UPSERT_BATCH = 50
UPSERT_KEYS = 40


def test_two_ingestions_upserting_overlapping_keys_conflict_retry_and_end_as_the_fold_by_seq(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    spark: Any,
) -> None:
    """Two ingestions (writer.id a and b, the filesystem lock) upsert into one Hudi table of 2
    buckets from two topics whose keys overlap; `seq` counts over both topics, so the highest
    wins a key whichever writer lands it. They run at once: a batch that rewrote a bucket the
    other committed meanwhile conflicts and is written again over the other's slice. The table
    (hudi-rs and lakesink's reader) ends as the fold of both topics by key, and each writer's
    committed ranges are contiguous from offset 0 to the end of its partitions."""
    import json
    import logging
    import random
    from concurrent.futures import ThreadPoolExecutor

    from integration.conftest import ingest_config, run_ingestion

    from lakesink.formats.hudi.audit import AuditReport, writer_ranges
    from lakesink.kafka.client import create_topic
    from lakesink.kafka.producer import produce_values
    from lakesink.spark.sink import CONFLICT_ATTEMPTS

    batches = UPSERT_RECORDS // UPSERT_BATCH
    assert batches < CONFLICT_ATTEMPTS  # the bound above: neither writer can exhaust the other
    rng = random.Random(29)
    topics = {"a": topic_factory("upsert-a"), "b": topic_factory("upsert-b")}
    records: dict[str, list[dict[str, Any]]] = {w: [] for w in topics}
    for seq in range(2 * UPSERT_RECORDS):
        writer = "ab"[seq % 2]
        key = rng.randrange(UPSERT_KEYS)
        records[writer].append({"id": key, "seq": seq, "writer": writer, "note": f"{writer}{seq}"})
    table_path = tmp_path / "accounts"
    configs: dict[str, Any] = {}
    for writer, topic in topics.items():
        create_topic(kafka_bootstrap, topic, 2)
        for partition in (0, 1):
            values = [json.dumps(r).encode() for r in records[writer][partition::2]]
            produce_values(kafka_bootstrap, topic, values, partition=partition)
        cfg = ingest_config(
            kafka_bootstrap,
            topic,
            table_path,
            value__schema=UPSERT_DDL,
            write__operation="upsert",
            table__record__key__fields="id",
            table__ordering__field="seq",
            table__bucket__count=2,
            kafka__max__records__per__batch=UPSERT_BATCH,
            writer__id=f"writer-{writer}",
            lock__provider="filesystem",
        )
        configs[writer] = cfg
    # both ingestions in this process, on the session's Spark (two streaming queries)
    retried: list[str] = []

    class Retries(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "writing it again" in record.getMessage():
                retried.append(record.getMessage())

    handler = Retries()
    sink_log = logging.getLogger("lakesink.spark.sink")
    sink_log.addHandler(handler)
    try:
        with ThreadPoolExecutor(2) as pool:
            runs = [pool.submit(run_ingestion, cfg, spark, 300) for cfg in configs.values()]
            for run in runs:
                run.result()
    finally:
        sink_log.removeHandler(handler)
    assert retried, "the two writers never conflicted"

    fold: dict[int, tuple[Any, ...]] = {}
    for r in sorted(records["a"] + records["b"], key=lambda r: r["seq"]):
        fold[r["id"]] = (r["seq"], r["writer"], r["note"])
    table = HudiTable.open(table_path)
    read_rs = read_with_hudi_rs_columns(table_path)
    read_lakesink = TableReader(table).snapshot().to_pylist()
    for name, got in (("hudi-rs", read_rs), ("lakesink", read_lakesink)):
        by_key = {r["id"]: (r["seq"], r["writer"], r["note"]) for r in got}
        assert len(by_key) == len(got), f"{name} reads two rows of one key"
        wrong = sorted(k for k in fold.keys() | by_key.keys() if fold.get(k) != by_key.get(k))
        assert not wrong, (name, {k: (fold.get(k), by_key.get(k)) for k in wrong[:5]})
    for writer, topic in topics.items():
        report = AuditReport("")
        spans = writer_ranges(table, f"writer-{writer}", report)
        assert not report.problems, (writer, report.problems)
        assert report.commits == batches, (writer, report.commits)  # a retry commits once
        ends = {TopicPartition(topic, p): (0, len(records[writer][p::2])) for p in (0, 1)}
        assert spans == ends, (writer, spans)


def read_with_hudi_rs_columns(path: Path) -> list[dict[str, Any]]:
    import hudi

    batches = hudi.HudiTableBuilder.from_base_uri(str(path)).build().read()
    return pa.Table.from_batches(batches).to_pylist() if batches else []
