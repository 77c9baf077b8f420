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
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Literal

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

Format = Literal["json", "avro", "raw"]
FORMATS: tuple[Format, ...] = ("json", "avro", "raw")


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
) -> Deserializer:
    """A deserializer by name. `schema` is a Spark DDL (json) or Avro schema JSON (avro);
    `schema_file` a file holding either (a `.avsc` for avro, DDL text for json)."""
    fmt = format.lower().strip()
    if fmt not in FORMATS:
        raise ConfigError(f"value format {format!r} is not valid; use one of {', '.join(FORMATS)}")
    if fmt == "raw":
        if schema or schema_file:
            raise ConfigError("the raw format takes no schema (the value is one binary column)")
        return RawDeserializer()
    if schema is not None and schema_file is not None:
        raise ConfigError(f"give the {fmt} schema either inline or as a file, not both")
    if schema is None and schema_file is None:
        raise ConfigError(f"the {fmt} format needs a schema (inline or schema file)")
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
