"""The commit coordinator: one per streaming query, living in the Spark driver's Python process.

It is the seeds' coordinator with Spark's micro-batch boundary as END-COMMIT: it begins an instant
before tasks write (START-COMMIT), collects their write statuses (WRITE-STATUS), reconciles the
files on storage against them, and publishes the completed instant with the writer's offsets
(ACK-COMMIT) — all before Spark records the batch. It imports no Spark, so the crash and replay
logic is testable on its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lakesink.errors import CommitError, CorruptTableError
from lakesink.faults import crash_point
from lakesink.metrics import IngestionMetrics
from lakesink.protocol.commit import Verdict, classify_batch, decide
from lakesink.protocol.instant import Action, Instant, InstantTime, State
from lakesink.protocol.offsets import OffsetRange, WriterOffsets
from lakesink.protocol.write_status import WriteStatus
from lakesink.services.conflict_check import check_ingestion_commit, strategy_for
from lakesink.spark import commit_state as keys
from lakesink.storage import StorageError
from lakesink.table.archive import is_archived_completed
from lakesink.table.hudi_table import HudiTable
from lakesink.table.markers import delete_markers, list_marked_files
from lakesink.table.metadata import CommitMetadata
from lakesink.table.rollback import delete_leftovers, rollback

log = logging.getLogger(__name__)

INTENTS_DIR = Path(".hoodie") / ".lakesink" / "intents"


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What the coordinator did with one batch."""

    batch_id: int
    verdict: Verdict
    instant_time: InstantTime | None = None
    records: int = 0
    files: int = 0
    publish_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PreparedCommit:
    """A batch whose files are reconciled and whose metadata is final, ready to publish."""

    instant_time: InstantTime
    batch_id: int
    metadata: CommitMetadata
    base_offsets: WriterOffsets  # the writer's committed offsets this commit builds on
    next_offsets: WriterOffsets
    records: int
    files: int


class Coordinator:
    """Begins, reconciles and publishes the instants of one writer on one table."""

    def __init__(
        self,
        table: HudiTable,
        writer_id: str,
        *,
        query_id: str = "",
        services: CommitServices,
    ) -> None:
        self.table = table
        self.writer_id = writer_id
        self.query_id = query_id
        self.services = services
        self.publish_delay_s = 0.0  # commit.publish.delay.s: models slow commits in benchmarks
        # kafka.fail.on.data.loss=false: a batch may start past the committed position, over
        # records deleted before they were read; the commit records the span it skipped
        self.allow_data_loss = False
        # Kafka's id of each topic, recorded with the offsets: a re-created topic is told apart
        self.topic_ids: Callable[[Iterable[str]], Mapping[str, str]] | None = None
        # Where commit latency, lock waits and rollbacks are recorded (None: nowhere)
        self.metrics: IngestionMetrics | None = None
        self._committed: WriterOffsets | None = None

    # --- start-up ----------------------------------------------------------------------------
    def start(self, keep: frozenset[InstantTime] = frozenset()) -> None:
        """Claim this writer id (fencing older incarnations) and roll back its failed instants
        (except those in `keep`: pre-committed epochs the async committer publishes)."""
        self.services.claim(self.table, self.writer_id)
        self.recover(keep)

    def recover(self, keep: frozenset[InstantTime] = frozenset()) -> list[Instant]:
        """Roll back this writer's unfinished instants, and other writers' whose heartbeat
        expired — except those in `keep` and others' pre-committed ones (published later)."""
        rolled: list[Instant] = []
        for instant in self.table.timeline().inflight_or_requested():
            if not instant.action.writes_data or instant.time in keep:
                continue
            owner = self._intent_owner(instant.time)
            if owner != self.writer_id and self.is_precommitted(instant.time):
                continue
            if owner == self.writer_id or self.services.heartbeat_expired(self.table, instant.time):
                # Under the lock, checked again: a publisher holds the lock from its liveness
                # check to its completed file, so no instant completes while its files go.
                with self._locked():
                    current = self.table.timeline().get(instant.time)
                    if current is None or current.is_completed:
                        continue
                    if owner != self.writer_id and not self.services.heartbeat_expired(
                        self.table, instant.time
                    ):
                        continue  # its writer resumed and beat again
                    log.warning(
                        "table %s: rolling back instant %s of writer %s (writer %s recovering)",
                        self.table.config.name,
                        instant.time,
                        owner,
                        self.writer_id,
                    )
                    crash_point("during-rollback")
                    rollback(self.table, current)
                    self.table.storage.delete(self._intent_key(instant.time))
                    rolled.append(instant)
        if rolled and self.metrics is not None:
            self.metrics.record_rollback("recovery", len(rolled))
        self._committed = None
        return rolled

    @property
    def committed(self) -> WriterOffsets:
        if self._committed is None:
            self._committed = keys.committed_offsets(self.table, self.writer_id)
        return self._committed

    def _base_for(
        self, ranges: Sequence[OffsetRange], *, warn: bool = False
    ) -> tuple[WriterOffsets, tuple[OffsetRange, ...]]:
        """The committed offsets a batch builds on, and the spans it skips. Only with
        `allow_data_loss` may a range start past the committed position (the source moved over
        records deleted before they were read): the base then moves to the range's start and the
        span in between is returned, to be recorded in the commit."""
        committed = self.committed
        if not self.allow_data_loss:
            return committed, ()
        skipped = tuple(
            OffsetRange(r.partition, pos, r.start)
            for r in ranges
            if (pos := committed.get(r.partition)) is not None and r.start > pos
        )
        if not skipped:
            return committed, ()
        for span in skipped if warn else ():
            log.warning(
                "table %s writer %s: skipping %d offsets of %s [%d, %d): deleted from Kafka "
                "before they were read (kafka.fail.on.data.loss=false)",
                self.table.config.name,
                self.writer_id,
                span.end - span.start,
                span.partition,
                span.start,
                span.end,
            )
        moved = dict(committed.next_offsets)
        moved.update({span.partition: span.end for span in skipped})
        return WriterOffsets(moved), skipped

    # --- one batch ---------------------------------------------------------------------------
    def begin(self, batch_id: int, ranges: Sequence[OffsetRange]) -> InstantTime | None:
        """Start an instant for a new batch; None when the batch is empty or already committed."""
        verdict = classify_batch(self._base_for(ranges)[0], ranges)
        if verdict is not Verdict.PUBLISH:
            log.info(
                "table %s writer %s: batch %s %s, nothing to write",
                self.table.config.name,
                self.writer_id,
                batch_id,
                verdict.value,
            )
            return None
        crash_point("before-begin")
        with self._locked():
            t = self.services.next_instant_time(self.table)
            self._write_intent(t, batch_id, ranges)
            # Beat first: an instant without a heartbeat counts as failed to other writers.
            self.services.start_heartbeat(self.table, t)
            self.table.timeline().begin(Action.COMMIT, t)
        crash_point("after-begin")
        log.info(
            "table %s writer %s: batch %s began instant %s",
            self.table.config.name,
            self.writer_id,
            batch_id,
            t,
        )
        return t

    def complete(
        self,
        instant_time: InstantTime,
        batch_id: int,
        ranges: Sequence[OffsetRange],
        statuses: Sequence[WriteStatus],
        schema: str,
    ) -> BatchOutcome:
        """Reconcile files with statuses, then publish the instant under the lock (sync mode)."""
        prepared = self.prepare(instant_time, batch_id, ranges, statuses, schema)
        outcome = self.publish(prepared)
        self._committed = prepared.next_offsets
        if outcome.verdict is Verdict.PUBLISH:
            from lakesink.services.inline import after_commit

            after_commit(self.table, self.services, instant_time)
        return outcome

    def prepare(
        self,
        instant_time: InstantTime,
        batch_id: int,
        ranges: Sequence[OffsetRange],
        statuses: Sequence[WriteStatus],
        schema: str,
    ) -> PreparedCommit:
        """Everything a publish needs, with storage already reconciled (orphans deleted):
        the pre-commit of the two-phase commit."""
        crash_point("after-write")
        base, skipped = self._base_for(ranges, warn=True)
        decision = decide(base, ranges, statuses)
        ids = (
            self.topic_ids({tp.topic for tp in decision.next_offsets})
            if self.topic_ids is not None and decision.next_offsets.next_offsets
            else {}
        )
        kept = self._reconcile(instant_time, decision.statuses)
        crash_point("after-reconcile")
        metadata = CommitMetadata(
            operation_type="INSERT",
            writes=tuple(f for s in decision.statuses for f in s.files),
            replaced_file_ids={},
            schema=schema,
            extra={
                keys.WRITER_ID_KEY: self.writer_id,
                keys.QUERY_ID_KEY: self.query_id,
                keys.BATCH_ID_KEY: str(batch_id),
                keys.COMMIT_ID_KEY: str(uuid.uuid4()),
                keys.OFFSETS_KEY: json.dumps(decision.next_offsets.to_json()),
                keys.RANGES_KEY: json.dumps(
                    [[r.partition.key(), r.start, r.end] for r in ranges if not r.is_empty]
                ),
                **(
                    {
                        keys.SKIPPED_KEY: json.dumps(
                            [[r.partition.key(), r.start, r.end] for r in skipped]
                        )
                    }
                    if skipped
                    else {}
                ),
                **({keys.TOPIC_IDS_KEY: json.dumps(dict(sorted(ids.items())))} if ids else {}),
            },
        )
        return PreparedCommit(
            instant_time=instant_time,
            batch_id=batch_id,
            metadata=metadata,
            base_offsets=self.committed,
            next_offsets=decision.next_offsets,
            records=sum(s.records_written for s in decision.statuses),
            files=len(kept),
        )

    def publish(self, prepared: PreparedCommit) -> BatchOutcome:
        """Publish a prepared commit under the lock: the commit of the two-phase commit.
        Idempotent: a commit already on the timeline (same instant) is not published twice."""
        t = prepared.instant_time
        started = time.perf_counter()
        if self.publish_delay_s:
            time.sleep(self.publish_delay_s)  # commit.publish.delay.s: benchmarks only
        with self._locked():
            timeline = self.table.timeline()
            existing = timeline.get(t)
            if (existing is not None and existing.is_completed) or (
                existing is None and is_archived_completed(self.table.storage, t)
            ):
                log.info("table %s: instant %s is already published", self.table.config.name, t)
                return BatchOutcome(prepared.batch_id, Verdict.ALREADY_COMMITTED, t)
            self.services.check_alive(self.table, t)
            fresh = keys.committed_offsets(self.table, self.writer_id, timeline)
            if fresh != prepared.base_offsets:
                raise CommitError(
                    f"writer {self.writer_id}'s committed offsets changed under instant {t} "
                    f"(expected {prepared.base_offsets.to_json()}, found {fresh.to_json()}); "
                    "another incarnation of this writer is running"
                )
            self._check_conflicts(t, {w.path for w in prepared.metadata.writes})
            instant = Instant(t, Action.COMMIT, State.INFLIGHT)
            timeline.publish(instant, prepared.metadata, snapshot_is_fresh=True)  # under the lock
        publish_s = time.perf_counter() - started
        if self.metrics is not None:
            self.metrics.record_commit(publish_s, time.time())
        crash_point("after-publish")
        self.services.stop_heartbeat(self.table, t)
        delete_markers(self.table.storage, t.value)
        self.table.storage.delete_many([self._intent_key(t), self._precommitted_key(t)])
        log.info(
            "table %s writer %s: published instant %s (batch %s, %d records, %d files, %.3fs)",
            self.table.config.name,
            self.writer_id,
            t,
            prepared.batch_id,
            prepared.records,
            prepared.files,
            publish_s,
        )
        return BatchOutcome(
            prepared.batch_id, Verdict.PUBLISH, t, prepared.records, prepared.files, publish_s
        )

    def mark_precommitted(self, t: InstantTime) -> None:
        """Tell other writers' lazy rollback that instant `t` is durably pre-committed: its owner
        publishes it at restart, so it must not be rolled back even if its heartbeat expires."""
        self.table.storage.write(self._precommitted_key(t), b"")

    def is_precommitted(self, t: InstantTime) -> bool:
        return self.table.storage.exists(self._precommitted_key(t))

    def accept_offsets(self, offsets: WriterOffsets) -> None:
        """Positions after a pre-committed (not yet published) batch, for replay detection."""
        self._committed = offsets

    def abort(self, instant_time: InstantTime) -> None:
        """Roll back an instant whose batch failed (best effort; recovery repeats it)."""
        self.services.stop_heartbeat(self.table, instant_time)
        for instant in self.table.timeline().inflight_or_requested():
            if instant.time == instant_time:
                rollback(self.table, instant)
                if self.metrics is not None:
                    self.metrics.record_rollback("batch_failed")
        if self.table.timeline().get(instant_time) is None:
            delete_leftovers(self.table, instant_time)  # rolled back under us: files are garbage
        self.table.storage.delete(self._intent_key(instant_time))

    # --- helpers -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[Any]:
        """The table lock, the time waited for it recorded in the metrics."""
        started = time.perf_counter()
        with self.services.locked(self.table) as lease:
            if self.metrics is not None:
                self.metrics.record_lock_wait(time.perf_counter() - started)
            yield lease

    def _reconcile(self, t: InstantTime, accepted: Sequence[WriteStatus]) -> set[str]:
        """Delete files of failed or duplicate task attempts (marked but in no accepted status)
        BEFORE publishing: hudi-rs would read them as part of the instant."""
        kept = {f.path for s in accepted for f in s.files}
        marked = set(list_marked_files(self.table.storage, t.value))
        missing = kept - marked
        if missing:
            raise CommitError(
                f"instant {t}: files {sorted(missing)[:3]} are in write statuses but have no marker"
            )
        for rel in sorted(marked - kept):
            log.info("table %s instant %s: deleting orphan file %s", self.table.config.name, t, rel)
            self.table.storage.delete(rel)
        for rel in kept:
            if not self.table.storage.exists(rel):
                raise CorruptTableError(f"instant {t}: written file {rel} is missing on storage")
        return kept

    def _check_conflicts(self, t: InstantTime, files: set[str]) -> None:
        """The configured conflict strategy (lakesink.protocol.conflicts) decides: this
        instant's file groups against instants completed since it began and pending ones."""
        check_ingestion_commit(
            self.table, t, files, strategy_for(self.services), writer=self.writer_id
        )

    def _intent_key(self, t: InstantTime) -> str:
        return f"{INTENTS_DIR}/{t.value}.json"

    def _precommitted_key(self, t: InstantTime) -> str:
        return f"{INTENTS_DIR}/{t.value}.precommitted"

    def _write_intent(self, t: InstantTime, batch_id: int, ranges: Sequence[OffsetRange]) -> None:
        self.table.storage.write(
            self._intent_key(t),
            json.dumps(
                {
                    "writer_id": self.writer_id,
                    "query_id": self.query_id,
                    "batch_id": batch_id,
                    "ranges": [[r.partition.key(), r.start, r.end] for r in ranges],
                }
            ).encode(),
        )

    def _intent_owner(self, t: InstantTime) -> str | None:
        try:
            data: dict[str, Any] = json.loads(self.table.storage.read(self._intent_key(t)))
        except (OSError, ValueError, StorageError):
            return None
        owner = data.get("writer_id")
        return str(owner) if owner is not None else None


class CommitServices:
    """Locks, instant times, heartbeats and fencing as the coordinator needs them. The default
    is a single writer with no lock; `lakesink.spark.services_factory` builds the real ones."""

    def __init__(self, clock_ms: Callable[[], int] | None = None) -> None:
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))

    def claim(self, table: HudiTable, writer_id: str) -> None:
        """Become the only live incarnation of `writer_id`."""

    def locked(self, table: HudiTable) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def next_instant_time(self, table: HudiTable) -> InstantTime:
        instants = table.timeline().instants
        latest = max((i.time.to_epoch_ms() for i in instants), default=0)
        return InstantTime.from_epoch_ms(max(self._clock_ms(), latest + 1))

    def start_heartbeat(self, table: HudiTable, t: InstantTime) -> None:
        """Begin proving this writer is alive while instant `t` is inflight."""

    def stop_heartbeat(self, table: HudiTable, t: InstantTime) -> None:
        """Stop the heartbeat of instant `t`."""

    def heartbeat_expired(self, table: HudiTable, t: InstantTime) -> bool:
        return False

    def check_alive(self, table: HudiTable, t: InstantTime) -> None:
        """Raise if this writer lost its lease, heartbeat or incarnation: it must not publish."""
