"""The pending-commit store for clusters: a PostgreSQL table (created if missing).

A transaction is durable once COMMIT returns (synchronous_commit is left as configured on the
server; keep it `on`). The connection is opened lazily, once per process, and dropped after any
connection failure so the next call reconnects: a server restart loses nothing. psycopg is
imported lazily: install the `postgres` extra to use this store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from lakesink.engine.pending.store import (
    DEFAULT_TABLE,
    PendingEntry,
    PendingStatus,
    PendingStoreUnavailableError,
    check_epoch,
    check_table_name,
    check_transition,
    decide_pre_commit,
    epochs_to_prune,
)
from lakesink.extras import require

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)


def _psycopg() -> Any:
    return require("psycopg", "the PostgreSQL pending-commit store")


def describe_dsn(dsn: str) -> str:
    """`host=… port=… dbname=… user=…` of a DSN or URI, never its password."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(dsn)
    except Exception:  # a DSN we cannot parse: say so without echoing it
        return "<unparsable DSN>"
    parts = [f"{k}={params[k]}" for k in ("host", "port", "dbname", "user") if params.get(k)]
    return " ".join(parts) or "<default libpq connection>"


def _password(dsn: str) -> str | None:
    try:
        from psycopg.conninfo import conninfo_to_dict

        pw = conninfo_to_dict(dsn).get("password")
    except Exception:
        return None
    return str(pw) if pw else None


class PostgresPendingCommitStore:
    """Pending commits in the PostgreSQL table `table` of the database `dsn` points to."""

    def __init__(self, dsn: str, *, table: str = DEFAULT_TABLE, connect_timeout_s: int = 5) -> None:
        self.dsn = dsn
        self.table = check_table_name(table)
        self.connect_timeout_s = connect_timeout_s
        self.server = describe_dsn(dsn)
        self._conn: psycopg.Connection[Any] | None = None
        self._pid: int | None = None
        self._mutex = threading.RLock()

    def __getstate__(self) -> dict[str, Any]:
        return {"dsn": self.dsn, "table": self.table, "connect_timeout_s": self.connect_timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]  # a fresh, unconnected store

    def __repr__(self) -> str:
        return f"PostgresPendingCommitStore({self.server!r}, table={self.table!r})"

    def _unavailable(self, e: BaseException) -> PendingStoreUnavailableError:
        text = " ".join(str(e).split())
        pw = _password(self.dsn)
        if pw:
            text = text.replace(pw, "***")
        return PendingStoreUnavailableError(
            f"pending-commit store at PostgreSQL {self.server} (table {self.table}) is "
            f"unreachable: {text}; retriable once the server is back (every store call is "
            "idempotent, so repeating one that may have landed is safe)"
        )

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is not None and self._pid == os.getpid() and not self._conn.closed:
            return self._conn
        pg = _psycopg()
        conn: psycopg.Connection[Any] = pg.connect(
            self.dsn,
            connect_timeout=self.connect_timeout_s,
            application_name="lakesink-pending-store",
        )
        try:
            with conn.transaction():
                # serialise the CREATE of concurrent first users of the table
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.table,))
                conn.execute(
                    f"""CREATE TABLE IF NOT EXISTS {self.table} (
                        writer_id text NOT NULL,
                        epoch bigint NOT NULL,
                        status text NOT NULL
                            CHECK (status IN ('Pending', 'Aborted', 'Committed')),
                        metadata bytea NOT NULL,
                        created_at timestamptz NOT NULL DEFAULT now(),
                        updated_at timestamptz NOT NULL DEFAULT now(),
                        PRIMARY KEY (writer_id, epoch)
                    )"""
                )
        except BaseException:
            conn.close()
            raise
        self._conn, self._pid = conn, os.getpid()
        return conn

    @contextlib.contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[Any]]:
        psycopg = _psycopg()
        with self._mutex:
            try:
                conn = self._connection()
                with conn.transaction():
                    yield conn
            except (psycopg.OperationalError, psycopg.InterfaceError) as e:
                self._drop()
                raise self._unavailable(e) from e
            except psycopg.Error as e:
                if self._conn is not None and self._conn.closed:
                    self._drop()
                    raise self._unavailable(e) from e
                raise PendingStoreUnavailableError(
                    f"pending-commit store at PostgreSQL {self.server} failed: "
                    f"{e.__class__.__name__}: {e}; retriable"
                ) from e

    def _row(self, conn: psycopg.Connection[Any], writer_id: str, epoch: int, lock: bool) -> Any:
        suffix = " FOR UPDATE" if lock else ""
        return conn.execute(
            f"SELECT status, metadata FROM {self.table} WHERE writer_id = %s AND epoch = %s"
            + suffix,
            (writer_id, epoch),
        ).fetchone()

    def pre_commit(self, writer_id: str, epoch: int, metadata: bytes) -> bool:
        check_epoch(epoch)
        with self._tx() as conn:
            inserted = conn.execute(
                f"INSERT INTO {self.table} (writer_id, epoch, status, metadata)"
                " VALUES (%s, %s, 'Pending', %s) ON CONFLICT DO NOTHING RETURNING epoch",
                (writer_id, epoch, bytes(metadata)),
            ).fetchone()
            if inserted is not None:
                return True
            row = self._row(conn, writer_id, epoch, lock=True)
            existing = None if row is None else (PendingStatus(row[0]), bytes(row[1]))
            action = decide_pre_commit(writer_id, epoch, existing, metadata)
            if action == "replace":
                log.info("pending epoch %d of writer %s: aborted entry replaced", epoch, writer_id)
                conn.execute(
                    f"UPDATE {self.table} SET status = 'Pending', metadata = %s,"
                    " updated_at = now() WHERE writer_id = %s AND epoch = %s",
                    (bytes(metadata), writer_id, epoch),
                )
            return action != "same"

    def _transition(self, writer_id: str, epoch: int, target: PendingStatus) -> None:
        with self._tx() as conn:
            row = self._row(conn, writer_id, epoch, lock=True)
            current = None if row is None else PendingStatus(row[0])
            if check_transition(writer_id, epoch, current, target):
                conn.execute(
                    f"UPDATE {self.table} SET status = %s, updated_at = now()"
                    " WHERE writer_id = %s AND epoch = %s",
                    (target.value, writer_id, epoch),
                )

    def mark_committed(self, writer_id: str, epoch: int) -> None:
        self._transition(writer_id, epoch, PendingStatus.COMMITTED)

    def mark_aborted(self, writer_id: str, epoch: int) -> None:
        self._transition(writer_id, epoch, PendingStatus.ABORTED)

    def abort_pending_above(self, writer_id: str, epoch: int) -> list[int]:
        with self._tx() as conn:
            rows = conn.execute(
                f"UPDATE {self.table} SET status = 'Aborted', updated_at = now()"
                " WHERE writer_id = %s AND epoch > %s AND status = 'Pending' RETURNING epoch",
                (writer_id, epoch),
            ).fetchall()
        return sorted(int(r[0]) for r in rows)

    _COLUMNS = "writer_id, epoch, status, metadata, created_at, updated_at"

    @staticmethod
    def _entry(row: Any) -> PendingEntry:
        return PendingEntry(
            writer_id=row[0],
            epoch=int(row[1]),
            status=PendingStatus(row[2]),
            metadata=bytes(row[3]),
            created_at=_utc(row[4]),
            updated_at=_utc(row[5]),
        )

    def pending(self, writer_id: str) -> list[PendingEntry]:
        with self._tx() as conn:
            rows = conn.execute(
                f"SELECT {self._COLUMNS} FROM {self.table} WHERE writer_id = %s"
                " AND status = 'Pending' ORDER BY epoch",
                (writer_id,),
            ).fetchall()
        return [self._entry(r) for r in rows]

    def get(self, writer_id: str, epoch: int) -> PendingEntry | None:
        with self._tx() as conn:
            row = conn.execute(
                f"SELECT {self._COLUMNS} FROM {self.table} WHERE writer_id = %s AND epoch = %s",
                (writer_id, epoch),
            ).fetchone()
        return None if row is None else self._entry(row)

    def latest_committed_epoch(self, writer_id: str) -> int | None:
        with self._tx() as conn:
            row = conn.execute(
                f"SELECT max(epoch) FROM {self.table} WHERE writer_id = %s"
                " AND status = 'Committed'",
                (writer_id,),
            ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def count_pending(self, writer_id: str) -> int:
        with self._tx() as conn:
            row = conn.execute(
                f"SELECT count(*) FROM {self.table} WHERE writer_id = %s AND status = 'Pending'",
                (writer_id,),
            ).fetchone()
        return int(row[0]) if row else 0

    def prune_committed(self, writer_id: str, keep_last: int) -> int:
        with self._tx() as conn:
            rows = [
                (int(e), PendingStatus(s))
                for e, s in conn.execute(
                    f"SELECT epoch, status FROM {self.table} WHERE writer_id = %s FOR UPDATE",
                    (writer_id,),
                ).fetchall()
            ]
            doomed = epochs_to_prune(rows, keep_last)
            if doomed:
                conn.execute(
                    f"DELETE FROM {self.table} WHERE writer_id = %s AND epoch = ANY(%s)"
                    " AND status <> 'Pending'",
                    (writer_id, doomed),
                )
        return len(doomed)

    def close(self) -> None:
        with self._mutex:
            if self._pid == os.getpid():
                self._drop()
            self._conn = None


def _utc(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return datetime.fromtimestamp(float(value), tz=UTC)
