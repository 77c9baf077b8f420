"""The embedded pending-commit store: one SQLite file (WAL, synchronous=FULL).

With `synchronous=FULL` a transaction is on disk when its COMMIT returns, so a process killed
right after `pre_commit` returned loses nothing. The connection is opened lazily, once per
process (a pickled or forked copy opens its own), and shared by the threads of that process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

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

log = logging.getLogger(__name__)


class SqlitePendingCommitStore:
    """Pending commits in the SQLite database file `path` (created if missing)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        table: str = DEFAULT_TABLE,
        busy_timeout_s: float = 30,
    ) -> None:
        self.path = os.fspath(path)
        self.table = check_table_name(table)
        self.busy_timeout_s = busy_timeout_s
        self._conn: sqlite3.Connection | None = None
        self._pid: int | None = None
        self._mutex = threading.RLock()

    # pickling: never carry a live connection into another process

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "table": self.table, "busy_timeout_s": self.busy_timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]  # a fresh, unconnected store

    def __repr__(self) -> str:
        return f"SqlitePendingCommitStore({self.path!r}, table={self.table!r})"

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        try:
            parent = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(parent, exist_ok=True)
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(
                f"""CREATE TABLE IF NOT EXISTS {self.table} (
                    writer_id TEXT NOT NULL,
                    epoch INTEGER NOT NULL,
                    status TEXT NOT NULL CHECK (status IN ('Pending', 'Aborted', 'Committed')),
                    metadata BLOB NOT NULL,
                    created_at REAL NOT NULL,
                    updated_at REAL NOT NULL,
                    PRIMARY KEY (writer_id, epoch)
                )"""
            )
        except (sqlite3.Error, OSError) as e:
            raise PendingStoreUnavailableError(
                f"pending-commit store {self.path} cannot be opened: {e}; it is retriable once "
                "the file is reachable and writable"
            ) from e
        self._conn, self._pid = conn, os.getpid()
        return conn

    @contextlib.contextmanager
    def _tx(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        with self._mutex:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            except sqlite3.Error as e:
                raise PendingStoreUnavailableError(
                    f"pending-commit store {self.path} failed: {e}; retriable"
                ) from e

    def _status(self, conn: sqlite3.Connection, writer_id: str, epoch: int) -> PendingStatus | None:
        row = conn.execute(
            f"SELECT status FROM {self.table} WHERE writer_id = ? AND epoch = ?",
            (writer_id, epoch),
        ).fetchone()
        return None if row is None else PendingStatus(row[0])

    def pre_commit(self, writer_id: str, epoch: int, metadata: bytes) -> bool:
        check_epoch(epoch)
        now = time.time()
        with self._tx(write=True) as conn:
            row = conn.execute(
                f"SELECT status, metadata FROM {self.table} WHERE writer_id = ? AND epoch = ?",
                (writer_id, epoch),
            ).fetchone()
            existing = None if row is None else (PendingStatus(row[0]), bytes(row[1]))
            action = decide_pre_commit(writer_id, epoch, existing, metadata)
            if action == "insert":
                conn.execute(
                    f"INSERT INTO {self.table} VALUES (?, ?, 'Pending', ?, ?, ?)",
                    (writer_id, epoch, bytes(metadata), now, now),
                )
            elif action == "replace":
                log.info("pending epoch %d of writer %s: aborted entry replaced", epoch, writer_id)
                conn.execute(
                    f"UPDATE {self.table} SET status = 'Pending', metadata = ?, updated_at = ?"
                    " WHERE writer_id = ? AND epoch = ?",
                    (bytes(metadata), now, writer_id, epoch),
                )
        return action != "same"

    def _transition(self, writer_id: str, epoch: int, target: PendingStatus) -> None:
        with self._tx(write=True) as conn:
            current = self._status(conn, writer_id, epoch)
            if check_transition(writer_id, epoch, current, target):
                conn.execute(
                    f"UPDATE {self.table} SET status = ?, updated_at = ?"
                    " WHERE writer_id = ? AND epoch = ?",
                    (target.value, time.time(), writer_id, epoch),
                )

    def mark_committed(self, writer_id: str, epoch: int) -> None:
        self._transition(writer_id, epoch, PendingStatus.COMMITTED)

    def mark_aborted(self, writer_id: str, epoch: int) -> None:
        self._transition(writer_id, epoch, PendingStatus.ABORTED)

    def abort_pending_above(self, writer_id: str, epoch: int) -> list[int]:
        with self._tx(write=True) as conn:
            epochs = [
                r[0]
                for r in conn.execute(
                    f"SELECT epoch FROM {self.table} WHERE writer_id = ? AND epoch > ?"
                    " AND status = 'Pending' ORDER BY epoch",
                    (writer_id, epoch),
                )
            ]
            conn.execute(
                f"UPDATE {self.table} SET status = 'Aborted', updated_at = ?"
                " WHERE writer_id = ? AND epoch > ? AND status = 'Pending'",
                (time.time(), writer_id, epoch),
            )
        return epochs

    @staticmethod
    def _entry(row: tuple[Any, ...]) -> PendingEntry:
        return PendingEntry(
            writer_id=row[0],
            epoch=int(row[1]),
            status=PendingStatus(row[2]),
            metadata=bytes(row[3]),
            created_at=datetime.fromtimestamp(row[4], tz=UTC),
            updated_at=datetime.fromtimestamp(row[5], tz=UTC),
        )

    _COLUMNS = "writer_id, epoch, status, metadata, created_at, updated_at"

    def pending(self, writer_id: str) -> list[PendingEntry]:
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {self._COLUMNS} FROM {self.table} WHERE writer_id = ?"
                " AND status = 'Pending' ORDER BY epoch",
                (writer_id,),
            ).fetchall()
        return [self._entry(r) for r in rows]

    def get(self, writer_id: str, epoch: int) -> PendingEntry | None:
        with self._tx(write=False) as conn:
            row = conn.execute(
                f"SELECT {self._COLUMNS} FROM {self.table} WHERE writer_id = ? AND epoch = ?",
                (writer_id, epoch),
            ).fetchone()
        return None if row is None else self._entry(row)

    def latest_committed_epoch(self, writer_id: str) -> int | None:
        with self._tx(write=False) as conn:
            row = conn.execute(
                f"SELECT max(epoch) FROM {self.table} WHERE writer_id = ? AND status = 'Committed'",
                (writer_id,),
            ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def count_pending(self, writer_id: str) -> int:
        with self._tx(write=False) as conn:
            row = conn.execute(
                f"SELECT count(*) FROM {self.table} WHERE writer_id = ? AND status = 'Pending'",
                (writer_id,),
            ).fetchone()
        return int(row[0])

    def prune_committed(self, writer_id: str, keep_last: int) -> int:
        with self._tx(write=True) as conn:
            rows = [
                (int(e), PendingStatus(s))
                for e, s in conn.execute(
                    f"SELECT epoch, status FROM {self.table} WHERE writer_id = ?", (writer_id,)
                )
            ]
            doomed = epochs_to_prune(rows, keep_last)
            conn.executemany(
                f"DELETE FROM {self.table} WHERE writer_id = ? AND epoch = ?"
                " AND status != 'Pending'",
                [(writer_id, e) for e in doomed],
            )
        return len(doomed)

    def close(self) -> None:
        with self._mutex:
            conn, self._conn = self._conn, None
            if conn is not None and self._pid == os.getpid():
                conn.close()
