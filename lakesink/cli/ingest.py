"""`lakesink ingest`: run the streaming ingestion, showing progress."""

from __future__ import annotations

import sys

from lakesink.cli.output import say
from lakesink.config import LakesinkConfig
from lakesink.spark.pipeline import IngestionResult, Progress


def progress_printer() -> object:
    tty = sys.stdout.isatty()

    def show(p: Progress) -> None:
        lag = "" if p.lag is None else f"  lag {p.lag:,}"
        o = p.outcome
        line = (
            f"batch {o.batch_id}: instant {o.instant_time}  +{o.records:,} rec  "
            f"total {p.total_records:,}  {p.records_per_s:,.0f} rec/s{lag}"
        )
        if tty:
            sys.stdout.write("\r\033[K" + line)
            sys.stdout.flush()
        else:
            say(line)

    return show


def ingest(cfg: LakesinkConfig, *, once: bool) -> IngestionResult:
    from lakesink.spark.pipeline import Ingestion
    from lakesink.spark.session import get_spark

    spark = get_spark(cfg["spark.master"], cfg.spark_conf)
    ingestion = Ingestion(cfg, spark, on_progress=progress_printer())  # type: ignore[arg-type]
    result = ingestion.run(once=once)
    if sys.stdout.isatty():
        sys.stdout.write("\n")
    return result


def check_brokers(cfg: LakesinkConfig) -> None:
    """Before Spark starts: the brokers accept our credentials, show us the topics and let us
    read them (and write the dead-letter topic). A refusal is then one line within about a
    second, not a failed Spark job."""
    from lakesink.kafka.client import check_topic_access
    from lakesink.spark.pipeline import high_watermarks

    marks = high_watermarks(cfg)
    bootstrap, extra = cfg["kafka.bootstrap.servers"], cfg.kafka_client_config
    topics = sorted({tp.topic for tp in marks})
    check_topic_access(bootstrap, topics, ["READ"], purpose="to ingest it", extra=extra)
    if cfg["errors.deadletter.topic"]:
        check_topic_access(
            bootstrap,
            [cfg["errors.deadletter.topic"]],
            ["WRITE"],
            purpose="errors.deadletter.topic",
            extra=extra,
        )


def run_ingest(cfg: LakesinkConfig, *, once: bool) -> int:
    check_brokers(cfg)
    say(
        f"lakesink: ingesting {', '.join(cfg['kafka.topics']) or cfg['kafka.topic.pattern']} "
        f"into {cfg['table.path']} as writer {cfg.writer_id}"
    )
    result = ingest(cfg, once=once)
    say(
        f"lakesink: {result.records:,} records in {result.batches} commits, "
        f"{result.elapsed_s:.1f}s; committed offsets {result.committed}"
    )
    return 0
