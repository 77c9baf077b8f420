"""Reading a dead-letter topic back: which source records it holds (for the exactly-once audit).

The records are produced by `lakesink.kafka.dead_letters.DeadLetterSink` and read here with the
range reader, so the reader and the sink it writes failed records to need not know each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lakesink.kafka.client import OffsetClient, list_partitions
from lakesink.kafka.dead_letters import (
    SOURCE_OFFSET_HEADER,
    SOURCE_PARTITION_HEADER,
    SOURCE_TOPIC_HEADER,
)
from lakesink.kafka.deserializers import RawDeserializer
from lakesink.kafka.reader import read_range
from lakesink.protocol.offsets import OffsetRange


def dead_letter_sources(
    bootstrap: str,
    topic: str,
    consumer_config: Mapping[str, Any] | None = None,
    admin_config: Mapping[str, Any] | None = None,
) -> set[tuple[str, int, int]]:
    """The (topic, partition, offset) of every source record in dead-letter topic `topic`,
    read from lakesink's source headers (duplicates from replays collapse). `admin_config`:
    settings of the admin client listing the topic (security)."""
    out: set[tuple[str, int, int]] = set()
    parts = list_partitions(bootstrap, [topic], extra=admin_config)
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
