"""`lakesink ingest`: run the streaming ingestion, showing progress."""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from lakesink.config import LakesinkConfig
from lakesink.console import say
from lakesink.spark.pipeline import IngestionResult, Progress

if TYPE_CHECKING:
    from lakesink.protocol.offsets import TopicPartition
    from lakesink.spark.sink import BatchSteps


def steps_text(steps: BatchSteps | None) -> str:
    """The progress line's tail on where the batch's time went: seconds per step and the
    wall-clock time (local, to the millisecond) at which it was published."""
    if steps is None:
        return ""
    took = ", ".join(f"{name} {secs:.2f} s" for name, secs in steps.durations().items())
    at = time.strftime("%H:%M:%S", time.localtime(steps.published))
    return f"  ({took}; published {at}.{int(steps.published * 1000) % 1000:03d})"


def progress_printer() -> object:
    tty = sys.stdout.isatty()

    def show(p: Progress) -> None:
        lag = "" if p.lag is None else f"  lag {p.lag:,}"
        o = p.outcome
        line = (
            f"batch {o.batch_id}: instant {o.instant_time}  +{o.records:,} rec  "
            f"total {p.total_records:,}  {p.records_per_s:,.0f} rec/s{lag}{steps_text(p.steps)}"
        )
        if tty:
            sys.stdout.write("\r\033[K" + line)
            sys.stdout.flush()
        else:
            say(line)

    return show


def ingest(
    cfg: LakesinkConfig,
    *,
    once: bool,
    debug: bool = False,
    partitions: list[TopicPartition] | None = None,
    standby: bool = False,
) -> IngestionResult | None:
    """Runs the ingestion. Spark's own log lines (a failed task's Python and Java stack, the
    query's termination) stay off unless `debug`: the error lakesink raises names what failed.
    `partitions`: what check_kafka(cfg) returned just before, so the brokers are asked once.
    `standby`: first wait, warm, until the active writer stops (None if SIGTERM came first).
    SIGTERM, or a first Ctrl-C (SIGINT), ends the ingestion after the batch in flight and hands
    over to a standby; a second Ctrl-C stops at once."""
    from lakesink.spark.pipeline import Ingestion, check_kafka
    from lakesink.spark.session import get_spark, ingestion_spark_start
    from lakesink.spark.standby import Standby

    if partitions is None:
        # before Spark starts: a refused broker or a missing topic is one line
        partitions = check_kafka(cfg)
    spark = get_spark(cfg["spark.master"], cfg.spark_conf, start=ingestion_spark_start(cfg))
    spark.sparkContext.setLogLevel("WARN" if debug else "OFF")
    ingestion = Ingestion(
        cfg,
        spark,
        on_progress=progress_printer(),  # type: ignore[arg-type]
        partitions=partitions,
    )
    stop = threading.Event()

    def on_sigterm(_signum: int, _frame: object) -> None:
        stop.set()
        ingestion.stop()

    def on_sigint(signum: int, frame: object) -> None:
        # Ctrl-C: as SIGTERM, once; a second one stops at once (exit 130, nothing lost: the
        # next start recovers the batch in flight as after a crash)
        if stop.is_set():
            raise KeyboardInterrupt
        say("lakesink: stopping after the batch in flight (Ctrl-C again to stop now)")
        on_sigterm(signum, frame)

    main_thread = threading.current_thread() is threading.main_thread()
    # installed after Spark's context, whose own SIGINT handler cancels every job at once
    previous = signal.signal(signal.SIGTERM, on_sigterm) if main_thread else None
    previous_int = signal.signal(signal.SIGINT, on_sigint) if main_thread else None
    try:
        liveness = None
        if standby:
            waiting = Standby(cfg, spark)
            took = waiting.warm()
            say(f"lakesink: standby warm ({took:.1f}s); watching {waiting.watched}")
            takeover = waiting.wait(stop)
            if takeover is None:
                say(f"lakesink: standby of writer {cfg.writer_id} stopped before taking over")
                return None
            say(
                f"lakesink: standby taking over writer {cfg.writer_id} on {cfg['table.path']}: "
                f"{takeover.reason}"
            )
            liveness = takeover.liveness
        url = ingestion.serve_metrics()
        if url:
            say(f"lakesink: metrics at {url}")
        result = ingestion.run(once=once, liveness=liveness)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)
        ingestion.close()
    if sys.stdout.isatty():
        sys.stdout.write("\n")
    return result


def check_local_paths(cfg: LakesinkConfig) -> None:
    """Before anything starts: each local directory the writer creates or opens (the table,
    the dead-letter table, the checkpoint) is a directory or can become one; a path that is a
    file (or lies under one) is one line naming the key, not an error once Spark runs."""
    from pathlib import Path

    from lakesink.errors import ConfigError
    from lakesink.security import expand_user
    from lakesink.storage import LocalStorage, is_remote_uri, open_storage

    paths = [(key, cfg[key]) for key in ("table.path", "errors.deadletter.table")]
    paths += [(f"tables.{s.name}.table.path", t["table.path"]) for s, t in cfg.table_configs()]
    paths.append(("checkpoint.location", cfg["checkpoint.location"]))
    for key, value in paths:
        if not value or is_remote_uri(str(value)):
            continue
        storage = open_storage(str(value)) if key != "checkpoint.location" else None
        path = storage.root if isinstance(storage, LocalStorage) else Path(str(value))
        try:
            expanded = expand_user(str(path))
        except ValueError as e:
            raise ConfigError(f"{key}={value}: {e}") from None
        existing = expanded
        while not existing.exists() and existing.parent != existing:
            existing = existing.parent
        if existing.exists() and not existing.is_dir():
            where = "is" if existing == expanded else f"lies under {existing}, which is"
            raise ConfigError(
                f"{key}={value} {where} a file, not a directory: name a directory (a missing "
                "one is created)"
            )


def check_brokers(cfg: LakesinkConfig) -> list[TopicPartition]:
    """Before Spark starts: the brokers answer and accept our credentials, the topics exist and
    we may read them (and write the dead-letter topic), the value schema is valid. A refusal is
    then one line within about a second, not a failed Spark job."""
    from lakesink.kafka.client import check_topic_access
    from lakesink.spark.pipeline import check_kafka

    partitions = check_kafka(cfg)
    bootstrap, extra = cfg["kafka.bootstrap.servers"], cfg.kafka_client_config
    topics = sorted({tp.topic for tp in partitions})
    check_topic_access(bootstrap, topics, ["READ"], purpose="to ingest it", extra=extra)
    if cfg["errors.deadletter.topic"]:
        check_topic_access(
            bootstrap,
            [cfg["errors.deadletter.topic"]],
            ["WRITE"],
            purpose="errors.deadletter.topic",
            extra=extra,
        )
    return partitions


def run_ingest(
    cfg: LakesinkConfig, *, once: bool, debug: bool = False, standby: bool = False
) -> int:
    if standby and not cfg["standby.liveness.enabled"]:
        from lakesink.errors import ConfigError

        raise ConfigError(
            "ingest --standby: standby.liveness.enabled=false, so no liveness file tells when "
            "the active writer stops; set it to true (the default) on the active writer and here"
        )
    topics = ", ".join(cfg["kafka.topics"]) or cfg["kafka.topic.pattern"]
    check_local_paths(cfg)
    partitions = check_brokers(cfg)
    if standby:
        say(
            f"lakesink: standby for writer {cfg.writer_id} ({topics} into {cfg['table.path']}): "
            f"takes over when its liveness lapses for {cfg['standby.takeover.after.s']:g}s "
            "or it stops"
        )
    else:
        into = (
            "tables " + ", ".join(f"{s.name} ({t['table.path']})" for s, t in cfg.table_configs())
            if cfg["tables"]
            else cfg["table.path"]
        )
        say(f"lakesink: ingesting {topics} into {into} as writer {cfg.writer_id}")
    result = ingest(cfg, once=once, debug=debug, partitions=partitions, standby=standby)
    if result is None:
        return 0
    if result.nothing_new or result.only_empty_ranges:
        # No query was needed, or its batches held only offsets without records (aborted
        # transactions, markers): either way nothing new is in the table.
        say(
            f"lakesink: nothing new to ingest from {topics}: no records after the committed "
            f"offsets (or kafka.starting.offsets={cfg['kafka.starting.offsets']} for a writer "
            f"that has committed none); committed offsets {result.committed}"
        )
        return 0
    say(
        f"lakesink: {result.records:,} records in {result.batches} commits, "
        f"{result.elapsed_s:.1f}s; committed offsets {result.committed}"
    )
    return 0
