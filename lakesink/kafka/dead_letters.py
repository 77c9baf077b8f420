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

from lakesink.errors import KafkaAuthorizationError, KafkaError
from lakesink.kafka.security import AUTHORIZATION_CODES, ClientErrors, new_client
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

        if not topic:
            raise KafkaError("a dead-letter sink needs a topic name")
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 20,
        }
        config.update(producer_config or {})
        config["bootstrap.servers"] = bootstrap
        self.topic = topic
        self.flush_timeout_s = flush_timeout_s
        self._client_errors = ClientErrors(bootstrap, config)
        self._producer = new_client(Producer, config, self._client_errors)
        self._errors: list[str] = []
        self._authorization_error: Any = None
        self.sent = 0
        self.delivered = 0

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(str(err))
            if self._authorization_error is None and err.code() in AUTHORIZATION_CODES:
                self._authorization_error = err
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
        self._client_errors.raise_failure()
        if self._authorization_error is not None:
            raise KafkaAuthorizationError(
                f"principal {self._client_errors.principal} is not authorized to write dead "
                f"letters to topic {self.topic!r} on Kafka broker {self._client_errors.bootstrap} "
                f"({self._authorization_error.str()}): grant it WRITE and DESCRIBE ACLs on it"
            )
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
