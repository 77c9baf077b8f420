"""The local brokers (Apache Kafka by default, noida-db with LAKESINK_TEST_BROKER=noida; the
embedded noida-db class directly): start, restart with data kept, reads across a restart, clear
errors."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from lakesink.errors import KafkaError
from lakesink.kafka.client import watermarks
from lakesink.kafka.deserializers import JsonDeserializer
from lakesink.kafka.embedded_broker import LOG_FILE_NAME, EmbeddedBroker
from lakesink.kafka.kafka_server import KafkaServer
from lakesink.kafka.producer import SAMPLE_EVENT_DDL, produce_sample_events
from lakesink.kafka.reader import read_range
from lakesink.protocol.offsets import OffsetRange, TopicPartition

pytestmark = pytest.mark.integration


def test_restart_keeps_port_and_records(fresh_broker: EmbeddedBroker) -> None:
    bootstrap = fresh_broker.bootstrap_servers
    produce_sample_events(bootstrap, "kept", 500, 2)
    first_pid = fresh_broker.pid
    fresh_broker.restart()
    assert fresh_broker.bootstrap_servers == bootstrap and fresh_broker.pid != first_pid
    marks = watermarks(bootstrap, [TopicPartition("kept", 0), TopicPartition("kept", 1)])
    assert sorted(marks.values()) == [(0, 250), (0, 250)]
    assert (fresh_broker.data_dir / LOG_FILE_NAME).stat().st_size > 0


def test_read_survives_a_broker_restart_mid_range(fresh_broker: EmbeddedBroker) -> None:
    bootstrap = fresh_broker.bootstrap_servers
    produce_sample_events(bootstrap, "mid", 20_000, 1)
    batches = read_range(
        bootstrap,
        OffsetRange(TopicPartition("mid", 0), 0, 20_000),
        deserializer=JsonDeserializer(SAMPLE_EVENT_DDL),
        batch_size=2_000,
        stall_timeout_s=30,
    )
    ids = next(batches).column("event_id").to_pylist()
    fresh_broker.restart()
    for b in batches:
        ids += b.column("event_id").to_pylist()
    assert ids == list(range(20_000))


def test_read_from_a_stopped_broker_fails_clearly(fresh_broker: EmbeddedBroker) -> None:
    bootstrap = fresh_broker.bootstrap_servers
    produce_sample_events(bootstrap, "gone", 10, 1)
    fresh_broker.stop()
    with pytest.raises(KafkaError) as e:
        list(
            read_range(
                bootstrap,
                OffsetRange(TopicPartition("gone", 0), 0, 10),
                deserializer=JsonDeserializer(SAMPLE_EVENT_DDL),
                stall_timeout_s=2,
            )
        )
    assert "gone:0" in str(e.value) and "[0, 10)" in str(e.value)


def test_context_manager_removes_its_data_dir() -> None:
    with EmbeddedBroker() as broker:
        data_dir = broker.data_dir
        assert broker.running
        produce_sample_events(broker.bootstrap_servers, "x", 3, 1)
    assert not broker.running and not data_dir.exists()


def test_fixed_port_in_use_is_a_clear_error(taken_port: int) -> None:
    other = EmbeddedBroker(port=taken_port)
    try:
        with pytest.raises(KafkaError, match="already in use"):
            other.start()
    finally:
        other.close()


def test_apache_kafka_on_a_port_in_use_is_a_clear_error_naming_it(taken_port: int) -> None:
    other = KafkaServer(port=taken_port)
    try:
        with pytest.raises(KafkaError, match=f"127.0.0.1:{taken_port}.*already in use"):
            other.start()
    finally:
        other.close()


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port a listening socket holds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])
