"""The pending-commit store of the decoupled commit mode (seeds 001 and 004)."""

from lakesink.commitlog.store import (
    PendingCommit,
    PendingCommitStore,
    PendingEntry,
    PendingEntryConflictError,
    PendingStatus,
    PendingStoreUnavailableError,
    make_pending_store,
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
