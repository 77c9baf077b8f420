"""Concurrency control between writers of one table (seed 003): the table lock, unique instant
times, heartbeats of inflight instants, and fencing of zombie writer incarnations."""

from lakesink.formats.hudi.concurrency.factory import make_lock_provider
from lakesink.formats.hudi.concurrency.heartbeat import (
    Heartbeat,
    WriterIncarnation,
    claim_writer,
    delete_heartbeat,
    heartbeat_expired,
    last_heartbeat,
)
from lakesink.formats.hudi.concurrency.instant_time import InstantTimeGenerator
from lakesink.formats.hudi.concurrency.lock import (
    FileLockProvider,
    LockLease,
    LockProvider,
    NoLockProvider,
)

__all__ = [
    "FileLockProvider",
    "Heartbeat",
    "InstantTimeGenerator",
    "LockLease",
    "LockProvider",
    "NoLockProvider",
    "WriterIncarnation",
    "claim_writer",
    "delete_heartbeat",
    "heartbeat_expired",
    "last_heartbeat",
    "make_lock_provider",
]
