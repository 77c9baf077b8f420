"""The commit coordinator: one per streaming query, living in the Spark driver's Python process.

It is the seeds' coordinator with Spark's micro-batch boundary as END-COMMIT: it begins an instant
before tasks write (START-COMMIT), collects their write statuses (WRITE-STATUS), reconciles the
files on storage against them, and publishes the completed instant with the writer's offsets
(ACK-COMMIT) — all before Spark records the batch. It imports no Spark and no format (each
format's subclass adds what it keeps beside its commits: lakesink.formats.hudi.coordinator,
lakesink.formats.iceberg.coordinator), so the crash and replay logic is testable on its own.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lakesink.engine import writer_state as keys
from lakesink.engine.batch_state import BatchState, OpenBatch
from lakesink.engine.change import TableChange
from lakesink.engine.format import CommitControl, TableFormat
from lakesink.engine.requirements import (
    NoConflicts,
    OffsetsUnchanged,
    Requirement,
    WriterStillLive,
)
from lakesink.engine.schema import TableSchema
from lakesink.engine.services import ServicesRunner
from lakesink.engine.transaction import PostCommitHook, TableTransaction, TxState
from lakesink.errors import InternalError
from lakesink.faults import crash_point
from lakesink.metrics import IngestionMetrics
from lakesink.protocol.commit import Verdict, classify_batch, decide
from lakesink.protocol.conflicts import (
    ConflictStrategy,
    FileGroupOverlap,
    Operation,
    OperationKind,
    Phase,
)
from lakesink.protocol.instant import Action, Instant, InstantTime
from lakesink.protocol.offsets import OffsetRange, WriterOffsets
from lakesink.protocol.write_status import WriteStatus

log = logging.getLogger(__name__)

__all__ = ["BatchOutcome", "Coordinator", "PreparedCommit"]


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What the coordinator did with one batch."""

    batch_id: int
    verdict: Verdict
    instant_time: InstantTime | None = None
    records: int = 0
    files: int = 0
    publish_s: float = 0.0
    published_at: float = 0.0  # time.time() when it was published (0: not known here)


@dataclass(frozen=True, slots=True)
class PreparedCommit:
    """A batch whose files are reconciled and whose metadata is final, ready to publish."""

    instant_time: InstantTime
    batch_id: int
    metadata: TableChange
    base_offsets: WriterOffsets  # the writer's committed offsets this commit builds on
    next_offsets: WriterOffsets
    records: int
    files: int
    # The format's descriptions of the files the commit adds, for a publish from another
    # process (Iceberg: `DataFileDescription.to_json()`); empty for Hudi, whose metadata
    # names its files.
    data_files: tuple[Mapping[str, Any], ...] = ()
    # What the commit replaces, for a publish from another process (Iceberg tables of keys:
    # the tasks' reports of the files they read, replaced or deleted rows of, per bucket);
    # empty for appends.
    rewrite: tuple[Mapping[str, Any], ...] = ()


class Coordinator:
    """One writer on one table: a `TableTransaction` per batch (lakesink.engine.transaction),
    begun before its tasks write and committed with the writer's requirements after.

    What a format keeps beside its commits is the subclass's (Hudi's intents, recovery and
    pre-commit marks: lakesink.formats.hudi.coordinator); by default nothing durable precedes a
    commit, so there is nothing to recover and pre-commits are remembered in this process.
    Each batch it holds is an `OpenBatch` (lakesink.engine.batch_state): its transaction and
    its checked state."""

    def __init__(
        self,
        table_format: TableFormat,
        writer_id: str,
        *,
        query_id: str = "",
        control: CommitControl,
        conflict_strategy: ConflictStrategy | None = None,
        publish_delay_s: float = 0.0,
        allow_data_loss: bool = False,
        topic_ids: Callable[[Iterable[str]], Mapping[str, str]] | None = None,
        metrics: IngestionMetrics | None = None,
        post_commit: Sequence[PostCommitHook] = (),
    ) -> None:
        self.format: TableFormat = table_format  # the table, as the format it commits in
        self.writer_id = writer_id
        self.query_id = query_id
        self.control = control
        # table.services.conflict.strategy: the rules a commit is checked with
        self.conflict_strategy: ConflictStrategy = conflict_strategy or FileGroupOverlap()
        self.publish_delay_s = publish_delay_s  # commit.publish.delay.s: slow commits in benchmarks
        # kafka.fail.on.data.loss=false: a batch may start past the committed position, over
        # records deleted before they were read; the commit records the span it skipped
        self.allow_data_loss = allow_data_loss
        # Kafka's id of each topic, recorded with the offsets: a re-created topic is told apart
        self.topic_ids = topic_ids
        # Where commit latency, lock waits and rollbacks are recorded (None: nowhere)
        self.metrics = metrics
        # Run after each published commit (inline table services, handed in by the pipeline)
        self.post_commit: tuple[PostCommitHook, ...] = tuple(post_commit)
        # table.services.run=beside: the thread the hooks hand the due services to (the
        # plugin sets it with the hooks; None: they run in the hook, before the next batch)
        self.services: ServicesRunner | None = None
        # What the commits say they did (Hudi's operationType): INSERT for appends, UPSERT
        # when the table's rows change by key (the plugin sets it from the table's config)
        self.operation_type = "INSERT"
        # The action a batch's instant is (Hudi: a deltacommit on a merge-on-read table; the
        # plugin sets it from the table's config)
        self.action = Action.COMMIT
        self._committed: WriterOffsets | None = None
        # the batches begun or pre-committed and not yet over, by instant time; the writer's
        # thread adds them, the async committer's thread ends them (one dict operation each)
        self._batches: dict[str, OpenBatch] = {}

    @property
    def name(self) -> str:
        """The table's name, for logs."""
        return self.format.name

    def _transaction_format(self) -> TableFormat:
        """The format a new transaction commits through (the coordinator's own by default)."""
        return self.format

    def _new_transaction(self) -> TableTransaction:
        return TableTransaction(
            self._transaction_format(),
            self.control,
            writer_id=self.writer_id,
            action=self.action,
            metrics=self.metrics,
            crash=self._crash,
        )

    def _resumed_transaction(self, t: InstantTime, state: TxState) -> TableTransaction:
        return TableTransaction.resume(
            self._transaction_format(),
            self.control,
            t,
            writer_id=self.writer_id,
            state=state,
            action=self.action,
            metrics=self.metrics,
            crash=self._crash,
        )

    def _side_files(self, t: InstantTime) -> list[str]:
        """lakesink's files beside instant `t`, deleted when its transaction ends (none by
        default)."""
        return []

    def _batch(self, t: InstantTime, *, unknown: BatchState) -> OpenBatch:
        """The batch of instant `t`: the one this coordinator holds, else one taken up in
        state `unknown` (PRECOMMITTED: an epoch pre-committed before a restart; BEGUN: an
        instant another coordinator object began), with a resumed transaction."""
        batch = self._batches.get(t.value)
        if batch is None:
            tx_state = TxState.STAGED if unknown is BatchState.PRECOMMITTED else TxState.ACTIVE
            batch = OpenBatch(t, self._resumed_transaction(t, tx_state), unknown)
            self._batches[t.value] = batch
        return batch

    def _transaction(self, batch: OpenBatch, *, hooks: bool = False) -> TableTransaction:
        tx = batch.transaction
        tx.hooks = self.post_commit if hooks else ()
        tx.side_files = self._side_files(batch.instant_time)
        return tx

    def _end(self, batch: OpenBatch, state: BatchState) -> None:
        """The batch is over (published or aborted): its record goes."""
        batch.move(state)
        self._batches.pop(batch.instant_time.value, None)

    def batch_state(self, t: InstantTime) -> BatchState | None:
        """Where the batch of instant `t` is, if this coordinator holds it (None: it never
        did, or the batch is over)."""
        batch = self._batches.get(t.value)
        return batch.state if batch is not None else None

    # --- start-up ----------------------------------------------------------------------------
    def start(self, keep: frozenset[InstantTime] = frozenset()) -> None:
        """Fence older incarnations of this writer id (the subclass's), then recover."""
        self.recover(keep)

    def recover(self, keep: frozenset[InstantTime] = frozenset()) -> list[Instant]:
        """Roll back this writer's unfinished commits except those in `keep` (pre-committed
        epochs the async committer publishes); by default none are durable: nothing to do."""
        self._committed = None
        return []

    @property
    def committed(self) -> WriterOffsets:
        """The offsets the writer's batches build on (pre-committed batches included)."""
        if self._committed is None:
            self._committed = self.format.committed_offsets(self.writer_id)
        return self._committed

    def table_offsets(self) -> WriterOffsets:
        """The writer's committed offsets as the table holds them now (read afresh, unlike
        `committed`, which includes pre-committed batches)."""
        return self.format.committed_offsets(self.writer_id)

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
                self.name,
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
    def begin_batch(self, batch_id: int, ranges: Sequence[OffsetRange]) -> InstantTime | None:
        """Begin the transaction of a new batch; None when the batch is empty or already
        committed (a replay)."""
        verdict = classify_batch(self._base_for(ranges)[0], ranges)
        if verdict is not Verdict.PUBLISH:
            log.info(
                "table %s writer %s: batch %s %s, nothing to write",
                self.name,
                self.writer_id,
                batch_id,
                verdict.value,
            )
            return None
        tx = self._new_transaction()
        t = tx.begin(intent=lambda t: self._write_intent(t, batch_id, ranges))
        self._batches[t.value] = OpenBatch(t, tx)
        log.info(
            "table %s writer %s: batch %s began instant %s",
            self.name,
            self.writer_id,
            batch_id,
            t,
        )
        return t

    def complete_batch(
        self,
        instant_time: InstantTime,
        batch_id: int,
        ranges: Sequence[OffsetRange],
        statuses: Sequence[WriteStatus],
        schema: TableSchema,
        *,
        lost: Sequence[OffsetRange] = (),
    ) -> BatchOutcome:
        """Pre-commit, then commit at once (sync mode)."""
        prepared = self.precommit(instant_time, batch_id, ranges, statuses, schema, lost=lost)
        outcome = self.commit(prepared)
        self._committed = prepared.next_offsets
        return outcome

    def precommit(
        self,
        instant_time: InstantTime,
        batch_id: int,
        ranges: Sequence[OffsetRange],
        statuses: Sequence[WriteStatus],
        schema: TableSchema,
        *,
        lost: Sequence[OffsetRange] = (),
    ) -> PreparedCommit:
        """The pre-commit of the two-phase commit: storage reconciled (orphans deleted) and
        the commit metadata final, everything a commit needs (BEGUN → PREPARED). `schema`:
        what the commit records (the plugin's `commit_schema`). `lost`: spans cut off the
        batch because the broker's log end had moved back below them, recorded in the
        commit."""
        crash_point("after-write")
        base, skipped = self._base_for(ranges, warn=True)
        decision = decide(base, ranges, statuses)
        ids = (
            self.topic_ids({tp.topic for tp in decision.next_offsets})
            if self.topic_ids is not None and decision.next_offsets.next_offsets
            else {}
        )
        batch = self._batch(instant_time, unknown=BatchState.BEGUN)
        batch.check_move(BatchState.PREPARED)
        kept = self._stage(self._transaction(batch), decision.statuses)
        crash_point("after-reconcile")
        metadata = TableChange(
            operation_type=self.operation_type,
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
                **(
                    {keys.LOST_KEY: json.dumps([[r.partition.key(), r.start, r.end] for r in lost])}
                    if lost
                    else {}
                ),
                **({keys.TOPIC_IDS_KEY: json.dumps(dict(sorted(ids.items())))} if ids else {}),
                **self._format_extra(decision.next_offsets, decision.statuses),
            },
        )
        prepared = PreparedCommit(
            instant_time=instant_time,
            batch_id=batch_id,
            metadata=metadata,
            base_offsets=self.committed,
            next_offsets=decision.next_offsets,
            # the rows the tasks were given: for an append the rows written, for a table of
            # keys the versions applied (its files also hold the rows the batch left alone)
            records=sum(s.records_read for s in decision.statuses),
            files=len(kept),
        )
        batch.move(BatchState.PREPARED)
        return prepared

    def commit(self, prepared: PreparedCommit, *, run_hooks: bool = True) -> BatchOutcome:
        """The commit of the two-phase commit: the batch's transaction publishes under the
        lock with its requirements (writer live, offsets unchanged, the conflict rules), then
        the post-commit hooks run. Idempotent: a commit already on the table (same instant)
        is not published twice. `run_hooks=False`: the caller runs them (`run_post_commit`).
        A batch this coordinator does not hold is a pre-committed one of an earlier process."""
        t = prepared.instant_time
        batch = self._batch(t, unknown=BatchState.PRECOMMITTED)
        batch.check_move(BatchState.PUBLISHED)
        tx = self._transaction(batch, hooks=run_hooks)
        try:
            result = tx.commit(
                prepared.metadata, self._requirements(prepared), delay_s=self.publish_delay_s
            )
        finally:
            if tx.state is TxState.COMMITTED:  # also when a step after the publish failed
                self._end(batch, BatchState.PUBLISHED)
        if not result.published:
            return BatchOutcome(prepared.batch_id, Verdict.ALREADY_COMMITTED, t)
        log.info(
            "table %s writer %s: published instant %s (batch %s, %d records, %d files, %.3fs)",
            self.name,
            self.writer_id,
            t,
            prepared.batch_id,
            prepared.records,
            prepared.files,
            result.publish_s,
        )
        return BatchOutcome(
            prepared.batch_id,
            Verdict.PUBLISH,
            t,
            prepared.records,
            prepared.files,
            result.publish_s,
            result.published_at,
        )

    def check_precommit(self, prepared: PreparedCommit) -> None:
        """Before a batch is pre-committed to the pending store (commit.mode=async): raise
        what its publish would certainly fail with while the batch can still be written again
        (nothing by default; Iceberg tables of keys check their buckets)."""

    def run_post_commit(self, t: InstantTime) -> None:
        """The post-commit hooks for instant `t` (each failure logged, never raised)."""
        for hook in self.post_commit:
            try:
                hook(t)
            except Exception:
                log.exception("table %s: post-commit hook after %s failed", self.name, t)

    def wait_for_services(self, timeout_s: float | None = None) -> bool:
        """Wait for the services running beside the batches (`self.services`) to finish
        what runs and waits; True at once when none do. The ingestion's end waits here, so a
        stopped writer leaves no service half done (an abandoned one is rolled back later)."""
        return self.services is None or self.services.wait_idle(timeout_s)

    def mark_precommitted(self, t: InstantTime) -> None:
        """The batch of instant `t` is durable in the pending store (PREPARED → PRECOMMITTED):
        its owner publishes it at restart, so nothing may roll it back."""
        batch = self._batches.get(t.value)
        if batch is None:
            raise InternalError(f"table {self.name}: no pre-commit of instant {t} to mark")
        batch.check_move(BatchState.PRECOMMITTED)
        self._write_precommitted_mark(t)
        batch.move(BatchState.PRECOMMITTED)

    def _write_precommitted_mark(self, t: InstantTime) -> None:
        """Say durably, beside the table, that `t` is pre-committed (nothing by default: only
        this process could roll it back)."""

    def is_precommitted(self, t: InstantTime) -> bool:
        return self.batch_state(t) is BatchState.PRECOMMITTED

    def drop_refused(self, t: InstantTime) -> None:
        """Forget a pre-committed batch whose publish is refused for good (its owner made its
        Kafka ranges be read again: AsyncCommitter's recovery) and delete its files; never
        those of a commit that landed (the format checks). Best effort: files left are
        orphans."""
        self._batches.pop(t.value, None)
        try:
            self.format.rollback(t)
        except Exception:
            log.exception("table %s: the files of dropped epoch %s stay (orphans)", self.name, t)

    def accept_offsets(self, offsets: WriterOffsets) -> None:
        """Positions after a pre-committed (not yet published) batch, for replay detection."""
        self._committed = offsets

    def abort(self, instant_time: InstantTime) -> None:
        """Roll back an instant whose batch failed (best effort; recovery repeats it). A
        pre-committed batch is never aborted (InternalError): its owner publishes it."""
        batch = self._batch(instant_time, unknown=BatchState.BEGUN)
        batch.check_move(BatchState.ABORTED)
        tx = self._transaction(batch)
        tx.side_files = self._side_files(instant_time)[:1]
        self._end(batch, BatchState.ABORTED)
        if tx.abort() and self.metrics is not None:
            self.metrics.record_rollback("batch_failed")

    # --- helpers -----------------------------------------------------------------------------
    def _requirements(self, prepared: PreparedCommit) -> tuple[Requirement, ...]:
        """What must hold when the batch publishes: the writer live, its offsets unchanged,
        the conflict rules against the file groups it wrote."""
        t = prepared.instant_time
        # the file groups as other writers' conflict checks will read them from the commit
        # (`conflicts.operation_of`): no file name parsed per write
        written = frozenset((w.partition_path, w.file_id) for w in prepared.metadata.writes)
        return (
            WriterStillLive(self.control, t),
            OffsetsUnchanged(self.writer_id, prepared.base_offsets, t),
            NoConflicts(
                Operation(
                    t,
                    OperationKind.INGESTION,
                    written,
                    phase=Phase.PENDING,
                    writer=self.writer_id,
                ),
                self.conflict_strategy,
            ),
        )

    def _stage(self, tx: TableTransaction, statuses: Sequence[WriteStatus]) -> set[str]:
        """Reconcile the files the accepted statuses report (the transaction's `stage`)."""
        return tx.stage({f.path for s in statuses for f in s.files})

    def _format_extra(
        self, next_offsets: WriterOffsets, statuses: Sequence[WriteStatus]
    ) -> dict[str, str]:
        """Format-specific entries of the commit metadata's extra map (none for Hudi)."""
        return {}

    @staticmethod
    def _crash(point: str) -> None:
        crash_point(point)  # looked up at call time: tests replace it

    # --- intents------------------------------------------------------------------------
    def _write_intent(self, t: InstantTime, batch_id: int, ranges: Sequence[OffsetRange]) -> None:
        """Say whose instant `t` is before it is visible (none by default)."""
