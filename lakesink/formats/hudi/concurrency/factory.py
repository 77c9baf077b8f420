"""The lock provider that `lock.provider` names, built from its settings: the one place that
knows every provider, so that the lock interface (`lakesink.formats.hudi.concurrency.lock`)
and each provider need not know each other."""

from __future__ import annotations

import os
import time

from lakesink.errors import ConfigError
from lakesink.formats.hudi.concurrency.lock import (
    LOCK_KINDS,
    Clock,
    FileLockProvider,
    LockProvider,
    NoLockProvider,
)
from lakesink.formats.hudi.concurrency.pg_lock import PostgresLockProvider
from lakesink.storage import Storage, as_storage


def make_lock_provider(
    kind: str,
    *,
    owner: str,
    table_base_path: str | os.PathLike[str] | Storage | None = None,
    dsn: str | None = None,
    lock_key: str | None = None,
    lease_s: float = 30.0,
    clock: Clock = time.time,
) -> LockProvider:
    """The provider for `lock.provider` = `filesystem` | `postgres` | `none`."""
    if kind == "filesystem":
        if table_base_path is None:
            raise ConfigError("lock.provider=filesystem needs the table base path")
        return FileLockProvider(table_base_path, owner, lease_s=lease_s, clock=clock)
    if kind == "postgres":
        if not dsn:
            raise ConfigError("lock.provider=postgres needs a PostgreSQL DSN (lock.postgres.dsn)")
        key = lock_key or (as_storage(table_base_path).uri if table_base_path is not None else None)
        if not key:
            raise ConfigError("lock.provider=postgres needs a lock key or the table base path")
        return PostgresLockProvider(dsn, key, owner, clock=clock)
    if kind == "none":
        return NoLockProvider(owner)
    valid = ", ".join(repr(k) for k in LOCK_KINDS)
    raise ConfigError(f"lock provider {kind!r} is not known; valid values are {valid}")


__all__ = ["make_lock_provider"]
