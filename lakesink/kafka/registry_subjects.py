"""The subjects of a schema registry and the columns of their registered versions (the
mapping of each format to Arrow: registry_schemas.py); spark/registry_columns.py evolves a run's
columns with them.

A topic's value subject follows one of the registry clients' subject name strategies
(`SubjectNaming`): topic (`<topic>-value`, the default), record (the value record's full name,
`namespace.name`, whatever the topic) or topic-record (`<topic>-<record full name>`). A record
strategy lets several record types share a topic, so lakesink is told which record is the
table's (schema.registry.record.name)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from lakesink.errors import ConfigError
from lakesink.kafka.avro import avro_to_arrow_type
from lakesink.kafka.registry import (
    RegistryFormat,
    RegistrySettings,
    UnknownSchemaId,
    _fetch,
    _file_descriptor,
    _ProtobufWriter,
)
from lakesink.kafka.registry_schemas import avro_defaults, json_schema_columns, proto_message_struct

__all__ = [
    "SUBJECT_STRATEGIES",
    "SubjectNaming",
    "SubjectStrategy",
    "WriterColumns",
    "latest_version",
    "schema_by_id",
    "subject_for",
    "subject_versions",
    "writer_columns",
]

SubjectStrategy = Literal["topic", "record", "topic-record"]
SUBJECT_STRATEGIES: tuple[SubjectStrategy, ...] = ("topic", "record", "topic-record")


@dataclass(frozen=True, slots=True)
class WriterColumns:
    """A writer schema's columns and the dotted paths of its fields that have a default."""

    schema: pa.Schema
    defaults: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class SubjectNaming:
    """How the value subject of a topic is named (schema.registry.subject.strategy and
    schema.registry.record.name)."""

    strategy: SubjectStrategy = "topic"
    record_name: str | None = None
    """The value record's full name (`namespace.name`); required by record and topic-record."""
    key_record_name: str | None = None
    """The key record's full name, for the key subject under record and topic-record (the
    config's checks require it where the key's columns come from the registry)."""

    def __post_init__(self) -> None:
        if self.strategy not in SUBJECT_STRATEGIES:
            raise ConfigError(
                f"schema.registry.subject.strategy={self.strategy} is not one of "
                f"{', '.join(SUBJECT_STRATEGIES)}"
            )
        if self.strategy == "topic":
            if self.record_name is not None:
                raise ConfigError(
                    "schema.registry.record.name applies to schema.registry.subject.strategy "
                    "record or topic-record; the topic strategy names subjects <topic>-value"
                )
        elif not self.record_name:
            raise ConfigError(
                f"schema.registry.subject.strategy={self.strategy} needs "
                "schema.registry.record.name: the full name (namespace.name) of the value "
                "record the table's schemas are registered under"
            )

    def subject(self, topic: str) -> str:
        """The value subject of `topic`."""
        if self.strategy == "topic":
            return f"{topic}-value"
        if self.strategy == "record":
            return str(self.record_name)
        return f"{topic}-{self.record_name}"

    def key_subject(self, topic: str) -> str:
        """The key subject of `topic`: as the value's, with the key record's name (Confluent's
        serializers name a key's subject by the same strategy, from the key's own record)."""
        if self.strategy == "topic":
            return f"{topic}-key"
        if not self.key_record_name:
            raise ConfigError(
                f"schema.registry.subject.strategy={self.strategy} needs "
                "schema.registry.key.record.name to name the key subject"
            )
        if self.strategy == "record":
            return self.key_record_name
        return f"{topic}-{self.key_record_name}"


def subject_for(topic: str, naming: SubjectNaming | None = None) -> str:
    """The value subject of `topic` under `naming` (None: the topic name strategy)."""
    return (naming or SubjectNaming()).subject(topic)


def subject_versions(settings: RegistrySettings, subject: str, fmt: RegistryFormat) -> list[Any]:
    """The subject's registered schemas (confluent-kafka RegisteredSchema), oldest version
    first; empty when the registry has no such subject. One request per version: a run's start
    asks only for the latest (`latest_version`)."""
    try:
        versions = _fetch(settings, lambda c: c.get_versions(subject), f"subject {subject}")
    except UnknownSchemaId:
        return []
    wire = "serialized" if fmt == "protobuf" else None
    out = []
    for v in sorted(versions):

        def get(client: Any, v: int = v) -> Any:
            return client.get_version(subject, v, fmt=wire)

        out.append(_fetch(settings, get, f"version {v} of subject {subject}"))
    return out


def latest_version(settings: RegistrySettings, subject: str, fmt: RegistryFormat) -> Any | None:
    """The subject's latest registered schema (confluent-kafka RegisteredSchema), in one request;
    None when the registry has no such subject. Asked as version "latest" rather than with the
    client's get_latest_version, which keeps its answer for the life of the process (per subject,
    whatever the format): a run started later in the same process must see a newer version."""
    wire = "serialized" if fmt == "protobuf" else None

    def get(client: Any) -> Any:
        return client.get_version(subject, "latest", fmt=wire)

    try:
        return _fetch(settings, get, f"the latest version of subject {subject}")
    except UnknownSchemaId:
        return None


def schema_by_id(settings: RegistrySettings, schema_id: int, fmt: RegistryFormat) -> Any:
    """The schema (confluent-kafka Schema) registered under `schema_id`; UnknownSchemaId when
    the registry does not know it (the client caches it by id)."""
    wire = "serialized" if fmt == "protobuf" else None
    return _fetch(settings, lambda c: c.get_schema(schema_id, fmt=wire), f"schema id {schema_id}")


def writer_columns(
    fmt: RegistryFormat, schema: Any, settings: RegistrySettings, record_name: str | None = None
) -> WriterColumns:
    """The columns of a registered schema (confluent-kafka Schema) of format `fmt`; ConfigError
    when it has no column mapping. A Protobuf file's columns are those of its message
    `record_name` (the record strategies' subjects name it: one file may hold a topic's key
    and value messages) or, without one, of its one top-level message that no other message
    of the file uses (ConfigError when that is not one message)."""
    try:
        if fmt == "avro":
            return _avro_columns(json.loads(schema.schema_str))
        if fmt == "jsonschema":
            return WriterColumns(json_schema_columns(json.loads(schema.schema_str)))
        return _proto_columns(settings, schema, record_name)
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"the registered {fmt} schema has no column mapping: {e}") from e


def _avro_columns(raw: Any) -> WriterColumns:
    if not isinstance(raw, dict) or raw.get("type") != "record":
        raise ConfigError("the registered Avro schema is not a record")
    struct = avro_to_arrow_type(raw)
    defaults: set[str] = set()
    avro_defaults(raw, "", defaults)
    return WriterColumns(pa.schema(list(struct)), frozenset(defaults))


def _proto_columns(
    settings: RegistrySettings, schema: Any, record_name: str | None
) -> WriterColumns:
    _file_descriptor(schema.schema_str)  # the same clear error for .proto text
    writer = _ProtobufWriter(settings, schema)
    named = writer.message_named(record_name) if record_name is not None else None
    message = named if named is not None else writer.value_message()
    return WriterColumns(pa.schema(list(proto_message_struct(message))))
