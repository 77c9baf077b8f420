"""Kafka → Hudi ingestion with real Spark local[2] and a real broker: exactly once through
replays, restarts, a deleted checkpoint, task retries and empty batches; how a run ends."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import audit_config, ingest_config, run_ingestion
from integration.table_stores import EMULATED, STORES, table_at

from lakesink.errors import LakesinkError
from lakesink.formats.hudi.writer_state import committed_offsets_at
from lakesink.kafka.producer import produce_sample_events

pytestmark = pytest.mark.integration


def test_ingest_once_lands_every_record_once_and_hudi_rs_agrees(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    topic = topic_factory("ingest")
    produce_sample_events(kafka_bootstrap, topic, 1000, 3)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t", table__partition__date__from="ts")
    result = run_ingestion(cfg, spark)
    assert result.records == 1000
    assert result.batches >= 3  # max.records.per.batch=400
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == report.kafka_records == 1000


@pytest.mark.parametrize("store", [*STORES, *EMULATED])
def test_second_run_continues_from_the_table_offsets(
    store: str,
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    topic = topic_factory("resume")
    produce_sample_events(kafka_bootstrap, topic, 300, 2)
    where = table_at(store, tmp_path, request)
    cfg = ingest_config(kafka_bootstrap, topic, where.path, **where.overrides)  # type: ignore[arg-type]
    run_ingestion(cfg, spark)
    produce_sample_events(kafka_bootstrap, topic, 200, 2, first_event_id=300, create=False)
    assert run_ingestion(cfg, spark).records == 200
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 500
    if store == "local":
        return  # Spark reads local tables in test_hudi_mor_ingest.py and others
    # Spark through format("lakesink") on the store, its storage.* settings as reader options
    options = {
        k.replace("__", "."): str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in where.overrides.items()
        if k.startswith("storage__")
    }
    read = spark.read.format("lakesink").options(**options).load(where.path)
    assert read.select("kafka_partition", "kafka_offset").distinct().count() == read.count() == 500


@pytest.mark.parametrize("store", STORES)
def test_deleted_checkpoint_restarts_batch_ids_without_duplicates(
    store: str,
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    topic = topic_factory("nockpt")
    produce_sample_events(kafka_bootstrap, topic, 500, 2)
    where = table_at(store, tmp_path, request)
    cfg = ingest_config(kafka_bootstrap, topic, where.path, **where.overrides)  # type: ignore[arg-type]
    run_ingestion(cfg, spark)
    shutil.rmtree(cfg.checkpoint_location)
    produce_sample_events(kafka_bootstrap, topic, 100, 2, first_event_id=500, create=False)
    assert run_ingestion(cfg, spark).records == 100
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 600


@pytest.mark.parametrize("store", STORES)
def test_spark_replay_of_a_committed_batch_publishes_nothing(
    store: str,
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Delete Spark's record of the last batch (commits/N) as a crash after the table commit
    would leave it: Spark re-runs batch N with the same offsets; the table must not change."""
    topic = topic_factory("replay")
    produce_sample_events(kafka_bootstrap, topic, 300, 2)
    where = table_at(store, tmp_path, request)
    cfg = ingest_config(kafka_bootstrap, topic, where.path, **where.overrides)  # type: ignore[arg-type]
    run_ingestion(cfg, spark)
    commits = sorted(
        (cfg.checkpoint_location / "commits").glob("[0-9]*"), key=lambda p: int(p.name)
    )
    commits[-1].unlink()
    from lakesink.formats.hudi.table.hudi_table import HudiTable

    before = len(HudiTable.open(cfg.table_storage).timeline().completed())
    assert run_ingestion(cfg, spark).records == 0
    assert len(HudiTable.open(cfg.table_storage).timeline().completed()) == before
    assert audit_config(cfg).ok


@pytest.mark.parametrize("store", STORES)
def test_task_retries_leave_no_orphan_rows(
    store: str,
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
    request: pytest.FixtureRequest,
) -> None:
    """Every sink task's first attempt fails after writing files (local[2,3] retries it)."""
    from integration.conftest import write_config_file

    topic = topic_factory("retry")
    produce_sample_events(kafka_bootstrap, topic, 600, 3)
    where = table_at(store, tmp_path, request)
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        where.path,  # type: ignore[arg-type]
        spark__master="local[2,3]",
        **where.overrides,
    )
    path = write_config_file(cfg, tmp_path / "c.toml")
    run = cli(["ingest", "--config", str(path), "--once"], env={"LAKESINK_FAIL_TASK_ATTEMPTS": "1"})
    assert run.returncode == 0, run.stdout[-3000:]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 600


def test_new_partitions_are_picked_up_from_earliest(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions

    topic = topic_factory("grow")
    produce_sample_events(kafka_bootstrap, topic, 100, 2)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t")
    run_ingestion(cfg, spark)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.create_partitions([NewPartitions(topic, 4)]).values():
        future.result(30)
    produce_sample_events(kafka_bootstrap, topic, 100, 4, first_event_id=100, create=False)
    run_ingestion(cfg, spark)
    offsets = committed_offsets_at(cfg["table.path"], cfg.writer_id).to_json()
    assert audit_config(cfg).ok
    assert sum(offsets.values()) == 200


def test_a_run_that_caught_up_stops_after_its_last_batch_reached_the_commit_log(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    # The offsets are published before the batch's tail work (progress, unpersisting, services)
    # ends; stopping the query then interrupted the batch, so Spark's commit log lacked it.
    from lakesink.spark.pipeline import Ingestion

    topic = topic_factory("tail")
    produce_sample_events(kafka_bootstrap, topic, 100, 1)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t")
    slow_tail = Ingestion(cfg, spark, on_progress=lambda _progress: time.sleep(1.5))
    result = slow_tail.run(once=True, timeout_s=120)
    assert result.records == 100
    planned = sorted(int(p.name) for p in (cfg.checkpoint_location / "offsets").glob("[0-9]*"))
    done = sorted(int(p.name) for p in (cfg.checkpoint_location / "commits").glob("[0-9]*"))
    assert planned and done == planned
    assert audit_config(cfg).ok


def test_a_query_stopped_by_someone_else_is_an_error_not_a_success(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    from lakesink.spark.pipeline import Ingestion

    topic = topic_factory("stopped")
    produce_sample_events(kafka_bootstrap, topic, 100, 1)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t", trigger__interval__s=30)

    def stop_the_query() -> None:
        deadline = time.monotonic() + 60
        while not spark.streams.active and time.monotonic() < deadline:
            time.sleep(0.05)
        for query in spark.streams.active:
            query.stop()

    stopper = threading.Thread(target=stop_the_query)
    stopper.start()
    try:
        with pytest.raises(LakesinkError):
            Ingestion(cfg, spark).run(timeout_s=120)
    finally:
        stopper.join()
