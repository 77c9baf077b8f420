"""The bad-record keys (errors.*): fail the batch, or send bad records to a dead-letter topic
or table."""

from __future__ import annotations

from lakesink.config.parsers import Key, choice, optional_str

DEAD_LETTER_KEYS: tuple[Key, ...] = (
    Key(
        "errors.tolerance",
        choice("none", "all"),
        "none",
        "none: a bad record fails the batch; all: it goes to the dead-letter topic or table.",
    ),
    Key(
        "errors.deadletter.topic",
        optional_str,
        None,
        "Kafka topic for records that fail to decode (errors.tolerance=all; at least once: "
        "deduplicate on the lakesink.source.* headers).",
    ),
    Key(
        "errors.deadletter.table",
        optional_str,
        None,
        "Path of a Hudi dead-letter table for records that fail to decode "
        "(errors.tolerance=all; exactly once, committed with the main table's offsets); with "
        "table.format=iceberg the name of an Iceberg table in iceberg.namespace of the same "
        "catalog.",
    ),
)
