"""What a table format provides to the commit engine.

`TableTransaction` (lakesink.engine.transaction) drives a commit through these two Protocols;
`lakesink.formats.hudi.format.HudiFormat` implements them over lakesink's Hudi table (its lock,
heartbeats, timeline and markers). `lakesink.formats.iceberg.format.IcebergFormat` commits one
snapshot per transaction through its catalog's optimistic commit: it has no lock file, no
instant files and no markers, so `begin` only allocates ids, `stage` checks the data files the
tasks reported, and `commit` is the catalog's compare-and-swap of the table metadata, retried on
conflict with the requirements re-checked against the refreshed metadata. A writer's
concurrency control (`CommitControl`) is opaque to the engine: it hands it to the format, whose
own kind it is (Hudi: lock, heartbeats, fencing; Iceberg: none, the catalog's commit is the
fence).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from lakesink.engine.change import TableChange
from lakesink.protocol.conflicts import ConflictStrategy, Operation
from lakesink.protocol.instant import Action, Instant, InstantTime
from lakesink.protocol.offsets import WriterOffsets


class CommitControl(Protocol):
    """The concurrency control a writer commits under, as the engine sees it: a value it
    passes to the format (`TableFormat.next_instant_time`, `TableView.check_alive`) and never
    calls, so that the engine needs no format's control (Hudi's: lakesink.formats.hudi.control)."""

    @property
    def writer_id(self) -> str:
        """The writer the control acts for (heartbeats, fencing, logs)."""


class TableView(Protocol):
    """The table as a commit sees it at the moment it publishes: under the lock (Hudi) or at
    the metadata version the optimistic commit swaps from (Iceberg). Requirements read it."""

    def committed_offsets(self, writer_id: str) -> WriterOffsets:
        """The writer's offsets recorded by its newest commit — for Iceberg: in the current
        snapshot's lineage, walking back past other writers' snapshots — or empty."""

    def backfill_committed(self, backfill_id: str) -> bool:
        """Whether a commit carrying this backfill id is on the table (history included)."""

    def check_conflicts(self, operation: Operation, strategy: ConflictStrategy) -> None:
        """Raise `CommitConflictError` if `strategy` forbids `operation` against the
        operations committed since it began (Iceberg: snapshots after the base snapshot)."""

    def check_alive(self, control: CommitControl, instant_time: InstantTime) -> None:
        """Raise if the writer lost its lease, heartbeat or incarnation (Iceberg: only the
        incarnation, kept in the writer's state)."""


class TableFormat(Protocol):
    """One table, as the commit engine needs it. Each method's guarantee is what any format
    must give; the engine supplies locking and retries around them."""

    @property
    def name(self) -> str:
        """The table's name, for logs and errors."""

    def lock(self, control: CommitControl) -> AbstractContextManager[object] | None:
        """The table lock `control` takes, held from a commit's checks to its publish; None
        for a format without one (Iceberg: the catalog's optimistic commit is the fence)."""

    def start_heartbeat(self, control: CommitControl, instant_time: InstantTime) -> None:
        """Prove the writer alive while `instant_time` is in flight, before it is visible:
        other writers roll back an in-flight commit without one (Hudi). Iceberg: nothing."""

    def stop_heartbeat(self, control: CommitControl, instant_time: InstantTime) -> None:
        """Stop `start_heartbeat`'s heartbeat; safe when none beats."""

    def next_instant_time(self, control: CommitControl) -> InstantTime:
        """A new transaction id, later than every commit on the table (Hudi: the control's
        instant time under the lock; Iceberg: the clock, past the newest snapshot)."""

    def begin(self, action: Action, instant_time: InstantTime, *, requested_content: bytes) -> None:
        """Make the commit `instant_time` known as in flight, so that recovery can find and
        roll back what it wrote if the writer dies. Hudi: requested then inflight file.
        Iceberg: nothing durable (data files without a snapshot are orphans)."""

    def stage(self, instant_time: InstantTime, files: Collection[str]) -> set[str]:
        """Reconcile what tasks wrote with what they reported: delete files of failed or
        duplicate task attempts, raise if a reported file is missing. Returns the files kept.
        After it, exactly the reported files belong to the commit."""

    def view(self, instant_time: InstantTime) -> TableView:
        """The table's current state for the requirements (read fresh, under the lock)."""

    def is_published(self, instant_time: InstantTime, commit_id: str = "") -> bool:
        """Whether the commit is on the table already (a replay or a retry that landed).
        `commit_id`: the change's commit id (writer_state.COMMIT_ID_KEY) where known, for a
        format whose transaction ids may repeat across writers and processes."""

    def prepare_publish(
        self, action: Action, instant_time: InstantTime, change: TableChange
    ) -> None:
        """Work for `publish` that needs no lock, done before the lock is taken (Hudi: encoding
        the completed file; nothing for Iceberg)."""

    def publish(self, action: Action, instant_time: InstantTime, change: TableChange) -> object:
        """Make the commit visible atomically, `change` encoded in the format's metadata
        (files, writer id, commit id, offsets) — all or nothing — and return the format's
        record of it (Hudi: the completed instant; Iceberg: the new snapshot). Raise
        `CommitStateUnknownError` when the request may or may not have landed;
        `commit_landed` then decides."""

    def commit_landed(self, instant_time: InstantTime, commit_id: str) -> bool:
        """After an unknown outcome: whether the table holds this very commit."""

    def published_record(self, instant_time: InstantTime) -> object:
        """The format's record of a commit `commit_landed` found (as `publish` returns it)."""

    def complete(self, action: Action, instant_time: InstantTime, content: bytes) -> object:
        """Complete a non-data commit (a Hudi clean) with its content; raise `CommitError`
        where the format has none."""

    def finish(self, instant_time: InstantTime) -> None:
        """Clean up after a published commit (Hudi: its markers)."""

    def rollback(self, instant_time: InstantTime) -> bool:
        """Undo a commit that will not publish: delete its files and its in-flight state;
        True when there was in-flight state to undo. Safe to repeat, and safe when the commit
        never began."""

    def roll_back_pending(self, instant: Instant) -> None:
        """Roll back a pending commit that recovery found on the table (its caller holds the
        lock); raise `CommitError` where the format keeps no pending commits (Iceberg)."""

    def delete_side_files(self, keys: Sequence[str]) -> None:
        """Delete the writer's own files kept beside a commit (Hudi: its intent and
        pre-commit marks) once the commit ended; nothing where it keeps none."""

    def committed_offsets(self, writer_id: str) -> WriterOffsets:
        """The writer's committed offsets (as `TableView.committed_offsets`, read now)."""

    def schema(self) -> str | None:
        """The table's latest schema (Avro JSON for Hudi), or None for an empty table."""
