"""TableTransaction: the one way anything changes a table.

A transaction drives a `TableFormat` (lakesink.engine.format) and knows no format: the lock,
the heartbeat, the instant and its rollback are the format's methods, no-ops where it has none
(Iceberg: no lock, no heartbeat, nothing in flight). The steps below name Hudi's. Every commit
lakesink makes — a streaming batch (sync or async), a backfill, a clustering, a
clean — is one transaction, and every rollback of a failed one goes through `abort`:

    NEW ──begin──▶ ACTIVE ──stage──▶ STAGED ──commit──▶ COMMITTED
                     │                 │  └─(already on the table)──▶ COMMITTED
                     └──────abort──────┴──▶ ABORTED

- begin (under the table lock): a unique instant time, the writer's intent (optional), its
  heartbeat started, then requested → inflight. An instant without a heartbeat counts as
  failed to other writers, so the heartbeat beats before the instant is visible.
- stage: the files the tasks reported are reconciled with the markers — files of failed or
  duplicate task attempts are deleted, a reported file without a marker or missing on
  storage is an error.
- commit (under the lock): a commit already on the table is recognised and not published
  twice; the requirements (lakesink.engine.requirements: writer still live, offsets
  unchanged, backfill not committed, the configured conflict rules) are validated against the
  table as it is now; then the completed instant is published atomically, through the retry
  loop that resolves an unknown outcome by re-reading the table (lakesink.engine.retry).
  After the lock: the heartbeat stops, markers and lakesink's side files go (nothing reads a
  completed instant's markers, so they are deleted outside the lock; a crash before that leaves
  them to the writer's next start), and the post-commit hooks run (inline table services; a
  hook never fails the commit).
- abort: the heartbeat stops and the instant is rolled back (its files deleted by markers).

Every move between states is checked (`_NEXT_TX_STATES`): an illegal one (committing an aborted
transaction, beginning one twice) is a bug, an InternalError naming both states, raised before
the step touches the table.

As a context manager the transaction always stops its heartbeat, and aborts when the block
raised before the commit. A streaming batch begins in one call and commits in a later one (or
after a restart, from the pending store): `TableTransaction.resume` picks it up by instant
time. Crash points (lakesink.faults) keep their names; only the streaming writer's
transactions pass them (`crash=crash_point`).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from lakesink.engine.change import TableChange
from lakesink.engine.format import CommitControl, TableFormat
from lakesink.engine.requirements import Requirement
from lakesink.engine.retry import DEFAULT_RETRY, RetryPolicy, run_commit
from lakesink.engine.writer_state import COMMIT_ID_KEY
from lakesink.errors import CommitError, InternalError
from lakesink.metrics import IngestionMetrics
from lakesink.protocol.instant import Action, Instant, InstantTime

log = logging.getLogger(__name__)

PostCommitHook = Callable[[InstantTime], object]
"""Called with the instant time after a commit published (never fails the commit)."""


class TxState(enum.Enum):
    """Where a transaction is (the diagram at the top of the module)."""

    NEW = "new"
    ACTIVE = "active"  # begun: inflight on the timeline, heartbeat beating
    STAGED = "staged"  # files reconciled; ready to commit
    COMMITTED = "committed"
    ABORTED = "aborted"


_NEXT_TX_STATES: dict[TxState, frozenset[TxState]] = {
    TxState.NEW: frozenset({TxState.ACTIVE, TxState.ABORTED}),
    # ACTIVE → COMMITTED: a change that stages no files (a clean, a replayed commit)
    TxState.ACTIVE: frozenset({TxState.STAGED, TxState.COMMITTED, TxState.ABORTED}),
    TxState.STAGED: frozenset({TxState.COMMITTED, TxState.ABORTED}),
    TxState.COMMITTED: frozenset(),
    TxState.ABORTED: frozenset(),
}


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What `TableTransaction.commit` did."""

    instant_time: InstantTime
    published: bool  # False: the commit was on the table already (a replay or a landed retry)
    publish_s: float = 0.0
    instant: Instant | None = None  # the completed instant (Hudi)
    published_at: float = 0.0  # time.time() when it was published, before the hooks ran


class TableTransaction:
    """One change of one table by one writer."""

    def __init__(
        self,
        table_format: TableFormat,
        control: CommitControl,
        *,
        writer_id: str,
        action: Action = Action.COMMIT,
        metrics: IngestionMetrics | None = None,
        crash: Callable[[str], None] | None = None,
        hooks: Sequence[PostCommitHook] = (),
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        # the table, as the format it commits in (lakesink.engine.format)
        self.format: TableFormat = table_format
        self.name = table_format.name  # the table's display name, for logs
        # the writer's concurrency control, handed to the format (lock, heartbeats, fencing)
        self.control = control
        self.writer_id = writer_id
        self.action = action
        self.metrics = metrics
        self.crash = crash  # lakesink.faults.crash_point for the streaming writer
        self.hooks = tuple(hooks)
        self.retry = retry
        self.state = TxState.NEW
        self._time: InstantTime | None = None
        self.side_files: list[str] = []  # lakesink's files beside the instant, deleted at the end

    @classmethod
    def resume(
        cls,
        table_format: TableFormat,
        control: CommitControl,
        instant_time: InstantTime,
        *,
        writer_id: str,
        state: TxState = TxState.STAGED,
        **options: Any,
    ) -> TableTransaction:
        """The transaction of an instant begun earlier (by this process or one before it)."""
        tx = cls(table_format, control, writer_id=writer_id, **options)
        tx._time = instant_time
        tx.state = state
        return tx

    @property
    def instant_time(self) -> InstantTime:
        if self._time is None:
            raise CommitError("the transaction has not begun")
        return self._time

    def _crash(self, point: str) -> None:
        if self.crash is not None:
            self.crash(point)

    def _check_move(self, to: TxState) -> None:
        """InternalError unless the transaction may go from its state to `to`."""
        if to not in _NEXT_TX_STATES[self.state]:
            raise InternalError(
                f"table {self.name}: the transaction of instant {self._time} cannot go from "
                f"{self.state.value} to {to.value}"
            )

    def _move(self, to: TxState) -> None:
        self._check_move(to)
        self.state = to

    # --- the lock ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[Any]:
        """The table lock, the time waited for it recorded in the metrics."""
        started = time.perf_counter()
        lock = self.format.lock(self.control)
        if lock is None:  # a format without a lock (Iceberg: the catalog's optimistic commit)
            yield None
            return
        with lock as lease:
            if self.metrics is not None:
                self.metrics.record_lock_wait(time.perf_counter() - started)
            yield lease

    # --- begin -------------------------------------------------------------------------------
    def begin(
        self,
        *,
        requested_content: bytes = b"",
        intent: Callable[[InstantTime], object] | None = None,
    ) -> InstantTime:
        """Take the lock and begin (see `begin_locked`)."""
        self._crash("before-begin")
        with self.locked():
            t = self.begin_locked(requested_content=requested_content, intent=intent)
        self._crash("after-begin")
        return t

    def begin_locked(
        self,
        *,
        requested_content: bytes = b"",
        intent: Callable[[InstantTime], object] | None = None,
    ) -> InstantTime:
        """With the lock held: a unique instant time, `intent(t)` (lakesink's files that say
        whose instant it is), the heartbeat, then requested → inflight."""
        self._check_move(TxState.ACTIVE)
        t = self.format.next_instant_time(self.control)
        self._time = t
        if intent is not None:
            intent(t)
        self.format.start_heartbeat(self.control, t)
        self._move(TxState.ACTIVE)
        self.format.begin(self.action, t, requested_content=requested_content)
        return t

    # --- stage -------------------------------------------------------------------------------
    def stage(self, files: Collection[str]) -> set[str]:
        """Reconcile the reported files with the markers (orphans deleted, missing files an
        error); returns the files kept."""
        self._check_move(TxState.STAGED)
        kept = self.format.stage(self.instant_time, files)
        self._move(TxState.STAGED)
        return kept

    # --- commit ------------------------------------------------------------------------------
    def commit(
        self,
        change: TableChange,
        requirements: Sequence[Requirement] = (),
        *,
        delay_s: float = 0.0,
    ) -> CommitResult:
        """Validate the requirements and publish under the lock, then finish and run the hooks.
        Idempotent: a commit already on the table is recognised, not published twice."""
        t = self.instant_time
        self._check_move(TxState.COMMITTED)
        self.format.prepare_publish(self.action, t, change)  # what needs no lock, before it
        started = time.perf_counter()
        if delay_s:
            time.sleep(delay_s)  # commit.publish.delay.s: benchmarks only
        with self.locked():
            view = self.format.view(t)  # read now, under the lock
            commit_id = change.extra.get(COMMIT_ID_KEY, "")
            if self.format.is_published(t, commit_id):
                log.info("table %s: instant %s is already published", self.name, t)
                self._move(TxState.COMMITTED)
                return CommitResult(t, published=False)
            for requirement in requirements:
                requirement.validate(view)
            done = run_commit(
                lambda: self.format.publish(self.action, t, change),
                resolve=lambda: self._landed(commit_id),
                policy=self.retry,
                what=f"publish of {t}",
            )
        publish_s = time.perf_counter() - started
        published_at = time.time()
        self._move(TxState.COMMITTED)
        if self.metrics is not None:
            self.metrics.record_commit(publish_s, time.time())
        self._crash("after-publish")
        self._finish()
        for hook in self.hooks:
            try:
                hook(t)
            except Exception:  # a hook never fails a published commit
                log.exception("table %s: post-commit hook after %s failed", self.name, t)
        return CommitResult(
            t,
            published=True,
            publish_s=publish_s,
            instant=done if isinstance(done, Instant) else None,
            published_at=published_at,
        )

    def complete(self, content: bytes) -> object:
        """Complete a non-data instant (a clean) with its content, then finish."""
        self._check_move(TxState.COMMITTED)
        done = self.format.complete(self.action, self.instant_time, content)
        self._move(TxState.COMMITTED)
        self._finish()
        return done

    def _landed(self, commit_id: str) -> object | None:
        t = self.instant_time
        if not self.format.commit_landed(t, commit_id):
            return None
        return self.format.published_record(t)

    def _finish(self) -> None:
        t = self.instant_time
        self.stop_heartbeat()
        if self.action.writes_data:
            self.format.finish(t)
        self.format.delete_side_files(self.side_files)

    # --- abort -------------------------------------------------------------------------------
    def abort(self) -> bool:
        """Stop the heartbeat and roll the instant back (its files deleted by markers). True
        when there was a pending instant to roll back."""
        self._check_move(TxState.ABORTED)
        if self._time is None:
            self._move(TxState.ABORTED)
            return False
        t = self._time
        self.stop_heartbeat()
        rolled = self.format.rollback(t)
        self.format.delete_side_files(self.side_files)
        self._move(TxState.ABORTED)
        return rolled

    def roll_back_pending(self, current: Instant) -> None:
        """Recovery's rollback of a pending instant found on the timeline (the caller holds
        the lock and checked that nobody publishes it); the heartbeat is not ours to stop."""
        self._check_move(TxState.ABORTED)
        self.format.roll_back_pending(current)
        self._move(TxState.ABORTED)

    def stop_heartbeat(self) -> None:
        if self._time is not None:
            self.format.stop_heartbeat(self.control, self._time)

    # --- context manager ---------------------------------------------------------------------
    def __enter__(self) -> TableTransaction:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is not None and self.state in (TxState.ACTIVE, TxState.STAGED):
                log.warning(
                    "table %s: %s %s failed; rolling it back",
                    self.name,
                    self.action.value,
                    self._time,
                )
                try:
                    self.abort()
                except Exception:  # lazy rollback retries it once the heartbeat expired
                    log.exception("table %s: rollback of %s failed", self.name, self._time)
        finally:
            self.stop_heartbeat()
