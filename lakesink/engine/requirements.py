"""Requirements: small typed checks a commit states and the engine validates right before it
publishes — under the table lock (Hudi) or against the optimistic base (Iceberg) — in the
style of pyiceberg's `TableRequirement`s. A requirement that does not hold raises, and the
commit publishes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from lakesink.errors import CommitError
from lakesink.protocol.conflicts import ConflictStrategy, Operation
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.offsets import WriterOffsets

if TYPE_CHECKING:
    from lakesink.engine.format import CommitControl, TableView


class Requirement(Protocol):
    """One check of the table's state at the moment of the commit."""

    def validate(self, view: TableView) -> None:
        """Raise a `LakesinkError` (a `CommitError` for a state that moved on) if not met."""


@dataclass(frozen=True, slots=True)
class WriterStillLive:
    """The writer still holds the lock lease, its instant's heartbeat and its incarnation
    (a newer incarnation of the same writer id fences this one)."""

    control: CommitControl
    instant_time: InstantTime

    def validate(self, view: TableView) -> None:
        view.check_alive(self.control, self.instant_time)


@dataclass(frozen=True, slots=True)
class OffsetsUnchanged:
    """The writer's committed offsets are still those the commit builds on: no other
    incarnation of the writer committed since this batch began."""

    writer_id: str
    base: WriterOffsets
    instant_time: InstantTime

    def validate(self, view: TableView) -> None:
        fresh = view.committed_offsets(self.writer_id)
        if fresh != self.base:
            raise CommitError(
                f"writer {self.writer_id}'s committed offsets changed under instant "
                f"{self.instant_time} (expected {self.base.to_json()}, found {fresh.to_json()}); "
                "another incarnation of this writer is running"
            )


@dataclass(frozen=True, slots=True)
class BackfillNotCommitted:
    """No commit of the same backfill (same source files) is on the table yet."""

    backfill_id: str

    def validate(self, view: TableView) -> None:
        if view.backfill_committed(self.backfill_id):
            raise CommitError(
                f"backfill {self.backfill_id} was committed concurrently by another run"
            )


@dataclass(frozen=True, slots=True)
class NoConflicts:
    """The configured conflict rules (`lakesink.protocol.conflicts`) allow this operation
    against the operations concurrent with it (completed since it began, or pending)."""

    operation: Operation
    strategy: ConflictStrategy

    def validate(self, view: TableView) -> None:
        view.check_conflicts(self.operation, self.strategy)
