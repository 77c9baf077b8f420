"""The coordinator's commit services built from configuration: the table lock, instant times
and heartbeats of `StandaloneServices`, plus writer-id fencing for a streaming writer."""

from __future__ import annotations

from lakesink.concurrency.heartbeat import WriterIncarnation, claim_writer
from lakesink.config import LakesinkConfig
from lakesink.errors import FencedError
from lakesink.protocol.instant import InstantTime
from lakesink.services.host import StandaloneServices, lock_and_heartbeat_options
from lakesink.table.hudi_table import HudiTable


class ConfiguredCommitServices(StandaloneServices):
    """Real locks, heartbeats and fencing, as `lock.*` and `heartbeat.*` configure them."""

    def __init__(self, cfg: LakesinkConfig) -> None:
        super().__init__(
            cfg.table_storage, writer_id=cfg.writer_id, **lock_and_heartbeat_options(cfg)
        )
        self.cfg = cfg
        self.incarnation: WriterIncarnation | None = None

    def claim(self, table: HudiTable, writer_id: str) -> None:
        self.incarnation = claim_writer(table.storage, writer_id)

    def check_alive(self, table: HudiTable, t: InstantTime) -> None:
        super().check_alive(table, t)
        if self.incarnation is None:
            raise FencedError(f"writer {self.writer_id} never claimed its incarnation")
        self.incarnation.check()
