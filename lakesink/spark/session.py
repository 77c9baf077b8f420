"""SparkSession set-up for lakesink: sane local defaults and the lakesink data sources."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping

from pyspark import SparkContext
from pyspark.sql import SparkSession

from lakesink.config import LakesinkConfig, SparkStart

SESSION_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # With a byte limit, Spark sizes the Arrow batch it feeds mapInArrow after EVERY row, and
    # for list columns (kafka_headers) that costs O(rows) each time: O(n^2) per batch, half of
    # the JVM's CPU in the profile. Int.MaxValue turns the check off; batches are still capped
    # by spark.sql.execution.arrow.maxRecordsPerBatch.
    "spark.sql.execution.arrow.maxBytesPerBatch": "2147483647",
    "spark.python.worker.reuse": "true",
    "spark.sql.streaming.stopGracefullyOnShutdown": "true",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.memory": "2g",
    "spark.ui.showConsoleProgress": "false",
    # A Python worker (the Kafka source's planner included) that cannot connect back and
    # authenticate within Spark's default 15 s fails the query: seen on a 2-core machine under
    # load (the packaging check's demo beside the test suite). Waiting longer costs nothing when
    # the JVM answers at once.
    "spark.python.authenticate.socketTimeout": "120s",
    # Stay on loopback: lakesink never needs another interface.
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def get_spark(
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    app_name: str = "lakesink",
    start: SparkStart | None = None,
) -> SparkSession:
    """Create (or reuse) the session and register the lakesink data sources on it.
    `start`: the lighter start (spark.class.archive, spark.python.workers.compiled,
    spark.driver.jit) for a call that launches the JVM; None starts Spark as it comes."""
    from pyspark import SparkContext

    from lakesink.spark.class_archive import class_archive_for, with_java_options
    from lakesink.spark.worker_python import WORKER_PYTHON_ENV, compiled_worker_python

    settings = {**SESSION_DEFAULTS, **(conf or {})}
    archive = None
    if start is not None and SparkContext._gateway is None:
        if start.compiled_workers:
            worker_python = compiled_worker_python(start.cache_dir, master)
            if worker_python is not None:
                os.environ[WORKER_PYTHON_ENV] = worker_python
        settings = with_driver_jit(settings, start.jit)
        if start.class_archive:
            archive = class_archive_for(start.cache_dir, settings)
            if archive is not None:
                settings = with_java_options(settings, archive)
    # Executors must run the same interpreter as the driver (the project's virtualenv).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name)
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    if archive is not None:
        archive.promote_when_the_jvm_exits(spark)
    spark.sparkContext.setLogLevel("ERROR")
    _checkpoint_without_forks(spark)
    register_sources(spark)
    return spark


# The client compiler only. Over a micro-batch pipeline's first ~40 batches most of the driver
# JVM's CPU on the direct path was C2 compiling Spark's planning and scheduling code; C1 alone
# halved the JVM's CPU there and stayed below tiered compilation's per-batch cost after. On the
# DataFrame path, where the JVM converts every row, C2's code was faster by the 40th batch.
QUICK_JIT_OPTION = "-XX:TieredStopAtLevel=1"


def with_driver_jit(settings: Mapping[str, str], jit: str) -> dict[str, str]:
    """`settings` with spark.driver.jit's JVM option (auto counts as quick: a start that is no
    ingestion runs briefly) placed before the user's own driver options (the JVM takes the
    last of a repeated -XX flag: the user's wins)."""
    from lakesink.spark.class_archive import with_driver_java_options

    if jit in ("quick", "auto"):
        return with_driver_java_options(settings, before=QUICK_JIT_OPTION)
    return dict(settings)


def ingestion_spark_start(cfg: LakesinkConfig) -> SparkStart:
    """The Spark start of an ingestion of `cfg`: spark.driver.jit=auto is quick when its
    batches take the direct path, full when they go through a DataFrame."""
    from lakesink.spark.direct import uses_direct_path

    start = cfg.spark_start
    if start.jit != "auto":
        return start
    return dataclasses.replace(start, jit="quick" if uses_direct_path(cfg) else "full")


_CHECKPOINT_MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"
# Where Spark versions keep the checkpoint manager on Hadoop's FileSystem API.
_FILE_SYSTEM_CHECKPOINT_MANAGERS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager",
)


def _checkpoint_without_forks(spark: SparkSession) -> None:
    """Spark's default checkpoint manager on a local disk renames through Hadoop's FileContext,
    which without Hadoop's native library asks a forked `readlink` for every file status: 16
    process starts per micro-batch, from a JVM of gigabytes. The FileSystem-based manager
    renames the same files with rename(2), atomic on a local disk and on HDFS (lakesink keeps
    checkpoints on neither an object store nor anything else). A user's own choice stands."""
    from py4j.protocol import Py4JJavaError

    if spark.conf.get(_CHECKPOINT_MANAGER_KEY, None):
        return
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    for name in _FILE_SYSTEM_CHECKPOINT_MANAGERS:
        try:
            jvm.java.lang.Class.forName(name)
        except Py4JJavaError:  # ClassNotFoundException: another Spark's package
            continue
        spark.conf.set(_CHECKPOINT_MANAGER_KEY, name)
        return


def use_driver_python(spark: SparkSession) -> None:
    """On a local master, Spark's Python workers run this driver's interpreter unless the user
    chose one (PYSPARK_PYTHON, spark.pyspark.python). Otherwise a virtualenv's python run
    without activating it (or a notebook kernel) has workers start `python3` from PATH, which
    has no lakesink. A cluster's workers run what its configuration says."""
    sc = spark.sparkContext
    if not (sc.master or "").startswith("local"):
        return
    if os.environ.get("PYSPARK_PYTHON") or sc.getConf().get("spark.pyspark.python"):
        return
    # read by PySpark whenever it hands a Python function (a data source, a mapInArrow or
    # mapPartitions function) to the JVM
    sc.pythonExec = sys.executable


WORKER_CHECK_TIMEOUT_S = 180.0
"""How long the check of a cluster's workers waits for its one task (executors to start)."""

_workers_checked: set[str] = set()  # application ids whose workers imported lakesink


def on_a_cluster(sc: SparkContext) -> bool:
    """Whether `sc`'s workers run on a cluster's hosts (a master that is not local)."""
    return not (sc.master or "").startswith("local")


def check_workers_import_lakesink(
    spark: SparkSession, *, timeout_s: float = WORKER_CHECK_TIMEOUT_S
) -> None:
    """On a cluster (a master that is not local), before anything is created: one tiny task
    imports lakesink on a worker. A worker Python without it otherwise fails the first batch,
    after the table was created, inside a long traceback; here it is one ConfigError naming
    spark.pyspark.python / PYSPARK_PYTHON. Once per application; local masters need no check
    (their workers run the driver's interpreter: `use_driver_python`)."""
    import threading

    from py4j.protocol import Py4JJavaError

    from lakesink.errors import ConfigError

    sc = spark.sparkContext
    if not on_a_cluster(sc) or sc.applicationId in _workers_checked:
        return

    def probe(_: object) -> tuple[str, str]:  # runs on a worker: pickled by value
        import importlib
        import sys as worker_sys

        try:  # by name: what the worker imports, not an import of this module's
            importlib.import_module("lakesink")
        except Exception as e:
            return worker_sys.executable, f"{type(e).__name__}: {e}"
        return worker_sys.executable, ""

    group = f"lakesink-worker-check-{sc.applicationId}"
    outcome: list[object] = []

    def run() -> None:
        sc.setJobGroup(group, "lakesink: can a worker import lakesink?", interruptOnCancel=True)
        try:
            outcome.append(sc.parallelize([0], 1).map(probe).collect()[0])
        except Exception as e:
            outcome.append(e)

    worker_python = sc.getConf().get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
    fix = (
        "set spark.pyspark.python (in spark.conf) or PYSPARK_PYTHON to a Python that has "
        "lakesink installed on every worker host"
    )
    thread = threading.Thread(target=run, name="lakesink-worker-check", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        sc.cancelJobGroup(group)
        raise ConfigError(
            f"no worker of {sc.master} ran lakesink's check task in {timeout_s:g}s (no executors "
            "started: free cores and memory on the cluster?); if the workers' Python lacks "
            f"lakesink, {fix}"
        )
    result = outcome[0] if outcome else None
    if isinstance(result, tuple) and not result[1]:
        _workers_checked.add(sc.applicationId)
        return
    if isinstance(result, tuple):
        where, why = result[0], result[1]
    else:
        where = worker_python or "the workers' python3"
        text = str(result.java_exception) if isinstance(result, Py4JJavaError) else str(result)
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        why = next((ln for ln in lines if "Error" in ln and "at " not in ln[:3]), "")
        why = why or (lines[0] if lines else type(result).__name__)
    cannot = f"the Spark workers of {sc.master} cannot import lakesink with {where}"
    raise ConfigError(f"{cannot} ({why[:300]}): {fix}")


def register_sources(spark: SparkSession) -> None:
    """lakesink's data sources (`lakesink-kafka`, `lakesink`) on `spark`, its Python workers
    running the driver's interpreter on a local master (`use_driver_python`)."""
    from lakesink.spark.source import KafkaDataSource
    from lakesink.spark.table_source import LakesinkTableSource

    use_driver_python(spark)

    spark.dataSource.register(KafkaDataSource)
    spark.dataSource.register(LakesinkTableSource)
