"""Commit control: the table lock, unique instant times, heartbeats and writer fencing a
transaction runs under (the Hudi side of concurrency control; an Iceberg table's optimistic
catalog commit needs none of them).

- `CommitControl`: a single writer and no lock (unit tests, tables nobody shares);
- `LockedCommitControl`: the configured lock provider and heartbeats (table services, the CLI,
  a backfill);
- `WriterCommitControl`: that plus writer-id fencing, for a streaming writer.

Each is built from a typed `ControlSettings` passed in explicitly.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from lakesink.engine.format import CommitControl as EngineControl
from lakesink.errors import FencedError, InternalError
from lakesink.formats.hudi.concurrency.factory import make_lock_provider
from lakesink.formats.hudi.concurrency.heartbeat import (
    Heartbeat,
    WriterIncarnation,
    claim_writer,
    heartbeat_expired,
)
from lakesink.formats.hudi.concurrency.instant_time import InstantTimeGenerator
from lakesink.formats.hudi.concurrency.lock import LockLease, LockProvider
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.timeline import Timeline, latest_time
from lakesink.protocol.instant import InstantTime
from lakesink.settings import CommitSettings, Settings
from lakesink.storage import Storage

SERVICES_WRITER_ID = "lakesink-table-services"
"""The writer id table services use in heartbeats and logs."""


@dataclass(frozen=True, slots=True)
class ControlSettings:
    """The `lock.*`, `postgres.dsn` and `heartbeat.*` settings commit control runs with."""

    lock_provider: str = "filesystem"
    postgres_dsn: str | None = None
    lock_timeout_s: float = 60.0
    lock_lease_s: float = 30.0
    heartbeat_interval_s: float = 5.0
    heartbeat_tolerance_s: float = 60.0

    @classmethod
    def from_settings(cls, commit: CommitSettings) -> ControlSettings:
        return cls(
            lock_provider=commit.lock_provider,
            postgres_dsn=commit.postgres_dsn,
            lock_timeout_s=commit.lock_timeout_s,
            lock_lease_s=commit.lock_lease_s,
            heartbeat_interval_s=commit.heartbeat_interval_s,
            heartbeat_tolerance_s=commit.heartbeat_tolerance_s,
        )

    def options(self) -> dict[str, Any]:
        """As `LockedCommitControl` keyword arguments."""
        return {
            "lock_provider": self.lock_provider,
            "postgres_dsn": self.postgres_dsn,
            "lock_timeout_s": self.lock_timeout_s,
            "lock_lease_s": self.lock_lease_s,
            "heartbeat_interval_s": self.heartbeat_interval_s,
            "heartbeat_tolerance_s": self.heartbeat_tolerance_s,
        }


class CommitControl:
    """A single writer with no lock: instant times from the clock, no heartbeats, no fencing."""

    writer_id: str = SERVICES_WRITER_ID

    def __init__(self, clock_ms: Callable[[], int] | None = None) -> None:
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))

    def claim(self, table: HudiTable, writer_id: str) -> None:
        """Become the only live incarnation of `writer_id`."""

    def locked(self, table: HudiTable) -> Any:
        return contextlib.nullcontext()

    def next_instant_time(self, table: HudiTable, timeline: Timeline | None = None) -> InstantTime:
        """A new instant time after every instant time and completion time on the table
        (`latest_time`; `timeline`: a snapshot listed just now, under the lock, to read
        instead of listing again)."""
        latest = latest_time(timeline or table.timeline())
        latest_ms = latest.to_epoch_ms() if latest is not None else 0
        return InstantTime.from_epoch_ms(max(self._clock_ms(), latest_ms + 1))

    def start_heartbeat(self, table: HudiTable, t: InstantTime) -> None:
        """Begin proving this writer is alive while instant `t` is inflight."""

    def stop_heartbeat(self, table: HudiTable, t: InstantTime) -> None:
        """Stop the heartbeat of instant `t`."""

    def heartbeat_expired(self, table: HudiTable, t: InstantTime) -> bool:
        return False

    def check_alive(self, table: HudiTable, t: InstantTime) -> None:
        """Raise if this writer lost its lease, heartbeat or incarnation: it must not publish."""

    def renew_lock(self) -> None:
        """Extend the lease of the lock held now (long work under it: a compaction)."""


def hudi_control(control: EngineControl) -> CommitControl:
    """The engine hands back the control it was given: for a Hudi table it is one of these
    (another is a bug: InternalError)."""
    if not isinstance(control, CommitControl):
        raise InternalError(f"a Hudi table commits under Hudi's commit control, not {control!r}")
    return control


class LockedCommitControl(CommitControl):
    """The table lock and heartbeats (a writer that needs no fencing: services, backfill)."""

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

    @classmethod
    def from_settings(
        cls,
        table_path: str | os.PathLike[str] | Storage,
        settings: ControlSettings,
        *,
        writer_id: str = SERVICES_WRITER_ID,
    ) -> LockedCommitControl:
        return cls(table_path, writer_id=writer_id, **settings.options())

    @contextlib.contextmanager
    def locked(self, table: HudiTable) -> Iterator[LockLease]:
        with self.lock.locked(self.lock_timeout_s) as lease:
            self._lease = lease
            try:
                yield lease
            finally:
                self._lease = None

    def next_instant_time(self, table: HudiTable, timeline: Timeline | None = None) -> InstantTime:
        latest = latest_time(timeline or table.timeline())
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

    def renew_lock(self) -> None:
        if self._lease is not None:
            self._lease.renew()

    def check_alive(self, table: HudiTable, t: InstantTime) -> None:
        if self._lease is not None:
            self._lease.check()
        hb = self.heartbeats.get(t.value)
        if hb is not None:
            hb.check()


class WriterCommitControl(LockedCommitControl):
    """A streaming writer's control: the lock and heartbeats plus writer-id fencing (a newer
    incarnation of the same writer id fences this one)."""

    def __init__(
        self,
        table_path: str | os.PathLike[str] | Storage,
        settings: ControlSettings,
        *,
        writer_id: str,
    ) -> None:
        super().__init__(table_path, writer_id=writer_id, **settings.options())
        self.incarnation: WriterIncarnation | None = None

    @classmethod
    def for_writer(cls, settings: Settings) -> WriterCommitControl:
        return cls(
            settings.table_storage(),
            ControlSettings.from_settings(settings.commit),
            writer_id=settings.writer_id,
        )

    def claim(self, table: HudiTable, writer_id: str) -> None:
        self.incarnation = claim_writer(table.storage, writer_id)

    def check_alive(self, table: HudiTable, t: InstantTime) -> None:
        # The incarnation first: a writer replaced by a newer one (a standby that took over)
        # is told FencedError, the cause, rather than that its heartbeat was rolled back.
        if self.incarnation is None:
            raise FencedError(f"writer {self.writer_id} never claimed its incarnation")
        self.incarnation.check()
        super().check_alive(table, t)
