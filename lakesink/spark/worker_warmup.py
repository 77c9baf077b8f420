"""Start Spark's Python workers while the driver is still setting up a streaming query.

The first batch of a fresh Spark waits for its Python workers: each task slot forks a worker
that imports what a lakesink task needs (pyarrow and its Parquet writer, confluent-kafka,
lakesink's reader, decoders and writers) before it reads a record. On a 2-core machine the
first batch's tasks took 4.6-5.3 s against 1.1-1.3 s for the next ones. Meanwhile the driver
spends seconds starting the streaming query (Kafka checks, the source, the first trigger),
with the task slots idle. `WorkerWarmup.start` runs, in a background thread, one job of one
task per slot that only imports those modules; Spark keeps each worker for reuse
(`spark.python.worker.reuse`, on by default), so the first batch's tasks find them ready
(2.9-3.1 s in the same runs). Once per Spark application; best effort: a failure is logged
and changes nothing else. `stop` cancels a warm-up still running (a run that ends early), so
that stopping Spark never kills a worker mid-task.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

JOB_GROUP = "lakesink-worker-warmup"
# What a direct-path task and the source's reader import (spark/direct.py, spark/source.py);
# the table format's own task modules come from its plugin (FormatPlugin.task_modules)
TASK_MODULES = (
    "pyarrow.parquet",
    "confluent_kafka",
    "lakesink.kafka.deserializers",
    "lakesink.kafka.reader",
    "lakesink.spark.source",
    "lakesink.spark.direct",
    "lakesink.spark.task_writer",
)
_STOP_WAIT_S = 10.0
_warmed: set[str] = set()  # Spark applications whose workers were warmed (or are being)
_lock = threading.Lock()


def import_task_modules(
    _partition: Iterable[int], modules: Sequence[str] = TASK_MODULES
) -> Iterator[int]:
    """The warm-up task: import the task modules in this worker (kept for reuse)."""
    for name in modules:
        importlib.import_module(name)
    yield 1


class WorkerWarmup:
    """The warm-up job of one Spark application, run in a daemon thread."""

    def __init__(self, spark: SparkSession, modules: Sequence[str] = TASK_MODULES) -> None:
        self.spark = spark
        self.modules = tuple(modules)
        self.thread = threading.Thread(target=self._run, name=JOB_GROUP, daemon=True)

    @classmethod
    def start(cls, spark: SparkSession, format_modules: Sequence[str] = ()) -> WorkerWarmup | None:
        """Start the warm-up unless this application already had one (None then);
        `format_modules`: what the table format's task target imports, besides TASK_MODULES."""
        app = spark.sparkContext.applicationId
        with _lock:
            if app in _warmed:
                return None
            _warmed.add(app)
        warmup = cls(spark, (*TASK_MODULES, *format_modules))
        warmup.thread.start()
        return warmup

    def _run(self) -> None:
        sc = self.spark.sparkContext
        try:
            slots = max(1, sc.defaultParallelism)
            sc.setJobGroup(JOB_GROUP, "lakesink: start Python workers", interruptOnCancel=True)
            task = functools.partial(import_task_modules, modules=self.modules)
            sc.parallelize(range(slots), slots).mapPartitions(task).collect()
        except Exception as e:  # cancelled, a stopped session, a cluster without lakesink
            log.debug("Python worker warm-up did not finish: %s", e)

    def stop(self) -> None:
        """Cancel the warm-up if it still runs, and wait (briefly) for its thread."""
        if not self.thread.is_alive():
            return
        try:
            self.spark.sparkContext.cancelJobGroup(JOB_GROUP)
        except Exception as e:  # the session is already gone
            log.debug("cancelling the Python worker warm-up: %s", e)
        self.thread.join(_STOP_WAIT_S)
