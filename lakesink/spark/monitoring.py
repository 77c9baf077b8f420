"""Lag readings for the metrics: the high watermark of every ingested partition, read from the
brokers every `metrics.lag.interval.s` on a thread of the driver, beside each table's committed
offsets (updated after every batch); the gauges carry the table's label."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from lakesink.config import LakesinkConfig
from lakesink.engine.coordinator import Coordinator
from lakesink.errors import LakesinkError
from lakesink.metrics import IngestionMetrics
from lakesink.protocol.offsets import TopicPartition

log = logging.getLogger(__name__)


class LagMonitor:
    """Keeps the partition gauges (committed offset, high watermark, lag) of one ingestion,
    per table."""

    def __init__(
        self,
        cfg: LakesinkConfig,
        coordinators: Callable[[], Sequence[Coordinator]],
        metrics: IngestionMetrics,
        partitions: list[TopicPartition],
    ) -> None:
        """`coordinators()`: the tables' coordinators now (a many-table ingestion adds its
        dynamic tables as they are created); each records into its own metrics view."""
        self.cfg = cfg
        self.coordinators = coordinators
        self.metrics = metrics
        self.partitions = list(partitions)
        self.interval_s: float = cfg["metrics.lag.interval.s"]
        self._marks: dict[TopicPartition, int] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> LagMonitor:
        self._thread = threading.Thread(target=self._run, name="lakesink-lag", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None

    def committed_changed(self) -> None:
        """After a batch: the committed offsets moved; the lag follows at once."""
        self._publish()

    def _run(self) -> None:
        from lakesink.kafka.client import OffsetClient

        client: Any = None
        try:
            while not self._stop.is_set():
                try:
                    if client is None:
                        client = OffsetClient(
                            self.cfg["kafka.bootstrap.servers"],
                            isolation_level=self.cfg["kafka.isolation.level"],
                            extra=self.cfg.consumer_config,
                        )
                    marks = client.watermarks(self.partitions)
                    with self._lock:
                        self._marks = {tp: hi for tp, (_lo, hi) in marks.items()}
                    self._publish()
                except LakesinkError as e:  # a broker hiccup: the next reading tries again
                    log.warning(
                        "writer %s: cannot read high watermarks for the lag metrics: %s",
                        self.cfg.writer_id,
                        e,
                    )
                self._stop.wait(self.interval_s)
        finally:
            if client is not None:
                client.close()

    def _publish(self) -> None:
        with self._lock:
            marks = dict(self._marks)
        for coordinator in self.coordinators():
            committed = coordinator.committed
            metrics = coordinator.metrics or self.metrics
            for tp in sorted(set(marks) | set(committed.next_offsets), key=lambda p: p.key()):
                metrics.set_partition(tp.topic, tp.partition, committed.get(tp), marks.get(tp))
