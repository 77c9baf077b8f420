"""Deserializers turn a list of Kafka record values into Arrow value columns, in bulk.

A Deserializer has a fixed `value_schema` and a `decode(values)` that returns the good rows as an
Arrow table (in input order) plus the index and reason of every value it could not convert. The
reader pairs the good rows with their Kafka metadata and routes the failures by errors.tolerance.
Every format decodes each value on its own terms: whatever a bulk path does for speed, the rows and
failures are those of the format's per-value rules (docs/bad-records.md).

- JsonDeserializer (json_bulk.py, rules in json_values.py): exactly one JSON object per value, in
  UTF-8, numbers within the column types, no coercion; pyarrow.json where it provably agrees.
- AvroDeserializer (avro.py): fastavro; Confluent framing checked against the accepted schema ids.
- RawDeserializer: the value as one nullable binary column `value` (nothing is refused).
- RegistryDeserializer (registry.py): avro, jsonschema or protobuf framed by a schema registry's
  ids, each value decoded with its own writer schema and resolved to the declared columns.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pyarrow as pa

from lakesink.errors import ConfigError
from lakesink.kafka.avro import (
    WIRE_FORMATS,
    AvroDeserializer,
    WireFormat,
    avro_to_arrow_type,
    parse_schema_ids,
)
from lakesink.kafka.decoded import Decoded, Deserializer
from lakesink.kafka.json_bulk import JsonDeserializer

if TYPE_CHECKING:
    from lakesink.kafka.registry import RegistrySettings

__all__ = [
    "FORMATS",
    "WIRE_FORMATS",
    "AvroDeserializer",
    "Decoded",
    "Deserializer",
    "Format",
    "JsonDeserializer",
    "RawDeserializer",
    "WireFormat",
    "avro_to_arrow_type",
    "make_deserializer",
    "parse_schema_ids",
]

Format = Literal["json", "avro", "raw", "jsonschema", "protobuf"]
FORMATS: tuple[Format, ...] = ("json", "avro", "raw", "jsonschema", "protobuf")


class RawDeserializer:
    """The value bytes as one nullable binary column `value` (a tombstone is a null)."""

    SCHEMA = pa.schema([pa.field("value", pa.binary())])

    @property
    def value_schema(self) -> pa.Schema:
        return self.SCHEMA

    def decode(self, values: Sequence[bytes | None]) -> Decoded:
        return Decoded(pa.table([pa.array(values, pa.binary())], schema=self.SCHEMA))


def make_deserializer(
    format: str,
    schema: str | None = None,
    schema_file: str | None = None,
    *,
    avro_wire_format: WireFormat = "confluent",
    avro_schema_ids: str | Collection[int] | None = None,
    registry: RegistrySettings | None = None,
    evolution: str = "off",
) -> Deserializer:
    """A deserializer by name. `schema` is a Spark DDL (json, jsonschema, protobuf) or Avro
    schema JSON (avro); `schema_file` a file holding either (a `.avsc` for avro, DDL text
    otherwise). With `registry`, avro, jsonschema and protobuf values are framed by the
    registry's ids and `schema` declares the table's columns (for avro an Avro record schema or,
    as the registry-driven columns are pinned for a run, a DDL); `evolution` is
    schema.evolution, which decides what a writer schema wider than the columns does."""
    fmt = format.lower().strip()
    if fmt not in FORMATS:
        raise ConfigError(f"value format {format!r} is not valid; use one of {', '.join(FORMATS)}")
    if fmt in ("jsonschema", "protobuf") and registry is None:
        raise ConfigError(f"value.format={fmt} needs schema.registry.url")
    if fmt == "raw":
        if schema or schema_file:
            raise ConfigError("the raw format takes no schema (the value is one binary column)")
        return RawDeserializer()
    if schema is not None and schema_file is not None:
        raise ConfigError(f"give the {fmt} schema either inline or as a file, not both")
    if schema is None and schema_file is None:
        raise ConfigError(f"the {fmt} format needs a schema (inline or schema file)")
    if registry is not None and fmt != "json":
        from lakesink.kafka.registry import RegistryDeserializer, RegistryFormat

        registry_format: RegistryFormat = fmt
        return RegistryDeserializer(
            registry_format, _columns(fmt, schema, schema_file), registry, evolution
        )
    if fmt == "avro":
        if schema_file is not None:
            return AvroDeserializer(
                schema_file, wire_format=avro_wire_format, schema_ids=avro_schema_ids
            )
        return AvroDeserializer(
            schema=schema, wire_format=avro_wire_format, schema_ids=avro_schema_ids
        )
    if schema_file is not None:
        try:
            schema = Path(schema_file).read_text()
        except OSError as e:
            raise ConfigError(f"cannot read the JSON value schema file {schema_file}: {e}") from e
    assert schema is not None
    return JsonDeserializer(schema)


def _columns(fmt: str, schema: str | None, schema_file: str | None) -> pa.Schema:
    """The declared columns: an Avro record schema's fields for avro, a DDL otherwise."""
    from lakesink.kafka.ddl import ddl_to_arrow

    if schema_file is not None:
        try:
            schema = Path(schema_file).read_text()
        except OSError as e:
            raise ConfigError(f"cannot read the value schema file {schema_file}: {e}") from e
    assert schema is not None
    if fmt != "avro" or not schema.lstrip().startswith("{"):
        return ddl_to_arrow(schema)
    try:
        raw = json.loads(schema)
    except ValueError as e:
        raise ConfigError(f"the Avro value schema is not JSON: {e}") from e
    if not isinstance(raw, dict) or raw.get("type") != "record":
        raise ConfigError("the Avro value schema must be a record schema")
    return pa.schema(list(avro_to_arrow_type(raw)))
