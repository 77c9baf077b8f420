"""The Kafka keys: brokers, topics, where a writer starts, batch sizes, client settings, and
the security keys (defined in lakesink.security: every client lakesink creates gets them)."""

from __future__ import annotations

from lakesink import security
from lakesink.config.parsers import (
    Key,
    boolean,
    choice,
    optional_positive_int,
    optional_str,
    positive_int,
    starting_offsets,
    str_list,
)

SECURITY_KEYS: tuple[Key, ...] = tuple(
    Key(k.name, k.parse, k.default, k.doc, secret=k.secret) for k in security.KEY_SPECS
)

KAFKA_KEYS: tuple[Key, ...] = (
    Key(
        "kafka.bootstrap.servers", str, None, "Kafka brokers, host:port[,host:port].", required=True
    ),
    Key(
        "kafka.topics", str_list, (), "Topics to ingest, comma-separated (or kafka.topic.pattern)."
    ),
    Key("kafka.topic.pattern", optional_str, None, "Regular expression of topics to ingest."),
    Key(
        "kafka.starting.offsets",
        starting_offsets,
        "earliest",
        "Where a writer with no committed offsets starts: earliest, latest or epoch ms "
        "(resolved at every start until the writer's first commit).",
    ),
    Key(
        "kafka.isolation.level",
        choice("read_committed", "read_uncommitted"),
        "read_committed",
        "Read only committed transactional records (read_committed) or all.",
    ),
    Key(
        "kafka.fail.on.data.loss",
        boolean,
        True,
        "Fail when committed offsets lie below the log start (records deleted before ingestion), "
        "or when a batch a restart runs again was planned beyond the log end (the broker lost "
        "acknowledged records since); false passes over the deleted offsets, or ends the batch "
        "at the log end, recorded in the commit and listed by `lakesink status`.",
    ),
    Key(
        "kafka.max.records.per.batch",
        optional_positive_int,
        500_000,
        "Most offsets one micro-batch reads across all partitions (empty: no cap).",
    ),
    Key(
        "kafka.max.records.per.task",
        positive_int,
        250_000,
        "A partition's range is split into Spark tasks of at most this many offsets.",
    ),
    Key(
        "kafka.consumer.config",
        optional_str,
        None,
        "Extra librdkafka settings of the consumers only, 'k=v,k=v' (e.g. "
        "fetch.max.bytes=1000000); settings every client needs go in kafka.client.config or "
        "the kafka.security keys.",
    ),
    *SECURITY_KEYS,
)
