"""The record keys (value.*, key.*): how a Kafka record's value and key are decoded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lakesink.config.parsers import (
    Key,
    choice,
    optional_secret,
    optional_str,
    positive_float,
    positive_int,
    schema_ids,
)
from lakesink.errors import ConfigError

if TYPE_CHECKING:
    from lakesink.kafka.registry import RegistrySettings
    from lakesink.kafka.registry_subjects import SubjectNaming

RECORD_KEYS: tuple[Key, ...] = (
    Key(
        "value.format",
        choice("json", "avro", "raw", "jsonschema", "protobuf"),
        "json",
        "How record values are decoded: json, avro, raw, or (with schema.registry.url) "
        "jsonschema or protobuf in the schema registry's wire format (the docs page Schemas).",
    ),
    Key(
        "value.schema",
        optional_str,
        None,
        "Schema of the value as a Spark DDL string, e.g. 'id BIGINT, name STRING' (with "
        "schema.registry.url and value.format=avro: an Avro record schema, whose fields are the "
        "table's columns, or a DDL). With schema.registry.url it may be left unset: the columns "
        "then come from the topic's registered value schema (the docs page Schemas).",
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
        "another id is a bad record (its writer schema is unknown). Not used with "
        "schema.registry.url.",
    ),
    Key(
        "key.format",
        choice("raw", "avro", "jsonschema", "protobuf"),
        "raw",
        "How record keys are decoded: raw (the key's bytes, in kafka_key only) or, with "
        "schema.registry.url, avro, jsonschema or protobuf in the registry's wire format: the "
        "key's fields become columns too, so table.record.key.fields may name them (a value "
        "column of the same name keeps the value's, the key's filling its nulls; the docs page "
        "Schemas).",
    ),
    Key(
        "key.schema",
        optional_str,
        None,
        "The key's columns as a Spark DDL string, for key.format avro, jsonschema or protobuf; "
        "unset: the latest schema registered under the topic's key subject (<topic>-key; under "
        "the record strategies, schema.registry.key.record.name), fixed when the ingestion "
        "starts.",
    ),
    Key(
        "schema.registry.url",
        optional_str,
        None,
        "Schema registry (Confluent-compatible API) whose ids frame the values: each value of "
        "value.format avro, jsonschema or protobuf is decoded with its own writer schema "
        "(the docs page Schemas).",
    ),
    Key(
        "schema.registry.basic.auth.user.info",
        optional_secret,
        None,
        "user:password for the schema registry's HTTP basic authentication (a secret: env:NAME "
        "or file:/path; never printed).",
        secret=True,
    ),
    Key(
        "schema.registry.ssl.ca.location",
        optional_str,
        None,
        "PEM file of the certificate authorities to trust for an https schema registry.",
    ),
    Key(
        "schema.registry.cache.capacity",
        positive_int,
        1000,
        "How many writer schemas (by id) each process keeps after fetching them.",
    ),
    Key(
        "schema.registry.retry.s",
        positive_float,
        60.0,
        "How long an unreachable schema registry is retried (with backoff) before the batch "
        "fails with one error.",
    ),
    Key(
        "schema.registry.subject.strategy",
        choice("topic", "record", "topic-record"),
        "topic",
        "Under which subject the values' schemas are registered (where the columns are looked "
        "up when the ingestion starts): topic (`<topic>-value`), record (the record's full "
        "name, schema.registry.record.name) or topic-record (`<topic>-<record name>`).",
    ),
    Key(
        "schema.registry.record.name",
        optional_str,
        None,
        "The full name of the value record (namespace.name, e.g. shop.public.customers.Envelope "
        "for a Debezium topic) for schema.registry.subject.strategy record or topic-record.",
    ),
    Key(
        "schema.registry.key.record.name",
        optional_str,
        None,
        "The full name of the key record (namespace.name; a Protobuf key's message full name, "
        "a JSON Schema key's title) whose latest schema gives the key's columns under "
        "schema.registry.subject.strategy record (subject `<key record name>`) or topic-record "
        "(`<topic>-<key record name>`), for key.format avro, jsonschema or protobuf without "
        "key.schema.",
    ),
)


def registry_settings(values: Mapping[str, Any]) -> RegistrySettings | None:
    """The schema.registry.* keys as the decoders take them; None without schema.registry.url."""
    from lakesink.kafka.registry import RegistrySettings

    if not values["schema.registry.url"]:
        return None
    return RegistrySettings(
        url=values["schema.registry.url"],
        user_info=values["schema.registry.basic.auth.user.info"],
        ca_location=values["schema.registry.ssl.ca.location"],
        cache_capacity=values["schema.registry.cache.capacity"],
        retry_s=values["schema.registry.retry.s"],
    )


def subject_naming(values: Mapping[str, Any]) -> SubjectNaming:
    """schema.registry.subject.strategy and schema.registry.record.name as the subject lookups
    take them; ConfigError when they do not go together."""
    from lakesink.kafka.registry_subjects import SubjectNaming

    return SubjectNaming(
        values["schema.registry.subject.strategy"],
        values["schema.registry.record.name"],
        values["schema.registry.key.record.name"],
    )


def check_registry_use(values: Mapping[str, Any]) -> None:
    """With schema.registry.url: the subject naming keys together, and what a change stream
    (write.operation=cdc) reads through the registry: Avro values (Debezium envelopes as its
    Avro converter registers them, or records with an operation field; docs/cdc.md);
    ConfigError naming the key otherwise."""
    subject_naming(values)
    if values["write.operation"] == "cdc" and values["value.format"] != "avro":
        raise ConfigError(
            "write.operation=cdc reads values through schema.registry.url in Avro (Debezium's "
            f"Avro converter): set value.format=avro, not {values['value.format']}"
        )


def check_key_format(values: Mapping[str, Any]) -> None:
    """key.format, key.schema and schema.registry.key.record.name against the registry keys: a
    key decoded through the registry needs schema.registry.url; its subject follows the subject
    strategy (`<topic>-key`, or the key record's name under record and topic-record, which then
    need it unless key.schema declares the columns); a change stream takes its key fields from
    the change event. ConfigError naming the key."""
    fmt = values["key.format"]
    key_record = values["schema.registry.key.record.name"]
    if fmt == "raw":
        for name in ("key.schema", "schema.registry.key.record.name"):
            if values[name] is not None:
                raise ConfigError(
                    f"{name} applies to key.format avro, jsonschema or protobuf; with "
                    "key.format=raw the key is only the bytes in kafka_key"
                )
        return
    if not values["schema.registry.url"]:
        raise ConfigError(
            f"key.format={fmt} needs schema.registry.url: keys are framed by the registry's "
            "schema ids"
        )
    if values["write.operation"] == "cdc":
        raise ConfigError(
            f"key.format={fmt} does not apply to write.operation=cdc: a change event carries "
            "its key fields (Debezium's before/after); leave key.format at raw"
        )
    strategy = values["schema.registry.subject.strategy"]
    if strategy == "topic":
        if key_record is not None:
            raise ConfigError(
                "schema.registry.key.record.name applies to schema.registry.subject.strategy "
                "record or topic-record; the topic strategy names the key subject <topic>-key"
            )
    elif not key_record and values["key.schema"] is None:
        # the key's columns come from its subject, which the key record's name makes
        raise ConfigError(
            f"key.format={fmt} under schema.registry.subject.strategy={strategy} needs "
            "schema.registry.key.record.name (the full name, namespace.name, of the key record "
            "its schemas are registered under) or the key's columns in key.schema"
        )
