"""The Python API on the session's Spark and broker: `lakesink.ingest` with its Prometheus
endpoint scraped over HTTP while it runs, the committing sink in a query of the user's own, and
the API's errors being the CLI's error classes."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import audit_config, ingest_config

import lakesink
from lakesink.cli.status import collect_status
from lakesink.errors import ConfigError, KafkaError, LakesinkError, RecordError
from lakesink.kafka.producer import SAMPLE_EVENT_DDL, produce_sample_events, produce_values
from lakesink.metrics import Snapshot, scrape, value_of

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ingest_api_metrics_endpoint_scraped_during_ingestion_counts_what_was_ingested(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    first, second = topic_factory("api-a"), topic_factory("api-b")
    produced = produce_sample_events(kafka_bootstrap, first, 800, 2)
    produced.update(produce_sample_events(kafka_bootstrap, second, 400, 1))
    port = _free_port()
    config = {  # a plain mapping, nested tables allowed, as a user writes it
        "kafka": {"bootstrap.servers": kafka_bootstrap, "topics": f"{first},{second}"},
        "value.format": "json",
        "value.schema": SAMPLE_EVENT_DDL,
        "table.path": str(tmp_path / "events"),
        "kafka.max.records.per.batch": 150,
        "writer.id": "api-writer",
        "metrics": {"port": port, "lag.interval.s": 0.2},
    }
    progress: list[Any] = []
    handle = lakesink.ingest(spark, config, once=True, on_progress=progress.append)
    url = handle.metrics_url
    assert url == f"http://127.0.0.1:{port}/metrics"

    during: list[Snapshot] = []

    def scrape_while_running() -> None:
        while handle.is_active:
            with contextlib.suppress(OSError):
                during.append(scrape(url))
            time.sleep(0.05)

    scraper = threading.Thread(target=scrape_while_running, daemon=True)
    scraper.start()
    try:
        assert handle.await_termination(180)
        scraper.join(timeout=10)
        final = scrape(url)
        result = handle.result
        assert result is not None and result.records == 1200

        # rows per topic, as produced; bytes counted for both
        assert value_of(final, "lakesink_records_ingested_total", topic=first) == 800
        assert value_of(final, "lakesink_records_ingested_total", topic=second) == 400
        # one table: the metrics about it carry its name (the last folder of table.path)
        assert {s["labels"]["table"] for s in final["lakesink_partition_lag"]} == {"events"}
        assert value_of(final, "lakesink_records_ingested_total", table="events") == 1200
        assert value_of(final, "lakesink_bytes_ingested_total", topic=first) > 0
        assert value_of(final, "lakesink_bytes_ingested_total", topic=second) > 0
        # one batch, one commit, at least two lock waits (begin and publish) per published batch
        published = value_of(final, "lakesink_batches_total", outcome="published")
        assert published == result.batches == len(progress) >= 8
        assert value_of(final, "lakesink_batch_duration_seconds_count") == published
        assert value_of(final, "lakesink_commit_duration_seconds_count") == published
        assert value_of(final, "lakesink_lock_wait_seconds_count") >= 2 * published
        assert value_of(final, "lakesink_last_commit_timestamp_seconds") > time.time() - 300
        # offsets per partition: committed = high watermark = produced, no lag
        for tp, count in produced.items():
            labels = {"topic": tp.topic, "partition": str(tp.partition)}
            assert value_of(final, "lakesink_partition_committed_offset", **labels) == count
            assert value_of(final, "lakesink_partition_high_watermark", **labels) == count
            assert value_of(final, "lakesink_partition_lag", **labels) == 0
        assert len(final["lakesink_partition_lag"]) == 3
        for nothing in ("lakesink_rollbacks_total", "lakesink_errors_total"):
            assert value_of(final, nothing) == 0
        assert value_of(final, "lakesink_pending_epochs") == 0
        info = final["lakesink_ingestion_info"][0]["labels"]
        assert info["writer"] == "api-writer" and info["topics"] == f"{first},{second}"

        # the endpoint answered while the ingestion ran, counting up to the total
        seen = [value_of(s, "lakesink_records_ingested_total") for s in during]
        assert any(0 < n < 1200 for n in seen), seen
        assert seen == sorted(seen)

        # the handle's status and `lakesink status --json` show the same values
        status = handle.status()
        assert status.records == 1200 and not status.active and status.error is None
        assert status.committed == {tp.key(): n for tp, n in sorted(produced.items())}
        assert (
            status.metrics["lakesink_records_ingested_total"]
            == final["lakesink_records_ingested_total"]
        )
        cfg = handle.config
        st = collect_status(cfg)
        assert st["metrics_source"] == url
        for name in ("lakesink_records_ingested_total", "lakesink_batches_total"):
            assert st["metrics"][name] == final[name]
        assert value_of(st["metrics"], "lakesink_partition_lag") == 0
    finally:
        handle.stop()
    with pytest.raises(OSError):
        scrape(url, timeout_s=1)
    report = audit_config(handle.config)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == 1200
    rows = lakesink.read(spark, tmp_path / "events")
    assert rows.count() == 1200
    assert rows.select("kafka_topic").distinct().count() == 2


def test_sink_in_a_users_own_foreach_batch_query_commits_every_record_once(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    topic = topic_factory("api-sink")
    produce_sample_events(kafka_bootstrap, topic, 600, 2)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t", kafka__max__records__per__batch=200)
    with lakesink.sink(spark, cfg) as sink:
        stream = lakesink.read_stream(spark, cfg).withColumn("origin", F.lit("my-job"))
        query = (
            stream.writeStream.foreachBatch(sink)
            .option("checkpointLocation", sink.checkpoint_location)
            .trigger(processingTime="0 seconds")
            .start()
        )
        try:
            assert sink.await_caught_up(query, timeout=180)
        finally:
            query.stop()
        sink.check()
        assert sink.stats.records == 600 and sink.stats.batches >= 3
        assert sink.committed == {f"{topic}:0": 300, f"{topic}:1": 300}
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == 600
    rows = lakesink.read(spark, cfg["table.path"])
    assert rows.where(F.col("origin") == "my-job").count() == 600


def test_sink_refuses_a_query_whose_checkpoint_is_elsewhere_with_a_config_error(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    topic = topic_factory("api-ckpt")
    produce_sample_events(kafka_bootstrap, topic, 50, 1)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t")
    with lakesink.sink(spark, cfg) as sink:
        query = (
            lakesink.read_stream(spark, cfg)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "elsewhere"))
            .start()
        )
        with pytest.raises(ConfigError, match=r"sink\.checkpoint_location"):
            sink.await_termination(query, timeout=120)
        query.stop()
    assert audit_config(cfg).commits == 0


def test_api_errors_are_the_lakesink_error_classes_the_cli_maps_to_exit_codes(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    table = tmp_path / "t"
    base = {
        "kafka.bootstrap.servers": kafka_bootstrap,
        "value.format": "json",
        "value.schema": SAMPLE_EVENT_DDL,
        "table.path": str(table),
    }
    with pytest.raises(ConfigError, match=r"kafka\.topic") as bad_key:
        lakesink.ingest(spark, {**base, "kafka.topic": "x"})
    assert bad_key.value.exit_code == 2
    with pytest.raises(KafkaError) as missing:
        lakesink.ingest(spark, {**base, "kafka.topics": topic_factory("absent")})
    assert missing.value.exit_code == 7
    assert not table.exists()  # nothing written before the checks passed

    topic = topic_factory("api-bad")
    produce_sample_events(kafka_bootstrap, topic, 10, 1)
    produce_values(kafka_bootstrap, topic, [b"not json"])
    handle = lakesink.ingest(spark, {**base, "kafka.topics": topic}, once=True)
    try:
        with pytest.raises(RecordError, match="offset 10") as failed:
            handle.await_termination(180)
        assert failed.value.exit_code == 8
        assert isinstance(handle.exception(), RecordError)
        status = handle.status()
        assert status.error is not None and "offset 10" in status.error
        assert value_of(status.metrics, "lakesink_errors_total", error="RecordError") == 1
        assert value_of(status.metrics, "lakesink_rollbacks_total", reason="batch_failed") == 1
    finally:
        handle.stop()
    with pytest.raises(LakesinkError, match="already started"):
        handle.start()


def test_continuous_ingest_keeps_ingesting_until_stopped_then_ends_without_error(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    topic = topic_factory("api-live")
    produce_sample_events(kafka_bootstrap, topic, 100, 1)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t", trigger__interval__s=0.5)
    with lakesink.ingest(spark, cfg) as handle:

        def committed() -> int:
            progress = handle.last_progress
            return 0 if progress is None else progress.total_records

        deadline = time.monotonic() + 120
        while committed() < 100 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert committed() == 100
        # records that arrive later are ingested by the same running query
        produce_sample_events(kafka_bootstrap, topic, 30, 1, first_event_id=100, create=False)
        while committed() < 130 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert committed() == 130
        assert handle.is_active and not handle.await_termination(0.1)
    assert not handle.is_active and handle.exception() is None
    assert handle.await_termination(0)
    assert handle.result is not None and handle.result.records == 130
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_lakesink == 130


def test_metrics_count_dead_letters_per_topic_and_async_commits(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    topic = topic_factory("api-dead")
    produce_sample_events(kafka_bootstrap, topic, 20, 1)
    produce_values(kafka_bootstrap, topic, [b"not json", b'{"event_id": "x"}'])
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        tmp_path / "t",
        errors__tolerance="all",
        errors__deadletter__table=str(tmp_path / "dead"),
        commit__mode="async",
    )
    handle = lakesink.ingest(spark, cfg, once=True)
    try:
        assert handle.await_termination(180)
        metrics = handle.status().metrics
    finally:
        handle.stop()
    assert value_of(metrics, "lakesink_records_ingested_total", topic=topic) == 20
    assert value_of(metrics, "lakesink_dead_letters_total", topic=topic) == 2
    published = value_of(metrics, "lakesink_batches_total", outcome="published")
    assert published >= 1
    # async: every pre-committed epoch was published by the committer, none left pending
    assert value_of(metrics, "lakesink_commit_duration_seconds_count") == published
    assert value_of(metrics, "lakesink_pending_epochs") == 0
    assert value_of(metrics, "lakesink_errors_total") == 0
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_lakesink == 20 and report.dead_letters == 2


def test_api_from_a_virtualenvs_python_run_without_activating_it_ingests_on_a_local_master(
    kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    """`/path/to/venv/bin/python app.py` with the venv not on PATH (or a notebook kernel): the
    `python3` on PATH has no lakesink, yet Spark's Python workers run the driver's interpreter
    on a local master, so the user's own session ingests and reads the table — with Spark's
    reader once `lakesink.register(spark)` ran (before it, Spark does not know the format)."""
    import json
    import os
    import subprocess
    import sys

    from integration.conftest import SHORT_LIVED_DRIVER_JVM

    topic = topic_factory("unactivated")
    produce_sample_events(kafka_bootstrap, topic, 50, 1)
    config = {
        "kafka.bootstrap.servers": kafka_bootstrap,
        "kafka.topics": topic,
        "value.format": "json",
        "value.schema": SAMPLE_EVENT_DDL,
        "table.path": str(tmp_path / "t"),
    }
    app = tmp_path / "app.py"
    app.write_text(
        "import json, sys\n"
        "from pyspark.sql import SparkSession\n"
        "import lakesink\n"
        "spark = SparkSession.builder.master('local[1]')"
        ".config('spark.ui.enabled', 'false').getOrCreate()\n"
        "config = json.loads(sys.argv[1])\n"
        "try:\n"
        "    spark.read.format('lakesink').load(config['table.path'])\n"
        "except Exception as e:\n"
        "    print('before register:', 'DATA_SOURCE_NOT_FOUND' in str(e))\n"
        "lakesink.register(spark)\n"
        "handle = lakesink.ingest(spark, config, once=True)\n"
        "handle.await_termination()\n"
        "print('rows', spark.read.format('lakesink').load(config['table.path']).count())\n"
        "handle.stop()\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")
    }
    env.update(SHORT_LIVED_DRIVER_JVM, PATH="/usr/local/bin:/usr/bin:/bin")
    ran = subprocess.run(
        [sys.executable, str(app), json.dumps(config)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-3000:]
    assert "rows 50" in ran.stdout, (ran.stdout + ran.stderr)[-3000:]
    # Spark's reader finds lakesink's table source once `lakesink.register(spark)` ran
    assert "before register: True" in ran.stdout, (ran.stdout + ran.stderr)[-3000:]


def test_workers_whose_python_lacks_lakesink_are_refused_in_one_line_naming_the_fix(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check an ingestion on a cluster runs before creating anything: one task imports
    lakesink on a worker. Here the session's local workers stand in for a cluster's (the check
    skips local masters), first with the driver's Python, then with a venv's without lakesink."""
    import subprocess
    import sys

    from lakesink.errors import ConfigError
    from lakesink.spark import session

    monkeypatch.setattr(session, "on_a_cluster", lambda sc: True)
    monkeypatch.setattr(session, "_workers_checked", set())
    session.check_workers_import_lakesink(spark)  # the driver's Python has lakesink
    assert session._workers_checked == {spark.sparkContext.applicationId}

    bare = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    # -P: local workers start in the driver's folder, which may be a checkout of lakesink;
    # a cluster's start in a work folder of their own
    wrapper = tmp_path / "worker-python"
    wrapper.write_text(f'#!/bin/sh\nexec "{bare / "bin" / "python"}" -P "$@"\n')
    wrapper.chmod(0o755)
    worker_python = str(wrapper)
    monkeypatch.setattr(session, "_workers_checked", set())
    monkeypatch.setattr(spark.sparkContext, "pythonExec", worker_python)
    with pytest.raises(ConfigError) as refused:
        session.check_workers_import_lakesink(spark)
    message = str(refused.value)
    assert "\n" not in message and "cannot import lakesink" in message, message
    assert str(bare / "bin" / "python") in message, message  # the worker's interpreter
    assert "No module named 'lakesink'" in message, message
    assert "spark.pyspark.python" in message and "PYSPARK_PYTHON" in message, message
    assert not session._workers_checked  # checked again next time
