"""A warm standby of one writer (`lakesink ingest --standby`): a second process for the same
configuration and writer id that starts Spark, warms it (Python workers up, lakesink imported
in them), then watches the active writer's liveness file. When the active writer has stopped
(cleanly, or its liveness lapsed: killed, hung, paused) the standby takes ownership of the
file and runs the normal ingestion from there: it claims the writer id (fencing the old
process out of the table), rolls back the failed instant and resumes from the committed
offsets, as on any restart, without paying for the JVM and the workers again.

The liveness file is beside the writer's other state on the table's storage
(lakesink.spark.liveness_file), so it works on an object store too.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakesink.config import LakesinkConfig
from lakesink.engine.liveness import LivenessWatch, Takeover
from lakesink.formats import FORMAT_KEY
from lakesink.spark.liveness_file import liveness_key, liveness_storage

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

REWARM_EVERY_S = 20.0
"""How often a waiting standby runs its tiny job again: Spark stops Python workers that sat
idle for a minute, and a restarted worker would import lakesink again on the takeover."""


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


WARM_BATCH_RECORDS = 1000
WARM_TIMEOUT_S = 120.0


def warm_stream(cfg: LakesinkConfig, spark: SparkSession) -> float | None:
    """Run the ingestion's own streaming query once, on a scratch table: one small batch of
    the configured topics (read from the earliest offsets, at most WARM_BATCH_RECORDS),
    transformed and written as the writer would, into a throwaway Hudi table with its own
    writer id and checkpoint, then stopped and deleted. It loads and compiles what the
    query needs in the JVM, starts the callback server of `foreachBatch` and opens Kafka in
    the Python workers, so that the takeover pays none of it. Nothing leaves the scratch
    folder: dead letters go to a scratch table, no metrics are served. Seconds it took, or
    None if no batch ran (an empty topic) or it failed (logged; the standby still works)."""
    from lakesink.spark.pipeline import Ingestion

    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="lakesink-standby-warmup-"))
    overrides: dict[str, Any] = {
        "table.path": str(scratch / "table"),
        FORMAT_KEY: "hudi",  # a throwaway Hudi table, whatever the format written
        "checkpoint.location": str(scratch / "checkpoint"),
        "writer.id": f"{cfg.writer_id[:100]}.standby-warmup",
        "kafka.starting.offsets": "earliest",
        "kafka.max.records.per.batch": WARM_BATCH_RECORDS,
        "commit.mode": "sync",
        "lock.provider": "filesystem",
        "metrics.port": None,
        "table.services.inline.every.commits": 0,
        "errors.deadletter.topic": None,
        "errors.deadletter.table": (
            str(scratch / "dead-letters")
            if cfg["errors.deadletter.topic"] or cfg["errors.deadletter.table"]
            else None
        ),
    }
    ran = threading.Event()
    try:
        ingestion = Ingestion(cfg.with_overrides(overrides), spark)

        def first_batch(_progress: object) -> None:
            ran.set()
            ingestion.stop()

        def run() -> None:
            try:
                ingestion.run()
            except Exception as e:
                log.warning("writer %s: the standby's warm-up query failed: %s", cfg.writer_id, e)

        ingestion.on_progress = first_batch
        runner = threading.Thread(target=run, name="lakesink-standby-warmup", daemon=True)
        runner.start()
        ran.wait(WARM_TIMEOUT_S)
        ingestion.stop()
        runner.join(WARM_TIMEOUT_S)
        ingestion.close()
    except Exception as e:  # best effort: a cold takeover is still a takeover
        log.warning("writer %s: the standby's warm-up query failed: %s", cfg.writer_id, e)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return time.monotonic() - started if ran.is_set() else None


class Standby:
    """Waits, warm, until this standby owns the writer's liveness (`wait()`)."""

    def __init__(self, cfg: LakesinkConfig, spark: SparkSession) -> None:
        self.cfg = cfg
        self.spark = spark
        self.watch = LivenessWatch(
            liveness_storage(cfg),
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
        """Warm Spark: the ingestion's query once on a scratch table, and the Python
        workers (seconds it took)."""
        started = time.monotonic()
        if self.cfg["standby.warmup.query"]:
            warm_stream(self.cfg, self.spark)
        warm_up(self.spark)
        took = time.monotonic() - started
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
