"""The subjects of a schema registry and the columns of their registered versions (the
mapping of each format to Arrow: registry_schemas.py); spark/registry_columns.py evolves a run's
columns with them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

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

__all__ = ["WriterColumns", "subject_for", "subject_versions", "writer_columns"]


@dataclass(frozen=True, slots=True)
class WriterColumns:
    """A writer schema's columns and the dotted paths of its fields that have a default."""

    schema: pa.Schema
    defaults: frozenset[str] = frozenset()


def subject_for(topic: str) -> str:
    """The value subject of `topic` under the topic name strategy."""
    return f"{topic}-value"


def subject_versions(settings: RegistrySettings, subject: str, fmt: RegistryFormat) -> list[Any]:
    """The subject's registered schemas (confluent-kafka RegisteredSchema), oldest version
    first; empty when the registry has no such subject."""
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


def writer_columns(fmt: RegistryFormat, schema: Any, settings: RegistrySettings) -> WriterColumns:
    """The columns of a registered schema (confluent-kafka Schema) of format `fmt`; ConfigError
    when it has no column mapping."""
    try:
        if fmt == "avro":
            return _avro_columns(json.loads(schema.schema_str))
        if fmt == "jsonschema":
            return WriterColumns(json_schema_columns(json.loads(schema.schema_str)))
        return _proto_columns(settings, schema)
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"the registered {fmt} schema has no column mapping: {e}") from e


def _avro_columns(raw: Any) -> WriterColumns:
    if not isinstance(raw, dict) or raw.get("type") != "record":
        raise ConfigError("the registered Avro schema is not a record")
    struct = avro_to_arrow_type(raw)
    defaults: set[str] = set()
    avro_defaults(raw, "", defaults)
    return WriterColumns(pa.schema(list(struct)), frozenset(defaults))


def _proto_columns(settings: RegistrySettings, schema: Any) -> WriterColumns:
    _file_descriptor(schema.schema_str)  # the same clear error for .proto text
    message = _ProtobufWriter(settings, schema).message_class((0,)).DESCRIPTOR
    return WriterColumns(pa.schema(list(proto_message_struct(message))))
