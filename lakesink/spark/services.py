"""The coordinator's commit services built from configuration: lock provider, instant-time
generator, heartbeats of inflight instants and writer-id fencing."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

from lakesink.concurrency.heartbeat import (
    Heartbeat,
    WriterIncarnation,
    claim_writer,
    heartbeat_expired,
)
from lakesink.concurrency.instant_time import InstantTimeGenerator
from lakesink.concurrency.lock import LockLease, make_lock_provider
from lakesink.config import LakesinkConfig
from lakesink.errors import FencedError
from lakesink.protocol.instant import InstantTime
from lakesink.spark.coordinator import CommitServices
from lakesink.table.hudi_table import HudiTable


class ConfiguredCommitServices(CommitServices):
    """Real locks, heartbeats and fencing, as `lock.*` and `heartbeat.*` configure them."""

    def __init__(self, cfg: LakesinkConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.owner = f"{cfg.writer_id}@{socket.gethostname()}:{os.getpid()}"
        self.lock = make_lock_provider(
            cfg["lock.provider"],
            owner=self.owner,
            table_base_path=cfg["table.path"],
            dsn=cfg["postgres.dsn"],
            lease_s=cfg["lock.lease.s"],
        )
        self.generator = InstantTimeGenerator()
        self.heartbeats: dict[str, Heartbeat] = {}
        self.incarnation: WriterIncarnation | None = None
        self._lease: LockLease | None = None

    def claim(self, table: HudiTable, writer_id: str) -> None:
        self.incarnation = claim_writer(table.base_path, writer_id)

    @contextlib.contextmanager
    def locked(self, table: HudiTable) -> Iterator[LockLease]:
        with self.lock.locked(self.cfg["lock.timeout.s"]) as lease:
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
            table.base_path,
            t,
            writer_id=self.cfg.writer_id,
            interval_s=self.cfg["heartbeat.interval.s"],
            tolerance_s=self.cfg["heartbeat.tolerance.s"],
        )
        self.heartbeats[t.value] = hb.start()

    def stop_heartbeat(self, table: HudiTable, t: InstantTime) -> None:
        hb = self.heartbeats.pop(t.value, None)
        if hb is not None:
            hb.stop(delete=True)

    def heartbeat_expired(self, table: HudiTable, t: InstantTime) -> bool:
        return heartbeat_expired(table.base_path, t, self.cfg["heartbeat.tolerance.s"])

    def check_alive(self, table: HudiTable, t: InstantTime) -> None:
        if self._lease is not None:
            self._lease.check()
        hb = self.heartbeats.get(t.value)
        if hb is not None:
            hb.check()
        if self.incarnation is None:
            raise FencedError(f"writer {self.cfg.writer_id} never claimed its incarnation")
        self.incarnation.check()
