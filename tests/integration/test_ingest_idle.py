"""An ingestion with nothing to read (real broker, Spark local[2]): `run(once=True)` returns
promptly and says so for every starting-offset mode, empty topics, topics whose records all
expired, and topics holding only aborted transactional records; a continuous ingestion stays
healthy while idle and ingests what arrives later."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import ingest_config, run_ingestion

from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.writer_state import committed_offsets_at
from lakesink.kafka.client import create_topic
from lakesink.kafka.producer import produce_sample_events, produce_transactional
from lakesink.spark.pipeline import Ingestion

pytestmark = pytest.mark.integration

IDLE_WAIT_S = 60  # bounded: a stuck --once fails the test instead of hanging the suite


def _no_commits(table_path: str) -> bool:
    return not HudiTable.open(table_path).timeline().completed()


def _delete_all_records(bootstrap: str, topic: str, end: int) -> None:
    """What retention does to old records: the log start moves to the end (delete-records)."""
    from confluent_kafka import TopicPartition as CkTopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([CkTopicPartition(topic, 0, end)], request_timeout=10)
    for future in futures.values():
        future.result(timeout=10)


@pytest.mark.parametrize("case", ["latest", "empty", "expired", "future-timestamp"])
def test_once_with_nothing_to_read_returns_at_once_and_says_nothing_new(
    case: str,
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="lakesink.spark.pipeline")
    topic = topic_factory(f"idle-{case}")
    starting = {"latest": "latest", "future-timestamp": str(int(time.time() * 1000) + 3_600_000)}
    if case == "empty":
        create_topic(kafka_bootstrap, topic, 2)
    else:
        produce_sample_events(kafka_bootstrap, topic, 10, 1)
    if case == "expired":
        _delete_all_records(kafka_bootstrap, topic, 10)
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        tmp_path / "t",
        kafka__starting__offsets=starting.get(case, "earliest"),
    )
    started = time.monotonic()
    result = run_ingestion(cfg, spark, timeout_s=IDLE_WAIT_S)
    assert result.nothing_new and result.records == 0 and result.batches == 0
    assert time.monotonic() - started < IDLE_WAIT_S
    assert result.committed == {}
    assert _no_commits(cfg["table.path"])
    assert "writer test-writer: nothing new to ingest; committed offsets {}" in caplog.text


def test_once_after_everything_is_committed_says_nothing_new(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    topic = topic_factory("idle-caught-up")
    produce_sample_events(kafka_bootstrap, topic, 30, 2)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t")
    first = run_ingestion(cfg, spark, timeout_s=IDLE_WAIT_S)
    assert first.records == 30 and not first.nothing_new
    again = run_ingestion(cfg, spark, timeout_s=IDLE_WAIT_S)
    assert again.nothing_new and again.committed == first.committed


def test_once_over_only_aborted_transactions_commits_the_empty_range_and_returns(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="lakesink.spark.pipeline")
    topic = topic_factory("idle-aborted")
    create_topic(kafka_bootstrap, topic, 1)
    committed, _producer = produce_transactional(kafka_bootstrap, topic, [(3, False), (2, False)])
    assert committed == []
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t", value__schema="n BIGINT")
    result = run_ingestion(cfg, spark, timeout_s=IDLE_WAIT_S)
    assert result.records == 0 and result.dead_letters == 0 and result.only_empty_ranges
    end = committed_offsets_at(cfg["table.path"], cfg.writer_id).to_json()
    # 5 aborted records and 2 abort markers: the range up to the last stable offset is done
    assert end == {f"{topic}:0": 7}
    assert "nothing new to ingest (only offsets without records)" in caplog.text
    again = run_ingestion(cfg, spark, timeout_s=IDLE_WAIT_S)
    assert again.nothing_new


def test_continuous_ingestion_stays_healthy_while_idle_and_ingests_what_arrives(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    topic = topic_factory("idle-continuous")
    create_topic(kafka_bootstrap, topic, 1)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t", trigger__interval__s=0.2)
    ingestion = Ingestion(cfg, spark)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = ingestion.run()
        except BaseException as e:  # reported by the assertions below
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(3)  # about 15 idle triggers
    assert thread.is_alive() and "error" not in outcome, outcome
    assert _no_commits(cfg["table.path"])
    produce_sample_events(kafka_bootstrap, topic, 12, 1, create=False)
    deadline = time.monotonic() + IDLE_WAIT_S
    while committed_offsets_at(cfg["table.path"], cfg.writer_id).to_json() != {f"{topic}:0": 12}:
        assert time.monotonic() < deadline, "records produced after an idle time were not ingested"
        assert "error" not in outcome, outcome
        time.sleep(0.2)
    ingestion.stop()
    thread.join(IDLE_WAIT_S)
    assert not thread.is_alive() and "error" not in outcome, outcome
    assert outcome["result"].records == 12
