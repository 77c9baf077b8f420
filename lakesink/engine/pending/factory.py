"""The pending-commit store that `commit.pending.store` names: the one place that knows every
backend, so that the store interface (`lakesink.engine.pending.store`) and each backend need
not know each other."""

from __future__ import annotations

from lakesink.engine.pending.postgres import PostgresPendingCommitStore
from lakesink.engine.pending.sqlite import SqlitePendingCommitStore
from lakesink.engine.pending.store import DEFAULT_TABLE, STORE_KINDS, PendingCommitStore
from lakesink.errors import ConfigError


def make_pending_store(
    kind: str,
    *,
    path: str | None = None,
    dsn: str | None = None,
    table: str = DEFAULT_TABLE,
) -> PendingCommitStore:
    """The store for `commit.pending_store` = `sqlite` (needs `path`) | `postgres` (`dsn`)."""
    if kind == "sqlite":
        if not path:
            raise ConfigError("pending store 'sqlite' needs a database file path")
        return SqlitePendingCommitStore(path, table=table)
    if kind == "postgres":
        if not dsn:
            raise ConfigError("pending store 'postgres' needs a PostgreSQL DSN")
        return PostgresPendingCommitStore(dsn, table=table)
    valid = ", ".join(repr(k) for k in STORE_KINDS)
    raise ConfigError(f"pending store {kind!r} is not known; valid values are {valid}")


__all__ = ["make_pending_store"]
