"""Arrow schema → the Avro schema JSON Hudi stores in commit metadata (`extraMetadata.schema`).

hudi-rs coerces values to this schema when reading, so it must describe the Parquet columns
exactly. Timestamps map to `timestamp-micros`/`timestamp-millis` (UTC) — never the
`local-timestamp-*` types, which make hudi-rs panic.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from lakesink.errors import SchemaMismatchError

META_COLUMNS: tuple[str, ...] = (
    "_hoodie_commit_time",
    "_hoodie_commit_seqno",
    "_hoodie_record_key",
    "_hoodie_partition_path",
    "_hoodie_file_name",
)

META_SCHEMA = pa.schema([pa.field(name, pa.string(), nullable=True) for name in META_COLUMNS])


def _avro_name(text: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in text)
    return out if out and not out[0].isdigit() else f"_{out}"


def _avro_type(t: pa.DataType, path: str) -> Any:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytes"
    if pa.types.is_fixed_size_binary(t):
        return {"type": "fixed", "name": _avro_name(path), "size": t.byte_width}
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t):
        return "int"
    if pa.types.is_uint8(t) or pa.types.is_uint16(t):
        return "int"
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return "long"
    if pa.types.is_float32(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_date32(t):
        return {"type": "int", "logicalType": "date"}
    if pa.types.is_timestamp(t):
        unit = t.unit
        if unit == "ms":
            return {"type": "long", "logicalType": "timestamp-millis"}
        if unit == "us":
            return {"type": "long", "logicalType": "timestamp-micros"}
        raise SchemaMismatchError(
            f"column {path!r} has type {t}; Hudi tables take timestamps in 'ms' or 'us' "
            "(cast the column to timestamp('us', tz='UTC'))"
        )
    if pa.types.is_decimal(t):
        return {
            "type": "bytes",
            "logicalType": "decimal",
            "precision": t.precision,
            "scale": t.scale,
        }
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return {"type": "array", "items": _nullable(t.value_field, f"{path}_item")}
    if pa.types.is_map(t):
        if not pa.types.is_string(t.key_type):
            raise SchemaMismatchError(
                f"column {path!r}: Avro maps need string keys, found {t.key_type}"
            )
        return {"type": "map", "values": _nullable(t.item_field, f"{path}_value")}
    if pa.types.is_struct(t):
        return {
            "type": "record",
            "name": _avro_name(path),
            "fields": [
                _field(t.field(i), f"{path}_{t.field(i).name}") for i in range(t.num_fields)
            ],
        }
    raise SchemaMismatchError(
        f"column {path!r} has Arrow type {t}, which lakesink cannot store in a Hudi table; "
        "use strings, numbers, booleans, dates, timestamps (ms/us), decimals, lists, maps "
        "or structs"
    )


def _nullable(f: pa.Field, path: str) -> Any:
    t = _avro_type(f.type, path)
    return ["null", t] if f.nullable else t


def _field(f: pa.Field, path: str) -> dict[str, Any]:
    d: dict[str, Any] = {"name": f.name, "type": _nullable(f, path)}
    if f.nullable:
        d["default"] = None
    return d


def avro_schema_dict(
    arrow_schema: pa.Schema, record_name: str, namespace: str | None = None
) -> dict[str, Any]:
    name = _avro_name(record_name)
    out: dict[str, Any] = {
        "type": "record",
        "name": name,
        "namespace": namespace or f"hoodie.{name}",
        "fields": [_field(f, f"{name}_{f.name}") for f in arrow_schema],
    }
    return out


def avro_schema_for(arrow_schema: pa.Schema, record_name: str) -> str:
    """The Avro schema JSON (record `record_name`, namespace `hoodie.<record_name>`) that
    describes rows of `arrow_schema`; SchemaMismatchError naming a column of a type that
    cannot be stored."""
    return json.dumps(avro_schema_dict(arrow_schema, record_name), separators=(",", ":"))


def with_meta_columns(data_schema: pa.Schema) -> pa.Schema:
    """The five `_hoodie_*` string columns followed by the data columns."""
    return pa.schema(list(META_SCHEMA) + [f for f in data_schema if f.name not in META_COLUMNS])


def data_fields(avro_schema_json: str) -> list[tuple[str, Any]]:
    """(name, Avro type) of the non-meta fields of a stored schema."""
    d = json.loads(avro_schema_json)
    return [(f["name"], f["type"]) for f in d.get("fields", []) if f["name"] not in META_COLUMNS]


def _strip_names(t: Any) -> Any:
    if isinstance(t, dict):
        return {
            k: _strip_names(v)
            for k, v in t.items()
            if k not in ("name", "namespace", "doc", "default")
        }
    if isinstance(t, list):
        rest = [x for x in t if x != "null"]
        if len(rest) == 1:  # nullability is not part of the comparison
            return _strip_names(rest[0])
        return [_strip_names(x) for x in t]
    return t


def check_matches(expected_avro: str, arrow_schema: pa.Schema, record_name: str, what: str) -> None:
    """SchemaMismatchError naming the first column whose type differs from the table's."""
    expected = data_fields(expected_avro)
    found = data_fields(
        avro_schema_for(
            pa.schema([f for f in arrow_schema if f.name not in META_COLUMNS]), record_name
        )
    )
    exp_names = [n for n, _ in expected]
    found_names = [n for n, _ in found]
    for name in exp_names:
        if name not in found_names:
            raise SchemaMismatchError(f"{what}: column {name!r} of the table schema is missing")
    for name in found_names:
        if name not in exp_names:
            raise SchemaMismatchError(
                f"{what}: column {name!r} is not in the table schema "
                f"(columns are {', '.join(exp_names)})"
            )
    exp_types = dict(expected)
    for name, typ in found:
        if _strip_names(typ) != _strip_names(exp_types[name]):
            raise SchemaMismatchError(
                f"{what}: column {name!r} has type {json.dumps(_strip_names(typ))}, "
                f"the table expects {json.dumps(_strip_names(exp_types[name]))}"
            )
    if found_names != exp_names:
        raise SchemaMismatchError(
            f"{what}: columns are in order {', '.join(found_names)}; the table expects "
            f"{', '.join(exp_names)}"
        )


def arrow_schema_of(avro_schema_json: str) -> pa.Schema:
    """The Arrow schema of the data fields of a stored Avro schema (the inverse of
    `avro_schema_for` for the types it writes): what a writer evolves the table's schema from."""
    return pa.schema([_arrow_field(name, t) for name, t in data_fields(avro_schema_json)])


def _arrow_field(name: str, t: Any) -> pa.Field:
    if isinstance(t, list):
        rest = [x for x in t if x != "null"]
        if len(rest) != 1:
            raise SchemaMismatchError(
                f"field {name!r} of the table schema is a union of {json.dumps(t)}; lakesink "
                "reads unions of one type with null only"
            )
        return pa.field(name, _arrow_type(rest[0], name), nullable=len(rest) < len(t))
    return pa.field(name, _arrow_type(t, name), nullable=False)


_PRIMITIVES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "bytes": pa.binary(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
}


def _arrow_type(t: Any, name: str) -> pa.DataType:
    if isinstance(t, str) and t in _PRIMITIVES:
        return _PRIMITIVES[t]
    if isinstance(t, dict):
        logical, kind = t.get("logicalType"), t.get("type")
        if logical == "date":
            return pa.date32()
        if logical in ("timestamp-millis", "timestamp-micros"):
            return pa.timestamp("ms" if logical == "timestamp-millis" else "us", tz="UTC")
        if logical == "decimal":
            return pa.decimal128(int(t["precision"]), int(t.get("scale", 0)))
        if kind == "fixed":
            return pa.binary(int(t["size"]))
        if kind == "array":
            return pa.list_(_arrow_field("item", t["items"]))
        if kind == "map":
            return pa.map_(pa.string(), _arrow_field("value", t["values"]))
        if kind == "record":
            return pa.struct([_arrow_field(f["name"], f["type"]) for f in t["fields"]])
        if isinstance(kind, str) and kind in _PRIMITIVES:
            return _PRIMITIVES[kind]
    raise SchemaMismatchError(
        f"field {name!r} of the table schema has Avro type {json.dumps(t)}, which lakesink does "
        "not write"
    )
