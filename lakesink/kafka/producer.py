"""Deterministic sample events for the demo and the tests, and a transactional helper.

`produce_sample_events` writes JSON events matching `SAMPLE_EVENT_DDL`; event `i` goes to
partition `i % partitions` and is the same for the same seed, so tests can recompute what they
expect. `produce_transactional` commits some transactions and aborts others (offset gaps).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lakesink.errors import KafkaError
from lakesink.kafka.client import create_topic
from lakesink.kafka.security import new_client
from lakesink.protocol.offsets import TopicPartition

SAMPLE_EVENT_DDL = (
    "event_id BIGINT, user_id BIGINT, event_type STRING, amount DOUBLE, ts TIMESTAMP, "
    "payload STRING"
)
"""The Spark DDL of the value of a sample event."""

EVENT_TYPES = ("click", "view", "purchase", "signup", "logout")
_EPOCH_US = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z
_MASK = (1 << 64) - 1
_PAD = "abcdefghijklmnopqrstuvwxyz" * 400


def _mix(x: int) -> int:
    """splitmix64: a well-spread 64-bit hash, cheap enough for millions of events."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def sample_event_bytes(i: int, *, seed: int = 0, payload_bytes: int = 250) -> bytes:
    """Event number `i` as compact JSON: a pure function of (i, seed, payload_bytes), padded
    with the `payload` field to about `payload_bytes` bytes."""
    h = _mix(i ^ (seed * 0x2545F4914F6CDD1D))
    ts_us = _EPOCH_US + i * 10_000 + (h % 10) * 1000
    cents = (h >> 8) % 100_000
    micros = ts_us % 1_000_000
    secs = ts_us // 1_000_000
    days, rem = divmod(secs, 86_400)
    d = _date_text(days)
    ts = f"{d}T{rem // 3600:02d}:{rem % 3600 // 60:02d}:{rem % 60:02d}.{micros:06d}Z"
    head = (
        f'{{"event_id":{i},"user_id":{(h >> 24) % 1_000_000},'
        f'"event_type":"{EVENT_TYPES[(h >> 48) % 5]}","amount":{cents // 100}.{cents % 100:02d},'
        f'"ts":"{ts}","payload":"'
    )
    pad = max(0, payload_bytes - len(head) - 2)
    return (head + _PAD[:pad] + '"}').encode()


_DATE_CACHE: dict[int, str] = {}


def _date_text(days: int) -> str:
    text = _DATE_CACHE.get(days)
    if text is None:
        from datetime import date

        text = date.fromordinal(date(1970, 1, 1).toordinal() + days).isoformat()
        _DATE_CACHE[days] = text
    return text


def sample_event(i: int, *, seed: int = 0, payload_bytes: int = 250) -> dict[str, Any]:
    """Event number `i` as a dict (what `sample_event_bytes` encodes)."""
    event: dict[str, Any] = json.loads(
        sample_event_bytes(i, seed=seed, payload_bytes=payload_bytes)
    )
    return event


def encode_event(event: Mapping[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


def make_producer(bootstrap: str, extra: Mapping[str, Any] | None = None) -> Any:
    """An idempotent producer (acks=all) with `extra` settings over lakesink's defaults."""
    from confluent_kafka import Producer

    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 20,
        "batch.num.messages": 10_000,
        "queue.buffering.max.messages": 1_000_000,
        "compression.type": "none",
    }
    config.update(extra or {})
    return new_client(Producer, config)


@dataclass
class _Delivery:
    errors: list[str]

    def __call__(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(f"{msg.topic()}:{msg.partition()}: {err}")


def produce_sample_events(
    bootstrap: str,
    topic: str,
    count: int,
    partitions: int,
    *,
    payload_bytes: int = 250,
    seed: int = 0,
    first_event_id: int = 0,
    create: bool = True,
    with_keys: bool = True,
    producer_config: Mapping[str, Any] | None = None,
    timeout_s: float = 120.0,
) -> dict[TopicPartition, int]:
    """Produce `count` events (ids `first_event_id ..`) round-robin over `partitions` partitions.

    Creates the topic first unless `create=False`. Returns the number of records per partition;
    raises KafkaError if any delivery failed."""
    if create:
        create_topic(bootstrap, topic, partitions)
    producer = make_producer(bootstrap, producer_config)
    delivery = _Delivery([])
    counts = {TopicPartition(topic, p): 0 for p in range(partitions)}
    produce = producer.produce
    for i in range(first_event_id, first_event_id + count):
        p = i % partitions
        value = sample_event_bytes(i, seed=seed, payload_bytes=payload_bytes)
        key = str(i).encode() if with_keys else None
        while True:
            try:
                produce(topic, value, key, partition=p, on_delivery=delivery)
                break
            except BufferError:
                producer.poll(0.05)
        counts[TopicPartition(topic, p)] += 1
        if i % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(timeout_s)
    if remaining:
        raise KafkaError(
            f"{remaining} sample events to {topic!r} not delivered in {timeout_s:.0f} s"
        )
    if delivery.errors:
        raise KafkaError(
            f"{len(delivery.errors)} sample events to {topic!r} failed, first: {delivery.errors[0]}"
        )
    return counts


def produce_values(
    bootstrap: str,
    topic: str,
    values: Sequence[bytes | None],
    *,
    partition: int = 0,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Sequence[tuple[str, bytes]] | None] | None = None,
    timestamps_ms: Sequence[int] | None = None,
    timeout_s: float = 30.0,
) -> None:
    """Produce the given raw values, in order, to one partition (tests with hand-made records)."""
    producer = make_producer(bootstrap, {"linger.ms": 5})
    delivery = _Delivery([])
    for n, value in enumerate(values):
        kwargs: dict[str, Any] = {"partition": partition, "on_delivery": delivery}
        if keys is not None:
            kwargs["key"] = keys[n]
        if headers is not None and headers[n] is not None:
            kwargs["headers"] = list(headers[n] or ())
        if timestamps_ms is not None:
            kwargs["timestamp"] = timestamps_ms[n]
        producer.produce(topic, value, **kwargs)
    if producer.flush(timeout_s) or delivery.errors:
        raise KafkaError(f"producing to {topic!r} failed: {delivery.errors[:1]}")


def produce_transactional(
    bootstrap: str,
    topic: str,
    transactions: Sequence[tuple[int, bool]],
    *,
    partition: int = 0,
    value: Callable[[int], bytes] | None = None,
    transactional_id: str | None = None,
    leave_open: int = 0,
    timeout_s: float = 30.0,
) -> tuple[list[int], Any]:
    """Run transactions on one partition: each `(n, commit)` produces `n` records numbered
    consecutively, then commits (True) or aborts (False) the transaction.

    `value(k)` encodes record number k (default: the JSON `{"n": k}`). With `leave_open > 0` a
    last transaction of that many records is left open (not committed, not aborted): the last
    stable offset stays before it. Returns the numbers of the committed records, in order, and
    the producer (keep it alive while the transaction must stay open; call `abort_transaction`
    or drop it after)."""
    from confluent_kafka import Producer

    encode = value or (lambda k: json.dumps({"n": k}).encode())
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id or f"lakesink-test-{topic}-{partition}",
            "acks": "all",
            "linger.ms": 5,
        }
    )
    try:
        producer.init_transactions(timeout_s)
        committed: list[int] = []
        k = 0
        for n, commit in transactions:
            producer.begin_transaction()
            numbers = list(range(k, k + n))
            k += n
            for num in numbers:
                producer.produce(topic, encode(num), partition=partition)
            if commit:
                producer.commit_transaction(timeout_s)
                committed.extend(numbers)
            else:
                producer.flush(timeout_s)  # the records must be in the log to leave a gap
                producer.abort_transaction(timeout_s)
        if leave_open:
            producer.begin_transaction()
            for num in range(k, k + leave_open):
                producer.produce(topic, encode(num), partition=partition)
            producer.flush(timeout_s)
    except Exception as e:
        raise KafkaError(f"transactional produce to {topic}:{partition} failed: {e}") from e
    return committed, producer
