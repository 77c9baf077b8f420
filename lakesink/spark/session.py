"""SparkSession set-up for lakesink: sane local defaults and the lakesink data sources."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from lakesink.config import SparkStart

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
    `start`: the lighter start (spark.class.archive, spark.python.workers.compiled) for a call
    that launches the JVM; None starts Spark as it comes."""
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
    register_sources(spark)
    return spark


def register_sources(spark: SparkSession) -> None:
    from lakesink.spark.source import KafkaDataSource
    from lakesink.spark.table_source import LakesinkTableSource

    spark.dataSource.register(KafkaDataSource)
    spark.dataSource.register(LakesinkTableSource)
