"""Avro record values (bare or in the Confluent wire format) into Arrow columns, with fastavro.

The rules, value by value (`AvroDeserializer.decode_one`; `decode` gives the same rows and
failures for a whole batch, a differential test checks it):

- Tombstone (null value): a row of nulls when every value column is nullable (a ``["null", T]``
  union), otherwise a failure naming the required column.
- Confluent wire format: magic byte 0, a 4-byte big-endian schema id, then the Avro bytes. Without
  a schema registry the writer's schema cannot be looked up, so only the ids listed in
  ``value.avro.schema.ids`` (the ids under which the configured schema is registered) are
  accepted; a value framed with another id is a failure naming the id found and those accepted.
  With one (registry.py), each id's writer schema gets a deserializer of its own accepting that id.
- The Avro bytes must decode with the configured schema to exactly the value's length (no
  trailing bytes); strings must be valid UTF-8; every value must fit its column (an ``int``
  beyond 32 bits, a decimal beyond its precision, a timestamp beyond the calendar are failures).
  Avro floats are IEEE values: NaN and infinities are kept as written.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa

from lakesink.errors import ConfigError
from lakesink.kafka.decoded import Decoded, concat_in_order, reason, rows_to_table


def _decode_failure(e: Exception, size: int) -> str:
    """What was wrong with the bytes, in words that are the same on every run (fastavro's
    own texts name a buffer object by its address, or an index)."""
    if isinstance(e, EOFError):
        detail = reason(e) if str(e).strip() else ""
        if detail.startswith("Expected -"):
            return "a length in the value is negative"
        return f"the {size}-byte value ends before its record does" + (
            f" ({detail})" if detail else ""
        )
    if isinstance(e, IndexError):
        return "an enum symbol or union branch index in the value is out of range"
    return reason(e)


class BadAvroValue(ValueError):
    """One value breaks the Avro rules; the message says how."""


WireFormat = Literal["confluent", "plain"]
WIRE_FORMATS = ("confluent", "plain")


def avro_to_arrow_type(schema: Any, named: dict[str, pa.DataType] | None = None) -> pa.DataType:
    """The Arrow type of a (parsed JSON) Avro schema."""
    named = {} if named is None else named
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            raise ConfigError(
                f'Avro union {schema!r} is not supported: only ["null", T] unions map to columns'
            )
        return avro_to_arrow_type(branches[0], named)
    if isinstance(schema, str):
        prim = {
            "null": pa.null(),
            "boolean": pa.bool_(),
            "int": pa.int32(),
            "long": pa.int64(),
            "float": pa.float32(),
            "double": pa.float64(),
            "bytes": pa.binary(),
            "string": pa.string(),
        }
        if schema in prim:
            return prim[schema]
        if schema in named:
            return named[schema]
        raise ConfigError(f"Avro type {schema!r} is unknown")
    if not isinstance(schema, dict):
        raise ConfigError(f"Avro schema {schema!r} is not valid")
    kind = schema.get("type")
    logical = schema.get("logicalType")
    if logical in ("timestamp-millis", "timestamp-micros"):
        return pa.timestamp("us", tz="UTC")
    if logical in ("local-timestamp-millis", "local-timestamp-micros"):
        return pa.timestamp("us")
    if logical == "date":
        return pa.date32()
    if logical == "decimal":
        return pa.decimal128(int(schema["precision"]), int(schema.get("scale", 0)))
    if logical == "uuid":
        return pa.string()
    if kind == "record":
        fields = [
            pa.field(
                f["name"], avro_to_arrow_type(f["type"], named), nullable=_avro_nullable(f["type"])
            )
            for f in schema["fields"]
        ]
        t: pa.DataType = pa.struct(fields)
    elif kind == "enum":
        t = pa.string()
    elif kind == "fixed":
        t = pa.binary(int(schema["size"]))
    elif kind == "array":
        if _zero_width(schema["items"], named):
            raise ConfigError(
                f"Avro array of {schema['items']!r} is not supported: its items take no bytes, "
                "so a value of a few bytes could hold billions of them (a decoder hang)"
            )
        t = pa.list_(avro_to_arrow_type(schema["items"], named))
    elif kind == "map":
        t = pa.map_(pa.string(), avro_to_arrow_type(schema["values"], named))
    else:
        return avro_to_arrow_type(kind, named)
    if "name" in schema:
        named[schema["name"]] = t
        if "namespace" in schema:
            named[f"{schema['namespace']}.{schema['name']}"] = t
    return t


def _zero_width(schema: Any, named: dict[str, pa.DataType]) -> bool:
    """Does every value of this Avro type encode in zero bytes (null, empty records, fixed(0))?"""
    if isinstance(schema, str):
        if schema in named:
            return _arrow_zero_width(named[schema])
        return schema == "null"
    if not isinstance(schema, dict):
        return False  # a union writes its branch index
    kind = schema.get("type")
    if kind == "record":
        return all(_zero_width(f.get("type"), named) for f in schema.get("fields") or ())
    if kind == "fixed":
        return str(schema.get("size")) == "0"
    if kind in ("array", "map", "enum"):
        return False
    return _zero_width(kind, named)


def _arrow_zero_width(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return all(_arrow_zero_width(t.field(i).type) for i in range(t.num_fields))
    return bool(pa.types.is_null(t) or (pa.types.is_fixed_size_binary(t) and t.byte_width == 0))


def _avro_nullable(schema: Any) -> bool:
    return (isinstance(schema, list) and "null" in schema) or schema == "null"


def _without_uuid(schema: Any) -> Any:
    """The schema with ``"logicalType": "uuid"`` dropped: the column is a string either way, and
    fastavro would hand back uuid.UUID objects."""
    if isinstance(schema, list):
        return [_without_uuid(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _without_uuid(v) for k, v in schema.items() if k != "fields"}
    if out.get("logicalType") == "uuid":
        del out["logicalType"]
    if "fields" in schema:
        out["fields"] = [{**f, "type": _without_uuid(f["type"])} for f in schema["fields"]]
    return out


def parse_schema_ids(ids: str | Collection[int] | None) -> frozenset[int]:
    """`value.avro.schema.ids` ("1, 7" or integers) as a set; ConfigError naming a bad entry."""
    if ids is None:
        return frozenset()
    items = [s.strip() for s in ids.split(",") if s.strip()] if isinstance(ids, str) else ids
    out: set[int] = set()
    for item in items:
        try:
            n = int(item) if isinstance(item, str) else item
        except ValueError:
            n = -1
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < 2**32:
            raise ConfigError(
                f"value.avro.schema.ids entry {item!r} is not valid; give schema registry ids, "
                "integers from 0 to 4294967295, separated by commas"
            )
        out.add(n)
    return frozenset(out)


class AvroDeserializer:
    """Avro binary values (no container header) of one record schema, read with fastavro.

    `wire_format="confluent"` (the default) expects the Confluent framing (magic byte 0 and a
    4-byte schema id before the Avro bytes) and needs `schema_ids`, the ids it accepts;
    `"plain"` takes bare Avro bytes. There is no guessing: a plain value can also parse as a
    framed one."""

    def __init__(
        self,
        schema_file: str | Path | None = None,
        *,
        schema: str | dict[str, Any] | None = None,
        wire_format: WireFormat = "confluent",
        schema_ids: str | Collection[int] | None = None,
    ) -> None:
        from fastavro import parse_schema

        if (schema_file is None) == (schema is None):
            raise ConfigError("AvroDeserializer needs exactly one of schema_file or schema")
        if schema_file is not None:
            try:
                raw = json.loads(Path(schema_file).read_text())
            except (OSError, ValueError) as e:
                raise ConfigError(f"cannot read the Avro schema file {schema_file}: {e}") from e
        else:
            raw = json.loads(schema) if isinstance(schema, str) else schema
        if not isinstance(raw, dict) or raw.get("type") != "record":
            raise ConfigError("the Avro value schema must be a record schema")
        if wire_format not in WIRE_FORMATS:
            raise ConfigError(
                f"Avro wire format {wire_format!r} is not valid; use confluent or plain "
                "(value.avro.wire.format)"
            )
        ids = parse_schema_ids(schema_ids)
        if wire_format == "confluent" and not ids:
            raise ConfigError(
                "value.avro.wire.format=confluent needs value.avro.schema.ids: the schema "
                "registry ids under which the value schema is registered (values framed with "
                "another id are refused, since their writer schema is unknown); or set "
                "value.avro.wire.format=plain for bare Avro values"
            )
        if wire_format == "plain" and ids:
            raise ConfigError(
                "value.avro.schema.ids applies to value.avro.wire.format=confluent only; "
                "plain Avro values carry no schema id"
            )
        try:
            self._parsed = parse_schema(_without_uuid(raw))
        except Exception as e:
            raise ConfigError(f"the Avro schema is not valid: {e}") from e
        struct_type = avro_to_arrow_type(raw)
        self._schema = pa.schema(list(struct_type))
        self._wire_format = wire_format
        self._schema_ids = ids
        self._raw_schema = raw
        self._required = [f.name for f in self._schema if not f.nullable]

    @property
    def value_schema(self) -> pa.Schema:
        return self._schema

    @property
    def schema_ids(self) -> frozenset[int]:
        return self._schema_ids

    def decode_one(self, value: bytes | None) -> dict[str, Any]:
        """One value as a row of Python values, or BadAvroValue (the rules above)."""
        from fastavro import schemaless_reader

        if value is None:
            if self._required:
                raise BadAvroValue(
                    f"tombstone (null value) for a schema with required column {self._required[0]}"
                )
            return dict.fromkeys(self._schema.names)
        skip = 0
        if self._wire_format == "confluent":
            if len(value) < 5 or value[0] != 0:
                raise BadAvroValue(
                    "value does not start with the Confluent magic byte 0 and a schema id "
                    "(set value.avro.wire.format=plain for bare Avro values)"
                )
            (schema_id,) = struct.unpack(">I", value[1:5])
            if schema_id not in self._schema_ids:
                accepted = ", ".join(map(str, sorted(self._schema_ids)))
                raise BadAvroValue(
                    f"value is framed with schema id {schema_id}, not one of the accepted ids "
                    f"{accepted} (value.avro.schema.ids): its writer schema is unknown"
                )
            skip = 5
        buf = io.BytesIO(value)
        buf.seek(skip)
        try:
            rec = schemaless_reader(buf, self._parsed, None)
        except UnicodeDecodeError as e:
            raise BadAvroValue(
                f"Avro decode failed: a string is not valid UTF-8 ({e.reason})"
            ) from e
        except Exception as e:
            raise BadAvroValue(f"Avro decode failed: {_decode_failure(e, len(value))}") from e
        if buf.tell() != len(value):
            raise BadAvroValue(
                f"Avro decode failed: the record ends at byte {buf.tell()} of a "
                f"{len(value)}-byte value"
            )
        if not isinstance(rec, dict):  # pragma: no cover - a record schema gives a dict
            raise BadAvroValue("Avro decode failed: the value is not a record")
        return rec

    def decode(self, values: Sequence[bytes | None]) -> Decoded:
        failures: dict[int, str] = {}
        rows: list[tuple[int, dict[str, Any]]] = []
        for i, v in enumerate(values):
            try:
                rows.append((i, self.decode_one(v)))
            except BadAvroValue as e:
                failures[i] = str(e)
        pieces = rows_to_table(rows, self._schema, failures, "Avro value does not fit the schema")
        return Decoded(concat_in_order(pieces, self._schema), failures)
