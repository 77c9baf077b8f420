"""A warm standby of one writer (`lakesink ingest --standby`): a second process for the same
configuration and writer id that starts Spark, warms it (Python workers up, lakesink imported
in them), then watches the active writer's liveness file. When the active writer has stopped
(cleanly, or its liveness lapsed: killed, hung, paused) the standby takes ownership of the
file and runs the normal ingestion from there: it claims the writer id (fencing the old
process out of the table), rolls back the failed instant and resumes from the committed
offsets, as on any restart, without paying for the JVM and the workers again.

The liveness file is beside the writer's other state on the table's storage (so it works on
an object store too): `.hoodie/.lakesink/liveness/<writer>.json` in a Hudi table,
`.lakesink/liveness/<namespace>.<table>/<writer>.json` in an Iceberg warehouse.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from lakesink.concurrency.liveness import LivenessWatch, Takeover, WriterLiveness
from lakesink.config import LakesinkConfig

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

REWARM_EVERY_S = 20.0
"""How often a waiting standby runs its tiny job again: Spark stops Python workers that sat
idle for a minute, and a restarted worker would import lakesink again on the takeover."""


def liveness_key(cfg: LakesinkConfig) -> str:
    """Where the writer's liveness file is on the table's storage (cfg.table_storage)."""
    if cfg["table.format"] == "iceberg":
        namespace = str(cfg["iceberg.namespace"] or "lakesink")
        return f".lakesink/liveness/{namespace}.{cfg.table_name}/{cfg.writer_id}.json"
    return f".hoodie/.lakesink/liveness/{cfg.writer_id}.json"


def writer_liveness(cfg: LakesinkConfig) -> WriterLiveness:
    """The active writer's liveness (not started yet)."""
    return WriterLiveness(
        cfg.table_storage,
        liveness_key(cfg),
        writer_id=cfg.writer_id,
        interval_s=cfg["standby.liveness.interval.s"],
    )


def _warm_worker(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    # What a sink task imports: loaded once per reused worker, here rather than on takeover.
    import lakesink.kafka.reader
    import lakesink.spark.direct
    import lakesink.spark.source
    import lakesink.spark.task_writer  # noqa: F401

    yield from batches


def warm_up(spark: SparkSession) -> float:
    """Run a tiny job with one task per core, so every Python worker is started, reused
    afterwards (spark.python.worker.reuse) and has lakesink imported. Seconds it took."""
    started = time.monotonic()
    cores = max(1, spark.sparkContext.defaultParallelism)
    spark.range(0, cores, numPartitions=cores).mapInArrow(_warm_worker, "id long").collect()
    return time.monotonic() - started


class Standby:
    """Waits, warm, until this standby owns the writer's liveness (`wait()`)."""

    def __init__(self, cfg: LakesinkConfig, spark: SparkSession) -> None:
        self.cfg = cfg
        self.spark = spark
        self.watch = LivenessWatch(
            cfg.table_storage,
            liveness_key(cfg),
            writer_id=cfg.writer_id,
            interval_s=cfg["standby.liveness.interval.s"],
            lapse_s=cfg["standby.takeover.after.s"],
        )

    @property
    def watched(self) -> str:
        """The liveness file watched, for messages."""
        return f"{self.watch.storage.uri.rstrip('/')}/{self.watch.key}"

    def warm(self) -> float:
        """Warm Spark's Python workers (seconds it took)."""
        took = warm_up(self.spark)
        log.info("writer %s: standby warm in %.1fs; watching %s", self.cfg.writer_id, took,
                 self.watched)  # fmt: skip
        return took

    def wait(self, stop: threading.Event | None = None) -> Takeover | None:
        """Watch (warm: call `warm()` first) until the takeover is won (returned) or `stop` is
        set (None). The caller runs the ingestion with `takeover.liveness` as its liveness."""
        stop = stop or threading.Event()
        while not stop.is_set():
            takeover = self.watch.wait(stop, timeout_s=REWARM_EVERY_S)
            if takeover is not None:
                return takeover
            if not stop.is_set():
                warm_up(self.spark)
        return None
