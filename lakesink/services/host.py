"""The locks, instant times and heartbeats a table service runs with.

Inline services reuse the writer's own `CommitServices` (its lock provider, heartbeats); the
CLI and tests use `StandaloneServices`, built from a lock provider kind and a table path.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any

from lakesink.concurrency.factory import make_lock_provider
from lakesink.concurrency.heartbeat import Heartbeat, heartbeat_expired
from lakesink.concurrency.instant_time import InstantTimeGenerator
from lakesink.concurrency.lock import LockLease, LockProvider
from lakesink.config import LakesinkConfig
from lakesink.protocol.instant import InstantTime
from lakesink.spark.coordinator import CommitServices
from lakesink.storage import Storage
from lakesink.table.hudi_table import HudiTable

SERVICES_WRITER_ID = "lakesink-table-services"
"""The writer id table services use in heartbeats and logs."""


def lock_and_heartbeat_options(cfg: LakesinkConfig) -> dict[str, Any]:
    """`StandaloneServices` keyword arguments from a LakesinkConfig's `lock.*`, `postgres.dsn`
    and `heartbeat.*` keys."""
    return {
        "lock_provider": cfg["lock.provider"],
        "postgres_dsn": cfg["postgres.dsn"],
        "lock_timeout_s": cfg["lock.timeout.s"],
        "lock_lease_s": cfg["lock.lease.s"],
        "heartbeat_interval_s": cfg["heartbeat.interval.s"],
        "heartbeat_tolerance_s": cfg["heartbeat.tolerance.s"],
    }


class StandaloneServices(CommitServices):
    """A table lock and heartbeats for services run outside a streaming writer."""

    def __init__(
        self,
        table_path: str | os.PathLike[str] | Storage,
        *,
        lock_provider: str = "filesystem",
        postgres_dsn: str | None = None,
        lock_timeout_s: float = 60.0,
        lock_lease_s: float = 30.0,
        heartbeat_interval_s: float = 5.0,
        heartbeat_tolerance_s: float = 60.0,
        writer_id: str = SERVICES_WRITER_ID,
        provider: LockProvider | None = None,
    ) -> None:
        super().__init__()
        self.writer_id = writer_id
        self.owner = f"{writer_id}@{socket.gethostname()}:{os.getpid()}"
        self.lock = provider or make_lock_provider(
            lock_provider,
            owner=self.owner,
            table_base_path=table_path,
            dsn=postgres_dsn,
            lease_s=lock_lease_s,
        )
        self.lock_timeout_s = lock_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_tolerance_s = heartbeat_tolerance_s
        self.generator = InstantTimeGenerator()
        self.heartbeats: dict[str, Heartbeat] = {}
        self._lease: LockLease | None = None

    @contextlib.contextmanager
    def locked(self, table: HudiTable) -> Iterator[LockLease]:
        with self.lock.locked(self.lock_timeout_s) as lease:
            self._lease = lease
            try:
                yield lease
            finally:
                self._lease = None

    def next_instant_time(self, table: HudiTable) -> InstantTime:
        latest = max((i.time for i in table.timeline().instants), default=None)
        return self.generator.next(latest, lease=self._lease)

    def start_heartbeat(self, table: HudiTable, t: InstantTime) -> None:
        hb = Heartbeat(
            table.storage,
            t,
            writer_id=self.writer_id,
            interval_s=self.heartbeat_interval_s,
            tolerance_s=self.heartbeat_tolerance_s,
        )
        self.heartbeats[t.value] = hb.start()

    def stop_heartbeat(self, table: HudiTable, t: InstantTime) -> None:
        hb = self.heartbeats.pop(t.value, None)
        if hb is not None:
            hb.stop(delete=True)

    def heartbeat_expired(self, table: HudiTable, t: InstantTime) -> bool:
        return heartbeat_expired(table.storage, t, self.heartbeat_tolerance_s)

    def check_alive(self, table: HudiTable, t: InstantTime) -> None:
        if self._lease is not None:
            self._lease.check()
        hb = self.heartbeats.get(t.value)
        if hb is not None:
            hb.check()
