"""The Spark keys: master, settings, what makes a start lighter, trigger and checkpoint."""

from __future__ import annotations

from lakesink.config.parsers import (
    Key,
    boolean,
    choice,
    non_negative_float,
    optional_str,
    positive_int,
    settings_list,
)

SPARK_KEYS: tuple[Key, ...] = (
    Key("spark.master", str, "local[2]", "Spark master URL."),
    Key(
        "spark.conf",
        settings_list,
        None,
        "Extra Spark settings, 'k=v,k=v'; a value may hold commas "
        "(spark.jars=a.jar,b.jar): a new setting starts only at ',name='.",
    ),
    Key(
        "spark.class.archive",
        boolean,
        True,
        "Start Spark's driver JVM from a class-data archive of its classes (Java's AppCDS): "
        "a start takes about half the time and CPU. The first run on a machine writes the "
        "archive (~150 MB) as its JVM exits; false: never write or use one.",
    ),
    Key(
        "spark.python.workers.compiled",
        boolean,
        True,
        "Spark's Python workers import pyspark compiled once from this interpreter's "
        "site-packages, not from Spark's pyspark.zip (compiled again by every worker); local "
        "masters with Spark from pip only; false: Spark's own worker path.",
    ),
    Key(
        "spark.python.workers.warmup",
        boolean,
        True,
        "While an ingestion starts its streaming query, a background Spark job (once per Spark "
        "application) starts a Python worker per task slot and imports what the tasks need, "
        "so the first batch does not wait for them; false: the first batch starts them.",
    ),
    Key(
        "spark.driver.jit",
        choice("auto", "quick", "full"),
        "auto",
        "How the driver JVM that lakesink starts compiles Spark's code: quick (the client "
        "compiler only, -XX:TieredStopAtLevel=1), full (Java's default tiered compilation), or "
        "auto: quick, except for an ingestion whose batches go through a Spark DataFrame "
        "(write.path, transform.sql, transform.python), where the JVM works per row and the "
        "full compiler's code wins over a long run. On the direct path quick halved the "
        "JVM's CPU over the first 40 micro-batches and stayed below full after "
        "(benchmarks/README.md). In local mode the driver also runs the tasks. Your own -XX "
        "flags in spark.driver.extraJavaOptions come after and win; a SparkSession you start "
        "yourself is not changed.",
    ),
    Key(
        "spark.start.cache.dir",
        str,
        "~/.cache/lakesink/spark",
        "Folder of what makes Spark start faster: the class-data archives (one per Java, Spark "
        "and class path) and the Python workers' interpreter script.",
    ),
    Key(
        "trigger.interval.s",
        non_negative_float,
        5.0,
        "Seconds between micro-batch starts. 0: the next micro-batch starts as soon as the "
        "last one has committed (the freshest table; with nothing new in Kafka, the end "
        "offsets are asked again every trigger.idle.poll.ms). A batch that takes longer than "
        "the interval is followed at once by the next.",
    ),
    Key(
        "trigger.idle.poll.ms",
        positive_int,
        100,
        "With trigger.interval.s=0: how long a caught-up ingestion waits before asking Kafka "
        "for new records again (Spark's streaming polling delay). Lower: fresher tables, more "
        "CPU and broker requests while idle.",
    ),
    Key(
        "checkpoint.location",
        optional_str,
        None,
        "Spark checkpoint, always on a local (or Hadoop) file system (default: "
        "<table.path>/.hoodie/.lakesink/checkpoints/<writer.id> for a local table, "
        "~/.lakesink/checkpoints/<bucket>/<prefix>/<writer.id> for a table on an object store: "
        "the table is the source of truth, a lost checkpoint loses nothing).",
    ),
)
