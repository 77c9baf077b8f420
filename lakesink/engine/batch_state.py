"""Where each open streaming batch is, in the coordinator that began it.

One `OpenBatch` per instant the coordinator holds: its transaction and its `BatchState`.

    BEGUN ──precommit──▶ PREPARED ──mark_precommitted──▶ PRECOMMITTED ──commit──▶ PUBLISHED
      │                    │ └──────────────────commit───────────────────────────────▲
      └──────abort─────────┴──▶ ABORTED

- BEGUN: the transaction began (Hudi: the instant is inflight); tasks write its files.
- PREPARED: the files are reconciled and the change is final (`Coordinator.precommit`); it
  lives in this process only, so a failure may still abort it.
- PRECOMMITTED: durable in the pending store (commit.mode=async; Hudi also marks it on the
  timeline). Its owner publishes it, now or at the next start: nothing may abort it (recovery
  drops one whose publish is refused for good, an Iceberg batch of keys that lost a bucket,
  after the source was rewound to read it again: `Coordinator.drop_refused`, outside these
  moves).
- PUBLISHED, ABORTED: the batch is over; the coordinator drops its record.

A batch pre-committed by an earlier process (recovery publishes it from the pending store)
enters as PRECOMMITTED; one this process did not begin but is asked to pre-commit (another
coordinator object over the same table began it) enters as BEGUN. Every move is checked: an
illegal one is a bug in lakesink, an InternalError naming both states.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from lakesink.engine.transaction import TableTransaction
from lakesink.errors import InternalError
from lakesink.protocol.instant import InstantTime

__all__ = ["BatchState", "OpenBatch"]


class BatchState(enum.Enum):
    """Where one streaming batch's commit is (the module's diagram)."""

    BEGUN = "begun"
    PREPARED = "prepared"
    PRECOMMITTED = "precommitted"
    PUBLISHED = "published"
    ABORTED = "aborted"

    @property
    def is_over(self) -> bool:
        return self in (BatchState.PUBLISHED, BatchState.ABORTED)


_NEXT_BATCH_STATES: dict[BatchState, frozenset[BatchState]] = {
    BatchState.BEGUN: frozenset({BatchState.PREPARED, BatchState.ABORTED}),
    BatchState.PREPARED: frozenset(
        {BatchState.PRECOMMITTED, BatchState.PUBLISHED, BatchState.ABORTED}
    ),
    BatchState.PRECOMMITTED: frozenset({BatchState.PUBLISHED}),
    BatchState.PUBLISHED: frozenset(),
    BatchState.ABORTED: frozenset(),
}


@dataclass(slots=True)
class OpenBatch:
    """One batch the coordinator holds: its instant, its transaction and where it is."""

    instant_time: InstantTime
    transaction: TableTransaction
    state: BatchState = BatchState.BEGUN

    def check_move(self, to: BatchState) -> None:
        """InternalError unless the batch may go from its state to `to`."""
        if to not in _NEXT_BATCH_STATES[self.state]:
            raise InternalError(
                f"the batch of instant {self.instant_time} cannot go from {self.state.value} "
                f"to {to.value}"
            )

    def move(self, to: BatchState) -> None:
        self.check_move(to)
        self.state = to
