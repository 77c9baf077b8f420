"""The table lock as a PostgreSQL session-level advisory lock (for writers on several hosts).

The lock lives as long as the dedicated connection that took it: a holder that dies (even by
SIGKILL) closes its socket and PostgreSQL frees the lock at once; a holder whose session was
terminated learns it in `check()`, which asks the server whether it still holds the lock.
psycopg is imported lazily: install the `postgres` extra to use this provider.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lakesink.errors import ConfigError, LockError
from lakesink.extras import require
from lakesink.formats.hudi.concurrency.lock import Clock, Sleep, hold

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)


def advisory_key(lock_key: str) -> int:
    """A stable signed 64-bit advisory lock id for a text key (e.g. the table base path)."""
    digest = hashlib.blake2b(f"lakesink-lock:{lock_key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def describe_dsn(dsn: str) -> str:
    """`host=… port=… dbname=… user=…` of a DSN or URI, never its password."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(dsn)
    except Exception:  # a DSN we cannot parse: say so without echoing it
        return "<unparsable DSN>"
    parts = [f"{k}={params[k]}" for k in ("host", "port", "dbname", "user") if params.get(k)]
    return " ".join(parts) or "<default libpq connection>"


def _psycopg() -> Any:
    return require("psycopg", "lock.provider=postgres")


_HOLDS_SQL = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND pid = pg_backend_pid() AND classid = %s::bigint::oid AND objid = %s::bigint::oid"
    " AND objsubid = 1"
)
_HOLDER_SQL = (
    "SELECT a.application_name, a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s::bigint::oid"
    " AND l.objid = %s::bigint::oid AND l.objsubid = 1"
)


class PostgresLease:
    """The advisory lock held by one dedicated session; valid while that session holds it."""

    def __init__(self, provider: PostgresLockProvider, conn: psycopg.Connection[Any]) -> None:
        self._provider = provider
        self._conn: psycopg.Connection[Any] | None = conn
        self._owner = provider.owner

    @property
    def owner(self) -> str:
        return self._owner

    @property
    def expires_at(self) -> float:
        return math.inf if self._conn is not None else -math.inf

    def _why_invalid(self) -> str | None:
        conn = self._conn
        if conn is None:
            return "it was released"
        psycopg = _psycopg()
        try:
            row = conn.execute(_HOLDS_SQL, self._provider._key_parts()).fetchone()
        except psycopg.Error as e:
            return f"its session is gone ({e.__class__.__name__}: {e})"
        if not row or row[0] < 1:
            return "the session no longer holds the advisory lock"
        return None

    def is_valid(self) -> bool:
        return self._why_invalid() is None

    def check(self) -> None:
        why = self._why_invalid()
        if why is not None:
            raise LockError(
                f"PostgreSQL lock {self._provider.lock_key!r} of {self.owner!r} "
                f"({self._provider.server}) is lost: {why}; do not publish, retry the commit"
            )

    def renew(self) -> None:
        """An advisory lock needs no renewal; this verifies it is still held."""
        self.check()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


class PostgresLockProvider:
    """`pg_try_advisory_lock` polled until `timeout_s`, on a connection of its own per lease."""

    def __init__(
        self,
        dsn: str,
        lock_key: str,
        owner: str,
        *,
        poll_s: float = 0.05,
        connect_timeout_s: int = 5,
        clock: Clock = time.time,
        sleep: Sleep = time.sleep,
        connect: Callable[..., psycopg.Connection[Any]] | None = None,
    ) -> None:
        if not lock_key:
            raise ConfigError("a PostgreSQL lock needs a non-empty lock key")
        self.dsn = dsn
        self.lock_key = lock_key
        self.owner = owner
        self.key = advisory_key(lock_key)
        self.server = describe_dsn(dsn)
        self.poll_s = poll_s
        self.connect_timeout_s = connect_timeout_s
        self.clock = clock
        self.sleep = sleep
        self._connect = connect

    def _key_parts(self) -> tuple[int, int]:
        unsigned = self.key & 0xFFFFFFFFFFFFFFFF
        return unsigned >> 32, unsigned & 0xFFFFFFFF

    def _open(self) -> psycopg.Connection[Any]:
        psycopg = _psycopg()
        connect = self._connect or psycopg.connect
        try:
            return connect(
                self.dsn,
                autocommit=True,
                connect_timeout=self.connect_timeout_s,
                application_name=f"lakesink-lock:{self.owner}"[:63],
            )
        except psycopg.Error as e:
            reason = " ".join(str(e).split())
            raise LockError(
                f"PostgreSQL lock server {self.server} is unreachable: {reason}; "
                "retry when it is back"
            ) from e

    def acquire(self, timeout_s: float) -> PostgresLease:
        psycopg = _psycopg()
        deadline = self.clock() + timeout_s
        conn = self._open()
        try:
            while True:
                row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
                if row and row[0]:
                    log.info("lock %r taken by %s on %s", self.lock_key, self.owner, self.server)
                    return PostgresLease(self, conn)
                if self.clock() >= deadline:
                    holder = conn.execute(_HOLDER_SQL, self._key_parts()).fetchone()
                    who = (
                        f"held by {holder[0] or '?'} (backend pid {holder[1]})"
                        if holder
                        else ("contended")
                    )
                    raise LockError(
                        f"PostgreSQL lock {self.lock_key!r} on {self.server} not acquired within "
                        f"{timeout_s}s: it is {who}; retry later or raise the lock timeout"
                    )
                self.sleep(self.poll_s)
        except psycopg.Error as e:
            conn.close()
            raise LockError(
                f"PostgreSQL lock server {self.server} failed while locking: {e}; retry"
            ) from e
        except BaseException:
            conn.close()
            raise

    def release(self, lease: Any) -> None:
        if not isinstance(lease, PostgresLease) or lease._conn is None:
            return
        with contextlib.suppress(Exception):
            lease._conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
        lease._close()

    def locked(self, timeout_s: float) -> contextlib.AbstractContextManager[PostgresLease]:
        return hold(self, timeout_s)  # type: ignore[return-value]
