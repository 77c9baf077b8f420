"""The record keys (value.*): how a Kafka record's value is decoded."""

from __future__ import annotations

from lakesink.config.parsers import Key, choice, optional_str, schema_ids

RECORD_KEYS: tuple[Key, ...] = (
    Key("value.format", choice("json", "avro", "raw"), "json", "How record values are decoded."),
    Key(
        "value.schema",
        optional_str,
        None,
        "Schema of the value as a Spark DDL string, e.g. 'id BIGINT, name STRING'.",
    ),
    Key(
        "value.schema.file",
        optional_str,
        None,
        "File with the value schema (Avro .avsc for avro; a DDL text file for json).",
    ),
    Key(
        "value.avro.wire.format",
        choice("confluent", "plain"),
        "confluent",
        "Avro values: confluent (magic byte 0 + 4-byte schema id + Avro) or plain (bare Avro).",
    ),
    Key(
        "value.avro.schema.ids",
        schema_ids,
        (),
        "Confluent-framed Avro: the schema registry ids (comma list) under which the value schema "
        "is registered; required with value.avro.wire.format=confluent. A value framed with "
        "another id is a bad record (its writer schema is unknown).",
    ),
)
