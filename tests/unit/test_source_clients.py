"""The streaming source's planning clients (issue 30): the driver's Kafka clients are made once
per query, not per batch, still ask the broker at every batch, are made anew after a failed
planning call, and are closed when the query stops. Fake confluent-kafka clients, no broker."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from lakesink.config import build_config
from lakesink.errors import KafkaError
from lakesink.spark.source import KafkaStreamReader, offset_to_ranges

TOPIC = "t"
PARTITIONS = 2


class Broker:
    """What the fake clients answer; `high` moves as records arrive."""

    def __init__(self) -> None:
        self.high = {p: 10 for p in range(PARTITIONS)}
        self.topic_id = "id-1"
        self.admins: list[FakeAdmin] = []
        self.consumers: list[FakeConsumer] = []
        self.requests = {"metadata": 0, "describe": 0, "watermarks": 0}
        self.fail_watermarks = False


class FakeAdmin:
    def __init__(self, broker: Broker, config: dict[str, Any]) -> None:
        self.broker = broker
        broker.admins.append(self)

    def list_topics(self, timeout: float) -> Any:
        self.broker.requests["metadata"] += 1
        parts = {p: object() for p in range(PARTITIONS)}
        return SimpleNamespace(topics={TOPIC: SimpleNamespace(error=None, partitions=parts)})

    def describe_topics(self, topics: Any, request_timeout: float) -> dict[str, Any]:
        self.broker.requests["describe"] += 1
        description = SimpleNamespace(topic_id=self.broker.topic_id)
        return {TOPIC: SimpleNamespace(result=lambda timeout=None: description)}

    def poll(self, timeout: float) -> None:
        pass


class FakeConsumer:
    def __init__(self, broker: Broker, config: dict[str, Any]) -> None:
        self.broker = broker
        self.closed = False
        broker.consumers.append(self)

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        assert not self.closed and not cached  # every batch asks the broker
        self.broker.requests["watermarks"] += 1
        if self.broker.fail_watermarks:
            raise RuntimeError("the broker went away")
        return 0, self.broker.high[tp.partition]

    def poll(self, timeout: float) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> Broker:
    import confluent_kafka
    import confluent_kafka.admin

    import lakesink.spark.table_offsets as table_offsets

    b = Broker()
    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", lambda c: FakeAdmin(b, c))
    monkeypatch.setattr(confluent_kafka, "Consumer", lambda c: FakeConsumer(b, c))
    monkeypatch.setattr(table_offsets, "committed_topic_ids_of", lambda cfg: {})
    return b


def reader() -> KafkaStreamReader:
    cfg = build_config(
        {
            "kafka.bootstrap.servers": "h:1",
            "kafka.topics": TOPIC,
            "value.schema": "a INT",
            "table.path": "/t",
            "kafka.max.records.per.batch": 4,
        }
    )
    return KafkaStreamReader(cfg)


def start_at(offsets: dict[int, int]) -> dict[str, Any]:
    return {"v": 1, "ranges": {f"{TOPIC}:{p}": [o, o] for p, o in offsets.items()}}


def ends(offset: dict[str, Any]) -> dict[int, tuple[int, int]]:
    return {r.partition.partition: (r.start, r.end) for r in offset_to_ranges(offset)}


def test_batches_reuse_one_admin_and_one_consumer_and_ask_the_broker_each_time(
    broker: Broker,
) -> None:
    r = reader()
    start = start_at({0: 0, 1: 0})
    for _ in range(5):
        end = r.latestOffset(start, ReadMaxRows(4))
        assert sum(e - s for s, e in ends(end).values()) == 4
        start = end
    # before: 2 admin clients (partitions, topic ids) and 1 consumer per batch
    assert (len(broker.admins), len(broker.consumers)) == (1, 1)
    assert broker.requests == {"metadata": 5, "describe": 5, "watermarks": 10}
    # records arriving between batches are seen by the kept consumer
    broker.high = {0: 30, 1: 30}
    assert ends(r.latestOffset(start_at({0: 10, 1: 10}), ReadMaxRows(40))) == {
        0: (10, 30),
        1: (10, 30),
    }
    assert len(broker.consumers) == 1
    r.stop()
    assert broker.consumers[0].closed


def test_a_failed_planning_call_drops_the_clients_and_the_next_makes_new_ones(
    broker: Broker,
) -> None:
    r = reader()
    r.latestOffset(start_at({0: 0, 1: 0}), ReadMaxRows(4))
    broker.fail_watermarks = True
    with pytest.raises(KafkaError, match="watermarks"):
        r.latestOffset(start_at({0: 2, 1: 2}), ReadMaxRows(4))
    assert broker.consumers[0].closed
    broker.fail_watermarks = False
    assert ends(r.latestOffset(start_at({0: 2, 1: 2}), ReadMaxRows(4))) == {0: (2, 4), 1: (2, 4)}
    assert (len(broker.admins), len(broker.consumers)) == (2, 2)
    assert not broker.consumers[1].closed


def test_a_topic_recreated_between_batches_is_still_refused(broker: Broker) -> None:
    from lakesink.errors import DataLossError

    r = reader()
    r.latestOffset(start_at({0: 0, 1: 0}), ReadMaxRows(4))
    broker.topic_id = "id-2"
    with pytest.raises(DataLossError, match="deleted and re-created"):
        r.latestOffset(start_at({0: 2, 1: 2}), ReadMaxRows(4))


def test_stop_without_a_batch_makes_no_client(broker: Broker) -> None:
    reader().stop()
    assert (broker.admins, broker.consumers) == ([], [])
