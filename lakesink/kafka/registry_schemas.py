"""The columns a registered writer schema carries, as Arrow, and the subject's registered
versions: what lets the registry drive the table's columns (schema evolution and table creation,
which spark/registry_columns.py decides with the engine's `evolve`).

A writer schema maps to Arrow by format:

- Avro: the record's fields as avro.py maps them (the columns `value.schema` would declare); a
  field with a `default` is listed in `defaults` (evolve adds it as optional);
- JSON Schema: an object's `properties` (`integer` long, `number` double, `string`, `boolean`,
  `object` a struct, `array` a list); a property is required only when listed in `required` and
  not typed `null`;
- Protobuf: the fields of the file's first message (the topic name strategy's one message per
  subject; a value framed with another message index decodes, its fields checked one by one);
  int32/sint32/sfixed32 int, 64-bit and uint32 long, uint64 as long, float, double, bool, string,
  bytes, enums as string, messages as structs, repeated as lists, maps as maps; every field
  optional (proto3 has no required field).

`uncovered(columns, writer)` is the first field path of a writer schema that `columns` cannot
hold as is (absent, or of a type wider than the column's or unlike it): a value of that writer
schema needs the table's schema to evolve first.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lakesink.errors import ConfigError
from lakesink.kafka.avro import avro_to_arrow_type
from lakesink.kafka.registry import RegistryFormat, RegistrySettings, _fetch, _file_descriptor

__all__ = ["WriterColumns", "subject_for", "subject_versions", "uncovered", "writer_columns"]


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
    from lakesink.kafka.registry import UnknownSchemaId

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
            return _json_columns(json.loads(schema.schema_str))
        return _proto_columns(settings, schema)
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"the registered {fmt} schema has no column mapping: {e}") from e


def _avro_columns(raw: Any) -> WriterColumns:
    if not isinstance(raw, dict) or raw.get("type") != "record":
        raise ConfigError("the registered Avro schema is not a record")
    struct = avro_to_arrow_type(raw)
    defaults: set[str] = set()
    _avro_defaults(raw, "", defaults)
    return WriterColumns(pa.schema(list(struct)), frozenset(defaults))


def _avro_defaults(record: dict[str, Any], parent: str, out: set[str]) -> None:
    for f in record.get("fields", ()):
        path = f"{parent}.{f['name']}" if parent else f["name"]
        if "default" in f:
            out.add(path)
        branches = f["type"] if isinstance(f["type"], list) else [f["type"]]
        for b in branches:
            if isinstance(b, dict) and b.get("type") == "record":
                _avro_defaults(b, path, out)


_JSON_TYPES = {
    "integer": pa.int64(),
    "number": pa.float64(),
    "string": pa.string(),
    "boolean": pa.bool_(),
}


def _json_columns(raw: Any) -> WriterColumns:
    if not isinstance(raw, dict):
        raise ConfigError("the registered JSON Schema is not an object")
    return WriterColumns(pa.schema(list(_json_struct(raw, "the value"))))


def _json_struct(obj: dict[str, Any], where: str) -> pa.StructType:
    required = set(obj.get("required") or ())
    fields = []
    for name, prop in (obj.get("properties") or {}).items():
        t, nullable = _json_type(prop, f"{where}.{name}")
        fields.append(pa.field(name, t, nullable=nullable or name not in required))
    return pa.struct(fields)


def _json_type(prop: Any, where: str) -> tuple[pa.DataType, bool]:
    if not isinstance(prop, dict):
        raise ConfigError(f"{where}: a JSON Schema property must be an object")
    kinds = prop.get("type")
    names = [kinds] if isinstance(kinds, str) else list(kinds or ())
    nullable = "null" in names
    rest = [k for k in names if k != "null"]
    if len(rest) != 1:
        raise ConfigError(f"{where}: JSON Schema type {kinds!r} does not map to one column type")
    kind = rest[0]
    if kind in _JSON_TYPES:
        return _JSON_TYPES[kind], nullable
    if kind == "object":
        return _json_struct(prop, where), nullable
    if kind == "array":
        item, _ = _json_type(prop.get("items"), f"{where}[]")
        return pa.list_(item), nullable
    raise ConfigError(f"{where}: JSON Schema type {kind!r} has no column type")


# FieldDescriptor.TYPE_* numbers (descriptor.proto)
_PROTO_TYPES = {
    1: pa.float64(),  # double
    2: pa.float32(),  # float
    3: pa.int64(),  # int64
    4: pa.int64(),  # uint64
    5: pa.int32(),  # int32
    6: pa.int64(),  # fixed64
    7: pa.int32(),  # fixed32
    8: pa.bool_(),
    9: pa.string(),
    12: pa.binary(),
    13: pa.int64(),  # uint32
    14: pa.string(),  # enum: by name
    15: pa.int32(),  # sfixed32
    16: pa.int64(),  # sfixed64
    17: pa.int32(),  # sint32
    18: pa.int64(),  # sint64
}


def _proto_columns(settings: RegistrySettings, schema: Any) -> WriterColumns:
    from lakesink.kafka.registry import _ProtobufWriter

    _file_descriptor(schema.schema_str)  # the same clear error for .proto text
    message = _ProtobufWriter(settings, schema).message_class((0,)).DESCRIPTOR
    return WriterColumns(pa.schema(list(_proto_struct(message))))


def _proto_struct(message: Any) -> pa.StructType:
    from lakesink.kafka.registry import _repeated

    fields = []
    for f in message.fields:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key = f.message_type.fields_by_name["key"]
            value = f.message_type.fields_by_name["value"]
            t: pa.DataType = pa.map_(_proto_type(key), _proto_type(value))
        elif _repeated(f):
            t = pa.list_(_proto_type(f))
        else:
            t = _proto_type(f)
        fields.append(pa.field(f.name, t))
    return pa.struct(fields)


def _proto_type(field: Any) -> pa.DataType:
    if field.message_type is not None:
        return _proto_struct(field.message_type)
    if field.type not in _PROTO_TYPES:
        raise ConfigError(f"Protobuf field {field.full_name} has no column type")
    return _PROTO_TYPES[field.type]


# -- does a writer schema fit the columns as they are? ------------------------------------------

_NARROWER = {
    pa.int64(): (pa.int8(), pa.int16(), pa.int32()),
    pa.int32(): (pa.int8(), pa.int16()),
    pa.int16(): (pa.int8(),),
    pa.float64(): (pa.float32(),),
}


def uncovered(columns: Sequence[pa.Field], writer: Sequence[pa.Field], parent: str = "") -> str | None:
    """The first path of `writer` that `columns` cannot hold as is: a field they lack, or a type
    neither equal to the column's nor narrower (a value of it would need the table to evolve
    or fail); None when every field fits."""
    by_name = {c.name: c for c in columns}
    for w in writer:
        path = f"{parent}.{w.name}" if parent else w.name
        c = by_name.get(w.name)
        if c is None:
            return path
        found = _uncovered_type(c.type, w.type, path)
        if found is not None:
            return found
    return None


def _uncovered_type(column: pa.DataType, writer: pa.DataType, path: str) -> str | None:
    if pa.types.is_struct(column) and pa.types.is_struct(writer):
        return uncovered(list(column), list(writer), path)
    if pa.types.is_map(column) and pa.types.is_map(writer):
        return _uncovered_type(column.item_type, writer.item_type, f"{path}.value")
    if pa.types.is_list(column) and pa.types.is_list(writer):
        return _uncovered_type(column.value_type, writer.value_type, f"{path}.element")
    if column == writer or writer in _NARROWER.get(column, ()):
        return None
    return path
