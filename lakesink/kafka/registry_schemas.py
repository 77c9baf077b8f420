"""The columns a registered writer schema carries, as Arrow (pure: no registry call), which
let the registry drive the table's columns (registry_subjects.py fetches the versions,
spark/registry_columns.py evolves a run's columns with the engine's `evolve`).

A writer schema maps to Arrow by format:

- Avro: the record's fields as avro.py maps them (the columns `value.schema` would declare); a
  field with a `default` is listed in `defaults` (evolve adds it as optional);
- JSON Schema: an object's `properties` (`integer` long, `number` double, `string`, `boolean`,
  `object` a struct, `array` a list); a property is required only when listed in `required` and
  not typed `null`;
- Protobuf: the fields of the file's message the record name names, or under the topic name
  strategy of its one top-level message no other message uses (several: a ConfigError; a
  value framed with another message index decodes, its fields checked one by one);
  int32/sint32/sfixed32 int, 64-bit and uint32 long, uint64 as long, float, double, bool, string,
  bytes, enums as string, messages as structs, repeated as lists, maps as maps; every field
  optional (proto3 has no required field).

`uncovered(columns, writer)` is the first field path of a writer schema that `columns` cannot
hold as is (absent, or of a type wider than the column's or unlike it): a value of that writer
schema needs the table's schema to evolve first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from lakesink.errors import ConfigError

__all__ = ["avro_defaults", "json_schema_columns", "proto_message_struct", "uncovered"]


def avro_defaults(record: dict[str, Any], parent: str, out: set[str]) -> None:
    """The dotted paths of a (parsed) Avro record's fields that have a default, into `out`."""
    for f in record.get("fields", ()):
        path = f"{parent}.{f['name']}" if parent else f["name"]
        if "default" in f:
            out.add(path)
        branches = f["type"] if isinstance(f["type"], list) else [f["type"]]
        for b in branches:
            if isinstance(b, dict) and b.get("type") == "record":
                avro_defaults(b, path, out)


_JSON_TYPES = {
    "integer": pa.int64(),
    "number": pa.float64(),
    "string": pa.string(),
    "boolean": pa.bool_(),
}


def json_schema_columns(raw: Any, *, lenient: bool = False) -> pa.Schema:
    """The columns of a (parsed) JSON Schema of an object. `lenient`: a property of no one
    column type (`{}`, a type list) is typed null (any column of its name holds it) rather
    than a ConfigError; what a decoder checks values against, not what a table evolves by."""
    if not isinstance(raw, dict):
        raise ConfigError("the registered JSON Schema is not an object")
    return pa.schema(list(_json_struct(raw, "the value", lenient)))


def _json_struct(obj: dict[str, Any], where: str, lenient: bool) -> pa.StructType:
    required = set(obj.get("required") or ())
    fields = []
    for name, prop in (obj.get("properties") or {}).items():
        try:
            t, nullable = _json_type(prop, f"{where}.{name}", lenient)
        except ConfigError:
            if not lenient:
                raise
            t, nullable = pa.null(), True
        fields.append(pa.field(name, t, nullable=nullable or name not in required))
    return pa.struct(fields)


def _json_type(prop: Any, where: str, lenient: bool) -> tuple[pa.DataType, bool]:
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
        return _json_struct(prop, where, lenient), nullable
    if kind == "array":
        item, _ = _json_type(prop.get("items"), f"{where}[]", lenient)
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


def proto_message_struct(message: Any) -> pa.StructType:
    """The struct of a Protobuf message descriptor's fields."""
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


def _repeated(field: Any) -> bool:
    # protobuf 7 has only is_repeated; older releases only label (3: LABEL_REPEATED)
    flag = getattr(field, "is_repeated", None)
    return bool(flag) if flag is not None else field.label == 3


def _proto_type(field: Any) -> pa.DataType:
    if field.message_type is not None:
        return proto_message_struct(field.message_type)
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


def uncovered(
    columns: Sequence[pa.Field], writer: Sequence[pa.Field], parent: str = ""
) -> str | None:
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
    if column == writer or writer == pa.null() or writer in _NARROWER.get(column, ()):
        return None
    return path
