"""Records that could not be deserialized (errors.tolerance=all), and where they go.

A FailedRecord keeps the raw record and the reason. `DeadLetterSink` produces failed records to a
Kafka topic (acks=all, idempotent) with the raw key and value, the original headers, and headers
naming the source topic, partition, offset and the error. A dead-letter table is written by the
Spark layer from `dead_letter_batch`. Replayed batches produce their dead letters again: readers
of the dead-letter topic deduplicate on the source topic/partition/offset headers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lakesink.errors import KafkaError
from lakesink.protocol.offsets import TopicPartition
from lakesink.protocol.write_status import DeadLetter

HEADER_TYPE = pa.list_(
    pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())])
)
"""Kafka headers as Arrow: a list of (key, value) structs, order and duplicates kept."""

SOURCE_TOPIC_HEADER = "lakesink.source.topic"
SOURCE_PARTITION_HEADER = "lakesink.source.partition"
SOURCE_OFFSET_HEADER = "lakesink.source.offset"
SOURCE_TIMESTAMP_HEADER = "lakesink.source.timestamp"
ERROR_HEADER = "lakesink.error"


@dataclass(frozen=True, slots=True)
class FailedRecord:
    """A record that could not be deserialized, with everything needed to replay it."""

    partition: TopicPartition
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    error: str

    def to_dead_letter(self) -> DeadLetter:
        return DeadLetter(self.partition, self.offset, self.error)


DEAD_LETTER_SCHEMA = pa.schema(
    [
        pa.field("kafka_topic", pa.string(), nullable=False),
        pa.field("kafka_partition", pa.int32(), nullable=False),
        pa.field("kafka_offset", pa.int64(), nullable=False),
        pa.field("kafka_timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("kafka_key", pa.binary()),
        pa.field("kafka_value", pa.binary()),
        pa.field("kafka_headers", HEADER_TYPE),
        pa.field("error", pa.string(), nullable=False),
    ]
)
"""The columns of a dead-letter table."""


def timestamps_array(ms: list[int | None]) -> pa.Array:
    """Milliseconds since the epoch as timestamp(us, UTC)."""
    arr = pa.array(ms, pa.int64())
    return pc.multiply(arr, 1000).cast(pa.timestamp("us", tz="UTC"))


def headers_array(headers: list[Any]) -> pa.Array:
    """confluent-kafka header lists (or None) as HEADER_TYPE."""
    if not any(headers):
        return pa.nulls(len(headers), HEADER_TYPE)
    return pa.array(
        [None if h is None else [{"key": k, "value": v} for k, v in h] for h in headers],
        HEADER_TYPE,
    )


def dead_letter_batch(records: list[FailedRecord]) -> pa.RecordBatch:
    """Failed records as one Arrow batch of DEAD_LETTER_SCHEMA (for a dead-letter table)."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([r.partition.topic for r in records], pa.string()),
            pa.array([r.partition.partition for r in records], pa.int32()),
            pa.array([r.offset for r in records], pa.int64()),
            timestamps_array([r.timestamp_ms for r in records]),
            pa.array([r.key for r in records], pa.binary()),
            pa.array([r.value for r in records], pa.binary()),
            headers_array([list(r.headers) or None for r in records]),
            pa.array([r.error for r in records], pa.string()),
        ],
        schema=DEAD_LETTER_SCHEMA,
    )


def dead_letter_headers(record: FailedRecord) -> list[tuple[str, str | bytes | None]]:
    """The original headers, then lakesink's source and error headers."""
    out: list[tuple[str, str | bytes | None]] = list(record.headers)
    out += [
        (SOURCE_TOPIC_HEADER, record.partition.topic.encode()),
        (SOURCE_PARTITION_HEADER, str(record.partition.partition).encode()),
        (SOURCE_OFFSET_HEADER, str(record.offset).encode()),
        (ERROR_HEADER, record.error.encode()),
    ]
    if record.timestamp_ms is not None:
        out.append((SOURCE_TIMESTAMP_HEADER, str(record.timestamp_ms).encode()))
    return out


class DeadLetterSink:
    """Produces failed records to one Kafka topic; `flush()` makes them durable or raises.

    Call `flush()` before reporting the read as done: a dead letter not acknowledged by the
    broker must fail the task, never vanish."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        producer_config: Mapping[str, Any] | None = None,
        flush_timeout_s: float = 60.0,
    ) -> None:
        from confluent_kafka import Producer

        from lakesink.kafka.client import client_logging

        if not topic:
            raise KafkaError("a dead-letter sink needs a topic name")
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 20,
            **client_logging(),
        }
        config.update(producer_config or {})
        self.topic = topic
        self.flush_timeout_s = flush_timeout_s
        self._producer = Producer(config)
        self._errors: list[str] = []
        self.sent = 0
        self.delivered = 0

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(str(err))
        else:
            self.delivered += 1

    def send(self, record: FailedRecord) -> None:
        while True:
            try:
                self._producer.produce(
                    self.topic,
                    value=record.value,
                    key=record.key,
                    headers=dead_letter_headers(record),
                    on_delivery=self._on_delivery,
                )
                break
            except BufferError:
                self._producer.poll(0.05)
        self.sent += 1
        self._producer.poll(0)

    def __call__(self, record: FailedRecord) -> None:
        self.send(record)

    def send_all(self, records: Iterable[FailedRecord]) -> None:
        for r in records:
            self.send(r)

    def flush(self) -> None:
        """Wait until every dead letter is acknowledged; KafkaError if any was not."""
        remaining = self._producer.flush(self.flush_timeout_s)
        if remaining:
            raise KafkaError(
                f"{remaining} dead letters to topic {self.topic!r} not acknowledged within "
                f"{self.flush_timeout_s:.0f} s"
            )
        if self._errors:
            raise KafkaError(
                f"{len(self._errors)} dead letters to topic {self.topic!r} failed; first: "
                f"{self._errors[0]}"
            )

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> DeadLetterSink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.flush()
        else:
            self._producer.flush(min(5.0, self.flush_timeout_s))


def dead_letter_sources(
    bootstrap: str, topic: str, consumer_config: Mapping[str, Any] | None = None
) -> set[tuple[str, int, int]]:
    """The (topic, partition, offset) of every source record in dead-letter topic `topic`,
    read from lakesink's source headers (duplicates from replays collapse)."""
    from lakesink.kafka.client import OffsetClient, list_partitions
    from lakesink.kafka.deserializers import RawDeserializer
    from lakesink.kafka.reader import read_range
    from lakesink.protocol.offsets import OffsetRange

    out: set[tuple[str, int, int]] = set()
    parts = list_partitions(bootstrap, [topic])
    with OffsetClient(bootstrap, extra=consumer_config) as client:
        marks = client.watermarks(parts)
    for tp, (low, high) in marks.items():
        for batch in read_range(
            bootstrap,
            OffsetRange(tp, low, high),
            deserializer=RawDeserializer(),
            consumer_config=dict(consumer_config or {}),
        ):
            for headers in batch.column("kafka_headers").to_pylist():
                h = {e["key"]: e["value"] for e in headers or []}
                try:
                    out.add(
                        (
                            h[SOURCE_TOPIC_HEADER].decode(),
                            int(h[SOURCE_PARTITION_HEADER]),
                            int(h[SOURCE_OFFSET_HEADER]),
                        )
                    )
                except (KeyError, ValueError, AttributeError):
                    continue  # not a lakesink dead letter
    return out
