"""State machine over the table layer and the Coordinator (no Spark, no Kafka), one machine run
over each table format: two writers on one table, each with a Kafka log modelled as offsets, a
Spark checkpoint (planned batches and batch ids) and a Coordinator in a process with fake
services (clock, lock, heartbeats, incarnations).

Random interleavings of produce, begin, write (with failed and duplicate task attempts),
complete, crashes at every commit step (the process dies; a new Coordinator recovers), Spark
replays, deleted checkpoints and a zombie incarnation of the same writer id, over both formats;
over Hudi also stalls past the heartbeat tolerance, crashed lock holders, clean and clustering
(an Iceberg writer has no lock, no heartbeat and no table service in its commit path). After every
step the table is read back and checked against DESIGN.md's invariants: every committed range's
records once, each writer's committed offsets. Hudi: lakesink's reader, hudi-rs every few steps
and at the end. Iceberg: pyiceberg's scan, each writer's offsets in its newest snapshot summary,
no commit id in two snapshots. How each format is driven: property/formats.py.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from property.fakes import Crash, FakeServices, World
from property.formats import FormatUnderTest, HudiUnderTest, IcebergUnderTest

import lakesink.engine.coordinator as coordinator_module
from lakesink.engine.coordinator import Coordinator
from lakesink.engine.schema import TableSchema
from lakesink.errors import (
    CommitConflictError,
    CommitError,
    CorruptTableError,
    FencedError,
    HeartbeatExpiredError,
    LockError,
)
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.iceberg.coordinator import IcebergCoordinator
from lakesink.formats.iceberg.format import IcebergFormat
from lakesink.protocol.commit import Verdict
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets
from lakesink.protocol.write_status import WriteStatus

try:  # table services, if present
    from lakesink.formats.hudi.services.clean import RetainPolicy, clean
    from lakesink.formats.hudi.services.clustering import ClusteringOptions, cluster

    HAVE_SERVICES = True
except ImportError:  # pragma: no cover - built by another engineer
    HAVE_SERVICES = False

WRITERS = ("w1", "w2")
PARTITIONS = 2
MAX_BATCH = 6
# Errors a writer may get when it must not publish (fenced, expired, lock lost or held by a
# dead process, its instant rolled back under it): never anything else, never a publish.
REFUSALS = (FencedError, HeartbeatExpiredError, LockError, CommitError, CorruptTableError)


@dataclass
class Proc:
    """One incarnation of a writer: a Coordinator in a process, and where its batch stands."""

    coordinator: Coordinator
    services: FakeServices
    stage: str = "idle"  # idle | begun | written
    instant: InstantTime | None = None
    batch: tuple[int, tuple[OffsetRange, ...]] | None = None
    statuses: list[WriteStatus] = field(default_factory=list)
    schema: str = ""
    doomed: bool = False  # stalled, fenced or rolled back: it may no longer publish


@dataclass
class WriterModel:
    """A writer's Kafka log, Spark checkpoint and what the table must say about it."""

    writer_id: str
    topic: str
    hw: list[int] = field(default_factory=lambda: [0] * PARTITIONS)
    committed: list[int] = field(default_factory=lambda: [0] * PARTITIONS)
    spark_pos: list[int] = field(default_factory=lambda: [0] * PARTITIONS)
    next_batch_id: int = 0
    pending: tuple[int, tuple[OffsetRange, ...]] | None = None  # planned, not recorded
    history: list[tuple[int, tuple[OffsetRange, ...]]] = field(default_factory=list)
    proc: Proc | None = None
    zombie: Proc | None = None

    def tp(self, p: int) -> TopicPartition:
        return TopicPartition(self.topic, p)


def _rows(topic: str, ranges: tuple[OffsetRange, ...]) -> pa.Table:
    topics, parts, offsets = [], [], []
    for r in ranges:
        for o in range(r.start, r.end):
            topics.append(topic)
            parts.append(r.partition.partition)
            offsets.append(o)
    return pa.table(
        {
            "kafka_topic": pa.array(topics, pa.string()),
            "kafka_partition": pa.array(parts, pa.int32()),
            "kafka_offset": pa.array(offsets, pa.int64()),
            "value": pa.array([f"v{o}" for o in offsets], pa.string()),
        }
    )


def hudi_only(rule_body: object) -> object:
    """A rule about Hudi's lock, heartbeats or table services (no Iceberg writer has them)."""
    return precondition(lambda self: self.side.has_lock_and_heartbeats)(rule_body)


class CoordinatorMachine(RuleBasedStateMachine):
    """The machine over a Hudi table; `IcebergCoordinatorMachine` runs it over Iceberg."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="lakesink-prop-"))
        # from the wall clock: completion times (layout 2) come from it, and must not precede
        # the instant times this fake clock issues
        self.world = World(now_s=time.time())
        self.writers = {w: WriterModel(w, f"topic-{w}") for w in WRITERS}
        self.steps = 0
        self._saved_crash_point = coordinator_module.crash_point
        coordinator_module.crash_point = self.world.crash_point  # type: ignore[assignment]
        self.table: FormatUnderTest | None = None
        self.service_procs = 0

    def teardown(self) -> None:
        try:
            if self.table is not None:
                self.side.check_at_end()
        finally:
            coordinator_module.crash_point = self._saved_crash_point  # type: ignore[assignment]
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- set-up ------------------------------------------------------------------------------

    @initialize(version=st.sampled_from([6, 8]))
    def create_table(self, version: int) -> None:
        """The table (`version`: Hudi's table version; Iceberg has one layout)."""
        self.table = self.make_table(version)

    def make_table(self, version: int) -> FormatUnderTest:
        return HudiUnderTest(self.tmp, version)

    @property
    def side(self) -> FormatUnderTest:
        assert self.table is not None
        return self.table

    @property
    def t(self) -> HudiTable:
        """The Hudi table (for the rules about its lock, heartbeats and services)."""
        assert isinstance(self.table, HudiUnderTest)
        return self.table.table

    def new_proc(self, m: WriterModel) -> Proc:
        services = FakeServices(
            self.world, f"{m.writer_id}#{self.world.incarnations.get(m.writer_id, 0) + 1}"
        )
        return Proc(self.side.coordinator(m.writer_id, services), services)

    def crash(self, m: WriterModel, proc: Proc) -> None:
        proc.services.die()
        if m.proc is proc:
            m.proc = None
        if m.zombie is proc:
            m.zombie = None

    # -- the driving rules -------------------------------------------------------------------

    @rule(w=st.sampled_from(WRITERS), data=st.data())
    def advance(self, w: str, data: st.DataObject) -> None:
        """Move the writer's process 1-8 steps along its batches: start, begin, write, complete
        (with Kafka records arriving before a begin), maybe crashing at a step."""
        for _ in range(data.draw(st.integers(1, 8), "steps")):
            self.step(w, data)

    def step(self, w: str, data: st.DataObject) -> None:
        m = self.writers[w]
        proc = m.proc
        if proc is None:
            self.start(w, data.draw(st.booleans(), "crash in rollback"))
        elif proc.stage == "idle":
            for p in range(PARTITIONS):
                m.hw[p] += data.draw(st.integers(0, 8), f"produce to {p}")
            crash = data.draw(st.sampled_from([None] * 6 + ["before-begin", "after-begin"]))
            self.begin(w, crash)
        elif proc.stage == "begun":
            self.write(
                w,
                data.draw(st.integers(0, 2), "failed attempts"),
                data.draw(st.booleans(), "ranged statuses"),
                data.draw(st.booleans(), "duplicate attempt"),
                zombie=False,
            )
        else:
            crash = data.draw(
                st.sampled_from(
                    [None, None, None, "after-write", "after-reconcile", "after-publish"]
                )
            )
            self.complete(w, crash, data.draw(st.booleans(), "spark records"), zombie=False)

    @precondition(lambda self: any(m.zombie is not None for m in self.writers.values()))
    @rule(data=st.data())
    def advance_zombie(self, data: st.DataObject) -> None:
        """The fenced old incarnation goes on with its batch: it must never publish."""
        m = next(m for m in self.writers.values() if m.zombie is not None)
        assert m.zombie is not None
        if m.zombie.stage == "begun":
            self.write(m.writer_id, data.draw(st.integers(0, 1)), False, False, zombie=True)
        else:
            self.complete(m.writer_id, None, True, zombie=True)

    # -- start / restart ---------------------------------------------------------------------

    def start(self, w: str, crash_in_rollback: bool) -> None:
        """(Re)start the writer's process: claim the writer id, recover its failed instants."""
        m = self.writers[w]
        if m.proc is not None:
            return
        proc = self.new_proc(m)
        self.world.crash_at = "during-rollback" if crash_in_rollback else None
        try:
            proc.coordinator.start()
        except Crash:
            self.crash(m, proc)
            return
        except LockError:
            proc.services.die()  # a dead holder's lease has not run out: start again later
            return
        finally:
            self.world.crash_at = None
        m.proc = proc

    @rule(w=st.sampled_from(WRITERS))
    def delete_checkpoint(self, w: str) -> None:
        """The Spark checkpoint is lost while the writer is down: batch ids restart at 0 and
        planning starts from the offsets the table holds for this writer."""
        m = self.writers[w]
        if m.proc is not None:
            return
        m.pending = None
        m.next_batch_id = 0
        m.spark_pos = list(m.committed)

    # -- one batch ---------------------------------------------------------------------------

    def begin(self, w: str, crash: str | None) -> None:
        m = self.writers[w]
        proc = m.proc
        if proc is None or proc.stage != "idle":
            return
        if m.pending is None:
            ranges = tuple(
                OffsetRange(m.tp(p), m.spark_pos[p], min(m.hw[p], m.spark_pos[p] + MAX_BATCH))
                for p in range(PARTITIONS)
            )
            m.pending = (m.next_batch_id, ranges)
            m.next_batch_id += 1
            m.spark_pos = [r.end for r in ranges]
        batch_id, ranges = m.pending
        self.world.crash_at = crash
        try:
            t = proc.coordinator.begin_batch(batch_id, list(ranges))
        except Crash as c:
            event(f"crash {c}")
            self.crash(m, proc)
            return
        except LockError:
            event("begin: lock held by a dead process")
            assert self.world.lock_holder is not None and not self.world.lock_holder.alive
            self.crash(m, proc)  # the batch fails, Spark restarts the query
            return
        finally:
            self.world.crash_at = None
        if t is None:
            # empty, or a replay of a batch the table already has: Spark records it
            assert all(r.end <= m.committed[r.partition.partition] for r in ranges), (
                "begin() skipped a batch that is not committed",
                ranges,
                m.committed,
            )
            m.pending = None
            return
        assert any(r.end > m.committed[r.partition.partition] for r in ranges)
        proc.stage, proc.instant, proc.batch = "begun", t, m.pending

    def write(
        self, w: str, failed_attempts: int, ranged: bool, duplicate: bool, *, zombie: bool
    ) -> None:
        """Tasks write base files (one task per partition); failed attempts leave orphans."""
        m = self.writers[w]
        proc = m.zombie if zombie else m.proc
        if proc is None or proc.stage != "begun":
            return
        assert proc.instant is not None and proc.batch is not None
        _, ranges = proc.batch
        statuses: list[WriteStatus] = []
        schema = ""
        for task, r in enumerate(ranges):
            if r.is_empty:
                continue
            attempts = failed_attempts + 1 + (1 if duplicate else 0)
            for attempt in range(attempts):
                try:
                    files, written_schema, extra = self.side.write_attempt(
                        proc.coordinator, proc.instant, task, attempt, _rows(m.topic, (r,))
                    )
                except CommitError as e:  # the instant was rolled back under the task (Hudi)
                    assert "rolled back" in str(e), e
                    event("task found its instant rolled back")
                    with contextlib.suppress(*REFUSALS):
                        proc.coordinator.abort(proc.instant)
                    self.crash(m, proc)  # the batch fails; the query stops
                    return
                schema = written_schema or schema
                if attempt < failed_attempts:
                    continue  # this attempt failed after writing: its files are orphans
                statuses.append(
                    WriteStatus(
                        instant_time=proc.instant.value,
                        task_attempt=f"1.{task}.{attempt}",
                        offset_range=r if ranged else None,
                        files=files,
                        records_read=r.span,
                        records_written=sum(f.num_writes for f in files),
                        extra=extra,
                    )
                )
                if not ranged:
                    break  # Spark returns one successful attempt per sink task
        proc.statuses, proc.schema, proc.stage = statuses, schema, "written"

    def complete(self, w: str, crash: str | None, spark_records: bool, *, zombie: bool) -> None:
        m = self.writers[w]
        proc = m.zombie if zombie else m.proc
        if proc is None or proc.stage != "written":
            return
        assert proc.instant is not None and proc.batch is not None
        batch_id, ranges = proc.batch
        self.world.crash_at = crash
        try:
            outcome = proc.coordinator.complete_batch(
                proc.instant,
                batch_id,
                list(ranges),
                proc.statuses,
                TableSchema.from_text(proc.schema),
            )
        except Crash as c:
            event(f"crash {c}")
            if str(c) == "after-publish":
                self.published(m, proc)
            self.crash(m, proc)
            return
        except REFUSALS as e:
            assert proc.doomed or self.may_refuse(proc, e), (
                f"a healthy writer failed to publish: {e!r}"
            )
            event(f"refused {type(e).__name__} (doomed={proc.doomed})")
            with contextlib.suppress(*REFUSALS):  # the sink aborts, then the query fails
                proc.coordinator.abort(proc.instant)
            self.crash(m, proc)
            return
        finally:
            self.world.crash_at = None
        assert not proc.doomed, "a stalled, fenced or rolled-back writer published"
        event("published")
        assert outcome.instant_time == proc.instant
        self.published(m, proc)
        proc.stage, proc.instant, proc.batch, proc.statuses = "idle", None, None, []
        if spark_records and m.proc is proc:
            m.pending = None

    def may_refuse(self, proc: Proc, e: Exception) -> bool:
        """A writer that is not doomed may still be refused: a dead process's lock lease has
        not run out yet, or its own heartbeat is too old (it stalled; nobody rolled it back)."""
        w = self.world
        if isinstance(e, LockError) and w.lock_holder is not None and not w.lock_holder.alive:
            return True
        assert proc.instant is not None
        beat = w.beats.get(proc.instant.value)
        stale = beat is None or w.now_s - beat[1] > w.heartbeat_tolerance_s - w.heartbeat_margin_s
        return isinstance(e, HeartbeatExpiredError) and stale

    def published(self, m: WriterModel, proc: Proc) -> None:
        assert proc.batch is not None
        _, ranges = proc.batch
        for r in ranges:
            p = r.partition.partition
            if not r.is_empty:
                assert m.committed[p] == r.start, (m.committed, ranges)
                m.committed[p] = r.end
        m.history.append(proc.batch)

    @rule(w=st.sampled_from(WRITERS), data=st.data())
    def replay_committed_batch(self, w: str, data: st.DataObject) -> None:
        """Spark replays a batch the table already has (any earlier one): nothing is begun."""
        m = self.writers[w]
        if m.proc is None or m.proc.stage != "idle" or not m.history:
            return
        batch_id, ranges = data.draw(st.sampled_from(m.history))
        reuse_id = data.draw(st.booleans())
        event("replayed a committed batch")
        assert m.proc.coordinator.begin_batch(batch_id if reuse_id else 0, list(ranges)) is None

    # -- zombies, stalls, dead lock holders --------------------------------------------------

    @rule(w=st.sampled_from(WRITERS))
    def second_incarnation(self, w: str) -> None:
        """The same writer id starts again while the old process still runs (mid-batch): the
        new one fences the old and rolls its instant back; the old one must never publish."""
        m = self.writers[w]
        old = m.proc
        if old is None or old.stage == "idle" or m.zombie is not None:
            return
        new = self.new_proc(m)
        try:
            new.coordinator.start()
        except LockError:
            new.services.die()
            return
        old.doomed = True
        event("second incarnation fenced the first")
        m.zombie, m.proc = old, new

    @hudi_only
    @rule(w=st.sampled_from(WRITERS), seconds=st.floats(11, 60))
    def stall(self, w: str, seconds: float) -> None:
        """The writer's process is paused past the heartbeat tolerance while others go on; when
        it resumes it beats again, but another writer may have rolled its instant back."""
        m = self.writers[w]
        if m.proc is None:
            return
        self.world.advance(seconds, stalled=frozenset({id(m.proc.services)}))

    @rule(seconds=st.floats(0.1, 8))
    def tick(self, seconds: float) -> None:
        """Time passes for everybody alive (dead lock holders' leases run out)."""
        self.world.advance(seconds)

    @hudi_only
    @rule(w=st.sampled_from(WRITERS))
    def crash_holding_the_lock(self, w: str) -> None:
        """The process dies right after taking the lock (its lease stays until it expires)."""
        m = self.writers[w]
        proc = m.proc
        if proc is None or self.world.lock_holder is not None:
            return
        try:
            with proc.services.locked(self.t):
                raise Crash("holding the lock")
        except Crash:
            self.crash(m, proc)

    # -- table services ----------------------------------------------------------------------

    @hudi_only
    @precondition(lambda self: HAVE_SERVICES)
    @rule(retain=st.integers(1, 3))
    def run_clean(self, retain: int) -> None:
        services = self.service_process("cleaner")
        try:
            result = clean(self.t, services, RetainPolicy(commits=retain))
            done = "cleaned" if result.instant else "nothing"
            event(f"clean: {done}, rolled back {len(result.rolled_back)}")
        except LockError:
            assert self.world.lock_holder is not None and not self.world.lock_holder.alive
        finally:
            services.die()
        self.doom_rolled_back()

    @hudi_only
    @precondition(lambda self: HAVE_SERVICES)
    @rule()
    def run_clustering(self) -> None:
        services = self.service_process("clusterer")
        try:
            result = cluster(
                self.t, services, ClusteringOptions(small_file_bytes=1 << 30, min_files=2)
            )
            event(f"clustering: {'replaced' if result.instant else 'nothing'}")
        except LockError:
            assert self.world.lock_holder is not None and not self.world.lock_holder.alive
        except CommitConflictError:
            event("clustering lost a conflict (rolled back)")
        finally:
            services.die()

    def service_process(self, name: str) -> FakeServices:
        """A table-services process (its own id, so it fences no writer)."""
        services = FakeServices(self.world, f"{name}{self.service_procs}")
        services.claim(self.t, f"services-{self.service_procs}")
        self.service_procs += 1
        return services

    def doom_rolled_back(self) -> None:
        """Writers whose instant a lazy rollback removed may no longer publish."""
        live = self.side.live_instants()
        if live is None:
            return
        for m in self.writers.values():
            for proc in (m.proc, m.zombie):
                if proc is not None and proc.instant is not None and proc.instant not in live:
                    proc.doomed = True

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def table_holds_committed_ranges_exactly_once(self) -> None:
        if self.table is None:
            return
        self.doom_rolled_back()
        coords = self.read_coordinates()
        assert len(coords) == len(set(coords)), "duplicate rows"
        expected = {
            (m.topic, p, o)
            for m in self.writers.values()
            for p in range(PARTITIONS)
            for o in range(m.committed[p])
        }
        assert set(coords) == expected, (
            f"missing {sorted(expected - set(coords))[:5]}, "
            f"extra {sorted(set(coords) - expected)[:5]}"
        )
        for m in self.writers.values():
            offsets = self.side.committed_offsets(m.writer_id)
            want = WriterOffsets({m.tp(p): e for p, e in enumerate(m.committed) if e > 0})
            got = WriterOffsets({tp: e for tp, e in offsets.next_offsets.items() if e > 0})
            assert got == want, (m.writer_id, got, want)
        self.steps += 1
        self.side.check_commits(WRITERS, self.steps)

    def read_coordinates(self) -> list[tuple[str, int, int]]:
        return self.side.read_coordinates()


class IcebergCoordinatorMachine(CoordinatorMachine):
    """The same machine over an Iceberg table (its Hudi-only rules never run)."""

    def make_table(self, version: int) -> FormatUnderTest:
        return IcebergUnderTest(self.tmp, self.world)


MACHINES: dict[str, type[CoordinatorMachine]] = {
    "hudi": CoordinatorMachine,
    "iceberg": IcebergCoordinatorMachine,
}
SETTINGS = {
    "hudi": settings(
        max_examples=30,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    ),
    # each Iceberg commit writes a manifest, a manifest list and the table metadata: fewer
    # examples keep the run near 30 s
    "iceberg": settings(
        max_examples=15,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    ),
}


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.parametrize("table_format", ["hudi", "iceberg"])
def test_coordinator_state_machine(table_format: str) -> None:
    run_state_machine_as_test(MACHINES[table_format], settings=SETTINGS[table_format])


def test_iceberg_writers_beginning_in_one_millisecond_each_commit_their_own_rows(
    tmp_path: Path,
) -> None:
    """Two writers begin their batches in the same millisecond, so their transactions share an
    id: each batch must still land once, with its own rows (a transaction is published only by
    its own writer's snapshot, and task files carry a per-transaction token)."""
    world = World(now_s=1_700_000_000.0)
    side = IcebergUnderTest(tmp_path, world)
    batches = {}
    for w in WRITERS:
        fmt = IcebergFormat(side.open_table(), clock_ms=world.now_ms)  # lakesink's own ids
        coordinator = IcebergCoordinator(fmt, w, query_id="q")
        coordinator.start()
        r = OffsetRange(TopicPartition(f"topic-{w}", 0), 0, 3)
        t = coordinator.begin_batch(0, [r])
        assert t is not None
        batches[w] = (coordinator, t, r)
    for w, (coordinator, t, r) in batches.items():
        files, _, extra = side.write_attempt(coordinator, t, 0, 0, _rows(f"topic-{w}", (r,)))
        status = WriteStatus(t.value, "1.0.0", r, files, r.span, r.span, extra=extra)
        coordinator.complete_batch(t, 0, [r], [status], TableSchema())
    expected = {(f"topic-{w}", 0, o) for w in WRITERS for o in range(3)}
    assert sorted(side.read_coordinates()) == sorted(expected)
    for w in WRITERS:
        assert side.committed_offsets(w) == WriterOffsets({TopicPartition(f"topic-{w}", 0): 3})


def test_iceberg_writer_restarted_never_begins_its_published_transaction_id_again(
    tmp_path: Path,
) -> None:
    """The clock that issues transaction ids runs ahead of the snapshots' times (the id came
    from another host's clock, or before a clock step) and stands still: each restarted
    process of the writer still begins past the id its published snapshot carries, so no
    snapshot is taken for a new transaction and each batch lands once."""
    world = World(now_s=time.time() + 3600)  # ids an hour past the snapshots' times
    side = IcebergUnderTest(tmp_path, world)
    tp = TopicPartition("topic-w1", 0)
    begun = []
    for batch_id, r in enumerate((OffsetRange(tp, 0, 3), OffsetRange(tp, 3, 5))):
        coordinator = side.coordinator("w1", FakeServices(world, f"w1#{batch_id + 1}"))
        coordinator.start()  # a new process: it has issued no id yet
        t = coordinator.begin_batch(batch_id, [r])
        assert t is not None
        begun.append(t)
        files, _, extra = side.write_attempt(coordinator, t, 0, 0, _rows(tp.topic, (r,)))
        status = WriteStatus(t.value, "1.0.0", r, files, r.span, r.span, extra=extra)
        outcome = coordinator.complete_batch(t, batch_id, [r], [status], TableSchema())
        assert outcome.verdict is Verdict.PUBLISH and outcome.records == r.span, outcome
    assert begun[0] < begun[1]
    side.check_commits(("w1",), 0)
    assert sorted(side.read_coordinates()) == [(tp.topic, 0, o) for o in range(5)]
    assert side.committed_offsets("w1") == WriterOffsets({tp: 5})
