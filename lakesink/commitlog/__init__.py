"""The pending-commit store of the decoupled commit mode (seeds 001 and 004)."""

from lakesink.commitlog.factory import make_pending_store
from lakesink.commitlog.store import (
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
