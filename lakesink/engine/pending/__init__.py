"""The pending-commit store of the decoupled commit mode (seeds 001 and 004)."""

from lakesink.engine.pending.factory import make_pending_store
from lakesink.engine.pending.store import (
    PendingCommit,
    PendingCommitStore,
    PendingEntry,
    PendingEntryConflictError,
    PendingStatus,
    PendingStoreUnavailableError,
)

__all__ = [
    "PendingCommit",
    "PendingCommitStore",
    "PendingEntry",
    "PendingEntryConflictError",
    "PendingStatus",
    "PendingStoreUnavailableError",
    "make_pending_store",
]
