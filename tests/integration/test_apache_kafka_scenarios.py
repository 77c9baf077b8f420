"""Scenarios only a real Kafka broker plays out, each ending in the exactly-once audit:
aborted transactions under read_committed, a compacted topic, retention deleting records before
they were read, a topic deleted and re-created, partitions added while a query runs, and a
SIGKILL of the broker in the middle of a batch.

They run on Apache Kafka whatever LAKESINK_TEST_BROKER says (the session broker when it is Apache
Kafka, else a broker of their own), since the other brokers do not compact, retain or recover
like Kafka does."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import audit_config, ingest_config, run_ingestion, write_config_file

from lakesink.formats.hudi.audit import completed_commits
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.kafka.client import OffsetClient, create_topic, watermarks
from lakesink.kafka.deserializers import make_deserializer
from lakesink.kafka.kafka_server import KafkaServer
from lakesink.kafka.producer import (
    produce_sample_events,
    produce_transactional,
    produce_values,
    sample_event_bytes,
)
from lakesink.kafka.reader import read_range
from lakesink.protocol.offsets import OffsetRange, TopicPartition

pytestmark = pytest.mark.integration

TopicFactory = Callable[[str], str]


@pytest.fixture(scope="module")
def apache_kafka(broker_kind: str, kafka_bootstrap: str) -> Iterator[str]:
    """bootstrap.servers of an Apache Kafka broker started here: the session's when it is one."""
    if broker_kind == "kafka" and not os.environ.get("LAKESINK_TEST_BOOTSTRAP_SERVERS"):
        yield kafka_bootstrap
        return
    with KafkaServer() as server:
        yield server.bootstrap_servers


def _alter_topic(bootstrap: str, topic: str, config: dict[str, str]) -> None:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in config.items()
    ]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def _kafka_records(bootstrap: str, tp: TopicPartition) -> dict[int, bytes | None]:
    """offset -> key of every record Kafka holds now in the partition."""
    low, high = watermarks(bootstrap, [tp])[tp]
    out: dict[int, bytes | None] = {}
    for batch in read_range(
        bootstrap, OffsetRange(tp, low, high), deserializer=make_deserializer("raw")
    ):
        for o, k in zip(
            batch.column("kafka_offset").to_pylist(),
            batch.column("kafka_key").to_pylist(),
            strict=True,
        ):
            out[int(o)] = k
    return out


def _wait_for(
    what: str,
    check: Callable[[], bool],
    timeout_s: float = 90,
    *,
    alive: Callable[[], bool] | None = None,
    explain: Callable[[], str] | None = None,
) -> None:
    """Wait until `check()`; fail when `timeout_s` pass or, at once, when `alive()` turns false
    (the process that was to make it happen ended), with `explain()` in the message."""
    deadline = time.monotonic() + timeout_s
    while not check():
        gone = alive is not None and not alive()
        if gone or time.monotonic() > deadline:
            why = "the ingestion ended first" if gone else f"not within {timeout_s:.0f} s"
            raise AssertionError(
                f"{what} did not happen: {why}" + (f"\n{explain()}" if explain else "")
            )
        time.sleep(0.5)


def _table_event_ids(cfg: Any) -> list[int]:
    from lakesink.formats.hudi.table.reader import TableReader

    rows = TableReader(HudiTable.open(cfg["table.path"])).snapshot(columns=["event_id"])
    return sorted(rows.column("event_id").to_pylist())


def test_aborted_transactions_never_land_and_their_gaps_are_not_missing_records(
    spark: Any, apache_kafka: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    topic = topic_factory("txn")
    create_topic(apache_kafka, topic, 1)
    # every fourth transaction aborts; batches of 60 offsets end inside transactions and markers
    first = [(23, n % 4 != 3) for n in range(8)]
    committed, producer = produce_transactional(
        apache_kafka, topic, first, value=lambda k: sample_event_bytes(k)
    )
    del producer
    cfg = ingest_config(apache_kafka, topic, tmp_path / "t", kafka__max__records__per__batch=60)
    run_ingestion(cfg, spark)
    # a second round read from the middle of the log, after an aborted transaction
    start = 8 * 23
    more, producer = produce_transactional(
        apache_kafka,
        topic,
        [(17, n % 4 != 0) for n in range(8)],
        value=lambda k: sample_event_bytes(start + k),
        transactional_id=f"{topic}-second",
    )
    del producer
    run_ingestion(cfg, spark)
    report = audit_config(cfg)
    assert report.ok, report.problems
    expected = committed + [start + k for k in more]
    assert report.kafka_records == len(expected) == report.rows_hudi_rs
    assert _table_event_ids(cfg) == sorted(expected)
    tp = TopicPartition(topic, 0)
    # the log holds aborted records and markers: offsets run well past the committed records
    assert watermarks(apache_kafka, [tp])[tp][1] > len(expected) + 16


def test_a_compacted_topic_is_ingested_as_compaction_left_it(
    spark: Any, apache_kafka: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    topic = topic_factory("compact")
    create_topic(
        apache_kafka,
        topic,
        1,
        config={
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01",
            "min.compaction.lag.ms": "0",
            "delete.retention.ms": "100",
        },
    )
    keys, rounds = 10, 6
    for r in range(rounds):  # each round in a segment of its own: segment.ms rolls them
        ids = range(r * keys, (r + 1) * keys)
        produce_values(
            apache_kafka,
            topic,
            [sample_event_bytes(i) for i in ids],
            keys=[f"k{i % keys}".encode() for i in ids],
        )
        time.sleep(0.3)
    tp = TopicPartition(topic, 0)
    _wait_for(
        "compaction",
        lambda: len(_kafka_records(apache_kafka, tp)) < keys * rounds // 2,
    )
    kept = _kafka_records(apache_kafka, tp)
    cfg = ingest_config(apache_kafka, topic, tmp_path / "t", kafka__max__records__per__batch=7)
    run_ingestion(cfg, spark)
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.kafka_records == len(kept)
    # the latest value of every key survived compaction and landed
    assert set(range((rounds - 1) * keys, rounds * keys)) <= set(_table_event_ids(cfg))


def _roll_and_expire(bootstrap: str, topic: str, tp: TopicPartition, below: int) -> int:
    """Let retention delete the log below at least offset `below`; returns the new log start."""
    _alter_topic(bootstrap, topic, {"segment.ms": "100"})
    time.sleep(0.3)
    produce_values(bootstrap, topic, [sample_event_bytes(10_000)])  # rolls the segment
    _alter_topic(bootstrap, topic, {"retention.ms": "100"})
    _wait_for("retention", lambda: watermarks(bootstrap, [tp])[tp][0] >= below)
    _alter_topic(bootstrap, topic, {"retention.ms": "-1", "segment.ms": "604800000"})
    return watermarks(bootstrap, [tp])[tp][0]


def test_records_deleted_by_retention_before_they_were_read_stop_ingestion_unless_allowed(
    spark: Any,
    apache_kafka: str,
    topic_factory: TopicFactory,
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    topic = topic_factory("retained")
    produce_sample_events(apache_kafka, topic, 50, 1)
    cfg = ingest_config(apache_kafka, topic, tmp_path / "t")
    run_ingestion(cfg, spark)
    produce_sample_events(apache_kafka, topic, 50, 1, first_event_id=50, create=False)
    tp = TopicPartition(topic, 0)
    low = _roll_and_expire(apache_kafka, topic, tp, 100)
    produce_sample_events(apache_kafka, topic, 20, 1, first_event_id=100, create=False)
    high = watermarks(apache_kafka, [tp])[tp][1]
    # by default: an error naming topic, partition, the committed offset and the log start
    conf = write_config_file(cfg, tmp_path / "c.toml")
    run = cli(["ingest", "--config", str(conf), "--once"])
    assert run.returncode != 0
    said = run.stdout[-3000:]
    assert f"{topic}:0 is 50 but the log starts at {low}" in said, said
    assert "kafka.fail.on.data.loss" in said, said
    # allowed: ingestion passes over the deleted offsets, the commit and status say which
    allowing = cfg.with_overrides({"kafka.fail.on.data.loss": False})
    run_ingestion(allowing, spark)
    report = audit_config(allowing)
    assert report.ok, report.problems
    assert report.skipped == [(f"{topic}:0", 50, low)]
    assert report.rows_hudi_rs == 50 + high - low
    ids = set(_table_event_ids(allowing))
    assert set(range(50)) <= ids and not ids & set(range(50, min(low, 100)))
    conf = write_config_file(allowing, tmp_path / "allowing.toml")
    status = cli(["status", "--config", str(conf), "--json"])
    assert status.returncode == 0, status.stdout[-3000:]
    skipped = json.loads(status.stdout[status.stdout.index("{") :])["skipped"]
    assert [(s["partition"], s["from"], s["to"]) for s in skipped] == [(f"{topic}:0", 50, low)]


def test_a_deleted_and_recreated_topic_is_an_error_naming_it_not_a_fresh_start(
    spark: Any,
    apache_kafka: str,
    topic_factory: TopicFactory,
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    from confluent_kafka.admin import AdminClient

    topic = topic_factory("recreated")
    produce_sample_events(apache_kafka, topic, 120, 2)
    cfg = ingest_config(apache_kafka, topic, tmp_path / "t")
    run_ingestion(cfg, spark)
    admin = AdminClient({"bootstrap.servers": apache_kafka})
    for future in admin.delete_topics([topic], operation_timeout=30).values():
        future.result(30)
    _wait_for("topic deletion", lambda: topic not in admin.list_topics(timeout=10).topics)
    # more records than the old topic had: the offsets alone do not tell the topics apart
    produce_sample_events(apache_kafka, topic, 300, 2, first_event_id=1000)
    conf = write_config_file(cfg, tmp_path / "c.toml")
    run = cli(["ingest", "--config", str(conf), "--once"])
    assert run.returncode != 0
    said = run.stdout[-3000:]
    assert f"topic {topic!r} was deleted and re-created" in said, said
    assert _table_event_ids(cfg) == list(range(120))  # nothing of the new topic landed


def test_partitions_added_while_the_query_runs_are_ingested_from_their_start(
    apache_kafka: str, topic_factory: TopicFactory, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions

    topic = topic_factory("grow")
    produce_sample_events(apache_kafka, topic, 200, 2)
    cfg = ingest_config(
        apache_kafka,
        topic,
        tmp_path / "t",
        kafka__max__records__per__batch=50,
        trigger__interval__s=1,
    )
    conf = write_config_file(cfg, tmp_path / "c.toml")
    with _streaming(conf, tmp_path / "ingest.log") as proc:
        _wait_for("a first commit", lambda: _commits(cfg) >= 1, 120)
        admin = AdminClient({"bootstrap.servers": apache_kafka})
        for future in admin.create_partitions([NewPartitions(topic, 4)]).values():
            future.result(30)
        produce_sample_events(apache_kafka, topic, 200, 4, first_event_id=200, create=False)
        _wait_for("the new partitions' records", lambda: _rows(cfg) >= 400, 180)
        assert proc.poll() is None, (tmp_path / "ingest.log").read_text()[-3000:]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert _table_event_ids(cfg) == list(range(400))


def test_a_broker_killed_mid_batch_and_restarted_loses_and_duplicates_nothing(
    fresh_broker: Any, broker_kind: str, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    broker = fresh_broker if broker_kind == "kafka" else KafkaServer()
    if broker is not fresh_broker:
        broker.start()
    try:
        bootstrap = broker.bootstrap_servers
        topic = "killed"
        create_topic(bootstrap, topic, 2)
        producer = _AckedProducer(bootstrap, topic, 2)
        producer.start()
        cfg = ingest_config(
            bootstrap,
            topic,
            tmp_path / "t",
            kafka__max__records__per__batch=100,
            trigger__interval__s=1,
        )
        conf = write_config_file(cfg, tmp_path / "c.toml")
        log_path = tmp_path / "ingest.log"
        with _streaming(conf, log_path) as proc:

            def state() -> str:
                return _ingestion_state(proc, log_path, broker.log_path)

            def alive() -> bool:
                return proc.poll() is None

            _wait_for("a first commit", lambda: _commits(cfg) >= 1, 120, alive=alive, explain=state)
            broker.kill()
            time.sleep(1)
            broker.start()
            done = _commits(cfg)
            _wait_for(
                "commits after the restart",
                lambda: _commits(cfg) >= done + 2,
                120,
                alive=alive,
                explain=state,
            )
            producer.stop()
        assert producer.failed == 0 and producer.acked, (
            f"{producer.failed} records failed, {len(producer.acked)} acknowledged; first "
            f"errors: {producer.errors}"
        )
        catch_up = write_config_file(
            cfg.with_overrides({"kafka.max.records.per.batch": 5000}), tmp_path / "catch-up.toml"
        )
        run = cli(["ingest", "--config", str(catch_up), "--once"])
        assert run.returncode == 0, run.stdout[-3000:] + "\n" + _tail(broker.log_path, 3000)
        report = audit_config(cfg)
        assert report.ok, report.problems
        in_kafka = {
            int(k)
            for p in range(2)
            for k in _kafka_records(bootstrap, TopicPartition(topic, p)).values()
            if k is not None
        }
        assert producer.acked <= in_kafka  # Apache Kafka kept every acknowledged record
        assert set(_table_event_ids(cfg)) >= producer.acked
        assert report.rows_hudi_rs == report.kafka_records
    finally:
        if broker is not fresh_broker:
            broker.close()


def test_offsets_asked_while_the_broker_restarts_wait_for_it_a_missing_partition_fails_at_once(
    fresh_broker: Any, broker_kind: str
) -> None:
    """librdkafka answers "Unknown partition" (-190) for a partition whose leader it lost with
    the broker, exactly as for one that does not exist: planning (OffsetClient with
    unavailable_s) must ride out the first, as it rides out a refused connection, and still fail
    the second at once."""
    from lakesink.errors import KafkaError

    broker = fresh_broker if broker_kind == "kafka" else KafkaServer()
    if broker is not fresh_broker:
        broker.start()
    try:
        bootstrap = broker.bootstrap_servers
        create_topic(bootstrap, "restarted", 2)
        produce_values(bootstrap, "restarted", [sample_event_bytes(i) for i in range(5)])
        tps = [TopicPartition("restarted", 0), TopicPartition("restarted", 1)]
        with OffsetClient(bootstrap, unavailable_s=180) as client:
            before = client.watermarks(tps)  # the client knows the partitions' leader now
            asked = time.monotonic()
            with pytest.raises(KafkaError, match="restarted:5"):
                client.watermarks([TopicPartition("restarted", 5)])
            assert time.monotonic() - asked < 30  # not the 180 s a restart may take
            broker.kill()
            failed: list[BaseException] = []

            def restart() -> None:
                time.sleep(1)
                try:
                    broker.start()
                except BaseException as e:
                    failed.append(e)

            restarting = threading.Thread(target=restart)
            restarting.start()
            try:
                assert client.watermarks(tps) == before
            finally:
                restarting.join()
            assert not failed, failed
    finally:
        if broker is not fresh_broker:
            broker.close()


class _AckedProducer(threading.Thread):
    """Produces sample events (acks=all, idempotent), about 100 a second up to `limit`, until
    stopped; keeps the ids the broker acknowledged."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, limit: int = 2500) -> None:
        super().__init__(daemon=True)
        self.limit = limit
        from confluent_kafka import Producer

        self.topic, self.partitions = topic, partitions
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 10,
                "message.timeout.ms": 120_000,
                "log_level": 0,
            }
        )
        self.acked: set[int] = set()
        self.failed = 0
        self.errors: list[str] = []  # the first few delivery errors, for the failure message
        self._halt = threading.Event()

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked.add(int(msg.key()))
        else:
            self.failed += 1
            if len(self.errors) < 5:
                self.errors.append(str(err))

    def run(self) -> None:
        i = 0
        while not self._halt.is_set() and i < self.limit:
            for _ in range(10):
                self.producer.produce(
                    self.topic,
                    sample_event_bytes(i),
                    str(i).encode(),
                    partition=i % self.partitions,
                    on_delivery=self._on_delivery,
                )
                i += 1
            self.producer.poll(0.1)

    def stop(self) -> None:
        self._halt.set()
        self.join(30)
        assert self.producer.flush(120) == 0


def _commits(cfg: Any) -> int:
    try:
        return len(completed_commits(HudiTable.open(cfg["table.path"])))
    except Exception:  # the table does not exist yet
        return 0


def _tail(path: Path, chars: int) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError as e:
        return f"({path}: {e})"


def _ingestion_state(proc: subprocess.Popen[bytes], log_path: Path, broker_log: Path) -> str:
    """Whether the streaming ingestion still runs, how its output and the broker's log end."""
    code = proc.poll()
    return (
        ("ingestion still running" if code is None else f"ingestion exited with code {code}")
        + f"; its output ends:\n{_tail(log_path, 4000)}\n--- broker log ends:\n"
        + _tail(broker_log, 3000)
    )


def _rows(cfg: Any) -> int:
    try:
        return len(_table_event_ids(cfg))
    except Exception:
        return 0


@contextlib.contextmanager
def _streaming(conf: Path, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`lakesink ingest` (streaming) in its own process group, killed at the end."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lakesink.cli.main", "ingest", "--config", str(conf)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
