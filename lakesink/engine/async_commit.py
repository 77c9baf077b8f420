"""Decoupled two-phase commit (`commit.mode=async`, seeds 001 and 004).

Pre-commit: after tasks wrote and the coordinator reconciled the files, the batch's final commit
metadata is stored durably as a Pending epoch; then Spark may record the batch and go on.
Commit: a committer thread publishes Pending epochs strictly in order and marks them Committed.
Recovery, before the first new batch: Pending epochs are published (their files are on storage
and reconciled); inflight instants that never reached the store are dirty and rolled back (an
Iceberg batch leaves nothing in flight: its data files stay unreferenced, for orphan removal).
The same committer serves both formats: the coordinator (Hudi `Coordinator` or
`IcebergCoordinator`) publishes through the one commit engine.

The epoch of a batch is its instant time (17 digits, increasing per writer): Spark's batch ids
restart at 0 when a checkpoint is deleted, instant times never repeat.

A Pending epoch that replaces files (an Iceberg table of keys) is refused for good when another
commit changed a bucket it rewrote after it was stored: its files were folded over the old
bucket. Recovery then drops it (and any epoch after it), once the owner's `rewind` made the
source read its Kafka ranges again (Spark's checkpoint: lakesink.spark.replay_check).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lakesink.engine import writer_state as keys
from lakesink.engine.change import TableChange
from lakesink.engine.coordinator import BatchOutcome, Coordinator, PreparedCommit
from lakesink.engine.pending.store import (
    PendingCommit,
    PendingCommitStore,
    PendingEntryConflictError,
)
from lakesink.errors import CommitConflictError, CommitError
from lakesink.faults import crash_point
from lakesink.protocol.commit import Verdict
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets

log = logging.getLogger(__name__)

KEEP_COMMITTED_EPOCHS = 100


def epoch_of(t: InstantTime) -> int:
    return int(t.value)


DATA_FILES_KEY = "data_files"
"""The pending entry's `extra`: the format's data file descriptions (`PreparedCommit.data_files`),
present only when there are some, so a Hudi entry encodes as it always did."""
REWRITE_KEY = "rewrite"
"""The pending entry's `extra`: what the commit of a batch of a table of keys replaces
(`PreparedCommit.rewrite`), present only for those."""


def encode(prepared: PreparedCommit) -> bytes:
    """The pending entry of a prepared commit: everything to publish it from another process
    (the commit metadata with writer id, commit id, offsets and VTTS; the base offsets; the
    data file descriptions of formats whose metadata does not describe its files)."""
    extra: dict[str, Any] = {
        "batch_id": prepared.batch_id,
        "base_offsets": prepared.base_offsets.to_json(),
        "records": prepared.records,
        "files": prepared.files,
        "metadata": prepared.metadata.to_json(),
    }
    if prepared.data_files:
        extra[DATA_FILES_KEY] = [dict(d) for d in prepared.data_files]
    if prepared.rewrite:
        extra[REWRITE_KEY] = [dict(d) for d in prepared.rewrite]
    return PendingCommit(
        instant_time=prepared.instant_time,
        statuses=(),
        offsets=prepared.next_offsets,
        extra=extra,
    ).to_bytes()


def decode(data: bytes) -> PreparedCommit:
    pc = PendingCommit.from_bytes(data)
    extra = pc.extra
    try:
        return PreparedCommit(
            instant_time=pc.instant_time,
            batch_id=int(extra["batch_id"]),
            metadata=TableChange.from_json_bytes(str(extra["metadata"]).encode()),
            base_offsets=WriterOffsets.from_json(extra["base_offsets"]),
            next_offsets=pc.offsets,
            records=int(extra["records"]),
            files=int(extra["files"]),
            data_files=tuple(dict(d) for d in extra.get(DATA_FILES_KEY, ())),
            rewrite=tuple(dict(d) for d in extra.get(REWRITE_KEY, ())),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise PendingEntryConflictError(
            f"pending epoch {pc.instant_time} cannot be decoded ({e!r}); the entry is corrupted"
        ) from e


def ranges_of(prepared: PreparedCommit) -> tuple[OffsetRange, ...]:
    """The Kafka ranges a prepared commit ingests (its metadata's `lakesink.ranges`)."""
    raw = json.loads(prepared.metadata.extra.get(keys.RANGES_KEY, "[]"))
    return tuple(OffsetRange(TopicPartition.parse(k), int(s), int(e)) for k, s, e in raw)


Rewind = Callable[[PreparedCommit], bool]
"""Makes the source read a dropped epoch's batch again (its ranges, from its batch on); False
when it cannot (the checkpoint does not hold that batch)."""


@dataclass
class CommitterStats:
    published: int = 0
    last_publish_s: float = 0.0
    oldest_pending_since: float | None = None


class AsyncCommitter:
    """Pre-commits batches to the pending store and publishes them in order on a thread."""

    def __init__(
        self,
        coordinator: Coordinator,
        store: PendingCommitStore,
        *,
        max_pending: int = 4,
        rewind: Rewind | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.store = store
        self.max_pending = max_pending
        self.rewind = rewind
        self.stats = CommitterStats()
        self._queue: queue.Queue[PreparedCommit | None] = queue.Queue()
        self._unpublished = 0
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def writer_id(self) -> str:
        return self.coordinator.writer_id

    # --- start-up ----------------------------------------------------------------------------
    def pending_instants(self) -> frozenset[InstantTime]:
        return frozenset(
            decode(e.metadata).instant_time for e in self.store.pending(self.writer_id)
        )

    def recover(self) -> int:
        """Publish every Pending epoch in order (call after Coordinator.start(keep=...)). One
        that replaces files and lost a bucket to another commit is dropped (`_drop`)."""
        published = 0
        entries = self.store.pending(self.writer_id)
        for at, entry in enumerate(entries):
            prepared = decode(entry.metadata)
            crash_point("during-recovery")
            try:
                self.coordinator.commit(prepared, run_hooks=False)
            except CommitConflictError as e:
                if not prepared.rewrite:
                    raise
                self._drop(prepared, [decode(later.metadata) for later in entries[at:]], e)
                break
            self.store.mark_committed(self.writer_id, entry.epoch)
            published += 1
            log.info("writer %s: recovery published pending epoch %s", self.writer_id, entry.epoch)
        self.coordinator.accept_offsets(self._table_offsets())
        return published

    def _drop(
        self, refused: PreparedCommit, dropped: list[PreparedCommit], error: CommitConflictError
    ) -> None:
        """Drop a Pending epoch whose publish is refused for good (`error`: a bucket it rewrote
        changed after it was stored) and the epochs after it (they build on its offsets):
        first the source is made to read its batch again (`rewind`), then the epochs are
        marked Aborted and their files deleted. A crash in between repeats it all at the next
        start (the rewind is idempotent, the epoch still Pending). CommitError when there is
        no rewind: the epoch stays Pending, nothing is lost."""
        what = (
            f"writer {self.writer_id}: pending epoch {refused.instant_time} (batch "
            f"{refused.batch_id}) cannot be published: {error}"
        )
        if self.rewind is None or not self.rewind(refused):
            raise CommitError(
                f"{what}; its Kafka ranges cannot be read again here (Spark's checkpoint does "
                "not hold its batch), so it stays Pending"
            ) from error
        for prepared in dropped:
            self.store.mark_aborted(self.writer_id, epoch_of(prepared.instant_time))
            self.coordinator.drop_refused(prepared.instant_time)
        log.warning(
            "%s; dropped (with %d later epoch(s)): its batch is read from Kafka again",
            what,
            len(dropped) - 1,
        )

    def _table_offsets(self) -> WriterOffsets:
        return self.coordinator.table_offsets()

    def start(self) -> AsyncCommitter:
        self._thread = threading.Thread(target=self._run, name="lakesink-committer", daemon=True)
        self._thread.start()
        return self

    # --- the writer's side -------------------------------------------------------------------
    def check(self) -> None:
        """Raise the committer's failure in the writer: stop the query, do not pile up work."""
        if isinstance(self._error, CommitConflictError):
            raise CommitError(
                f"the async committer of writer {self.writer_id} failed: {self._error}; the "
                "pending epoch is not published over the changed bucket: the next start drops "
                "it and reads its batch from Kafka again"
            ) from self._error
        if self._error is not None:
            raise CommitError(
                f"the async committer of writer {self.writer_id} failed: {self._error}; "
                "pending epochs stay in the store and are published at the next start"
            ) from self._error

    def wait_for_room(self, timeout_s: float = 600.0) -> None:
        """Backpressure: at most `max_pending` unpublished epochs."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._unpublished >= self.max_pending and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommitError(
                        f"writer {self.writer_id}: {self._unpublished} epochs wait for the "
                        f"committer for over {timeout_s:.0f}s; table commits are too slow"
                    )
                self._cond.wait(min(left, 1.0))
        self.check()

    def wait_before_batch(self, *, by_key: bool) -> None:
        """Before a batch begins: room for one more epoch (`wait_for_room`); a batch that
        writes by key (`by_key`) waits until every earlier epoch is published, its post-commit
        work done, since its tasks fold over the files its buckets hold as it plans."""
        if by_key:
            self.drain()
        else:
            self.wait_for_room()

    def submit(self, prepared: PreparedCommit) -> BatchOutcome:
        """Pre-commit durably, then hand the batch to the committer thread."""
        self.coordinator.check_precommit(prepared)
        self.store.pre_commit(self.writer_id, epoch_of(prepared.instant_time), encode(prepared))
        self.coordinator.mark_precommitted(prepared.instant_time)
        self.coordinator.accept_offsets(prepared.next_offsets)
        crash_point("after-precommit")
        with self._cond:
            self._unpublished += 1
            if self.stats.oldest_pending_since is None:
                self.stats.oldest_pending_since = time.time()
            self._report_pending()
        self._queue.put(prepared)
        return BatchOutcome(
            prepared.batch_id,
            Verdict.PUBLISH,
            prepared.instant_time,
            prepared.records,
            prepared.files,
        )

    def drain(self, timeout_s: float = 600.0) -> None:
        """Wait until every submitted epoch is published (or the committer failed)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._unpublished and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommitError(
                        f"{self._unpublished} epochs still unpublished after {timeout_s:.0f}s"
                    )
                self._cond.wait(min(left, 1.0))
        self.check()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    # --- the committer thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            prepared = self._queue.get()
            if prepared is None:
                return
            try:
                started = time.perf_counter()
                self.coordinator.commit(prepared, run_hooks=False)
                self.store.mark_committed(self.writer_id, epoch_of(prepared.instant_time))
                self.store.prune_committed(self.writer_id, KEEP_COMMITTED_EPOCHS)
                self.coordinator.run_post_commit(prepared.instant_time)
                self.stats.last_publish_s = time.perf_counter() - started
                self.stats.published += 1
            except BaseException as e:  # reported to the writer by check()
                log.exception(
                    "writer %s: async publish of %s failed", self.writer_id, prepared.instant_time
                )
                with self._cond:
                    self._error = e
                    self._cond.notify_all()
                return
            with self._cond:
                self._unpublished -= 1
                if self._unpublished == 0:
                    self.stats.oldest_pending_since = None
                self._report_pending()
                self._cond.notify_all()

    def _report_pending(self) -> None:
        if self.coordinator.metrics is not None:
            self.coordinator.metrics.set_pending_epochs(self._unpublished)


def pending_summary(store: PendingCommitStore, writer_id: str) -> dict[str, object]:
    """For `lakesink status`: pending epochs and how long the oldest has waited."""
    entries = store.pending(writer_id)
    oldest = min((e.created_at for e in entries), default=None)
    lag = None if oldest is None else max(0.0, time.time() - oldest.timestamp())
    return {
        "pending_epochs": [e.epoch for e in entries],
        "commit_lag_s": lag,
        "latest_committed_epoch": store.latest_committed_epoch(writer_id),
    }
