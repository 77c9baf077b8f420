"""Deserializers turn a list of Kafka record values into Arrow value columns, in bulk.

A Deserializer has a fixed `value_schema` and a `decode(values)` that returns the good rows as an
Arrow table (in input order) plus the index and reason of every value it could not convert. The
reader pairs the good rows with their Kafka metadata and routes the failures by errors.tolerance.

- JsonDeserializer: one JSON object per value, converted by pyarrow.json with an explicit schema
  (fast path); a batch that fails is bisected to find the bad values. A null value (tombstone)
  gives a row of nulls.
- AvroDeserializer: fastavro schemaless reader; Confluent framing (magic 0 + 4-byte schema id)
  accepted.
- RawDeserializer: the value as one binary column `value`.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import pyarrow as pa

from lakesink.errors import ConfigError
from lakesink.kafka.ddl import ddl_to_arrow

Format = Literal["json", "avro", "raw"]
FORMATS: tuple[Format, ...] = ("json", "avro", "raw")


@dataclass(frozen=True, slots=True)
class Decoded:
    """The result of decoding N values: `table` holds the N - len(failures) good rows in input
    order; `failures` maps the index of each bad value to the reason."""

    table: pa.Table
    failures: dict[int, str] = field(default_factory=dict)


@runtime_checkable
class Deserializer(Protocol):
    """Turns record values into Arrow columns of `value_schema`."""

    @property
    def value_schema(self) -> pa.Schema: ...

    def decode(self, values: Sequence[bytes | None]) -> Decoded: ...


def _empty_table(schema: pa.Schema) -> pa.Table:
    return schema.empty_table()


def _bisect(
    parse: Callable[[Sequence[Any]], pa.Table],
    items: Sequence[Any],
    offset: int,
    failures: dict[int, str],
    out: list[pa.Table],
) -> None:
    """Parse `items`; on failure split in halves until each bad item is isolated."""
    try:
        out.append(parse(items))
        return
    except Exception as e:
        if len(items) == 1:
            failures[offset] = _reason(e)
            return
    mid = len(items) // 2
    _bisect(parse, items[:mid], offset, failures, out)
    _bisect(parse, items[mid:], offset + mid, failures, out)


def _reason(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text if len(text) <= 500 else text[:497] + "..."


def _decode_with_bisect(
    parse: Callable[[Sequence[Any]], pa.Table],
    schema: pa.Schema,
    items: Sequence[Any],
    failures: dict[int, str],
) -> Decoded:
    """Parse the items that did not fail already; `items[i] is None` marks a pre-failed item."""
    tables: list[pa.Table] = []
    # parse runs of items that were not rejected up front
    start = 0
    n = len(items)
    while start < n:
        while start < n and start in failures:
            start += 1
        end = start
        while end < n and end not in failures:
            end += 1
        if end > start:
            _bisect(parse, items[start:end], start, failures, tables)
        start = end
    if not tables:
        return Decoded(_empty_table(schema), failures)
    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    return Decoded(table, failures)


class JsonDeserializer:
    """JSON objects → columns of `schema` (a Spark DDL string or an Arrow schema).

    Fields not in the schema are ignored; missing fields are null. TIMESTAMP accepts ISO-8601
    strings (with `Z` or an offset; no offset means UTC); DATE accepts `YYYY-MM-DD`; DECIMAL
    accepts numbers or strings that fit its scale."""

    def __init__(self, schema: pa.Schema | str) -> None:
        self._schema = ddl_to_arrow(schema) if isinstance(schema, str) else schema
        if len(self._schema) == 0:
            raise ConfigError("a JSON value schema needs at least one column")
        self._date_columns = [i for i, f in enumerate(self._schema) if pa.types.is_date32(f.type)]
        read_fields = [
            pa.field(f.name, pa.string(), f.nullable) if i in self._date_columns else f
            for i, f in enumerate(self._schema)
        ]
        self._read_schema = pa.schema(read_fields)
        self._python_path = any(_needs_python(f.type, top=True) for f in self._schema)

    @property
    def value_schema(self) -> pa.Schema:
        return self._schema

    def decode(self, values: Sequence[bytes | None]) -> Decoded:
        parse = self._parse_python if self._python_path else self._parse_arrow
        if values and not self._python_path and None not in values:
            # fast path: every value starts a line with `{` and holds no `\n{`; anything odd
            # (a bad value, a line break inside a value) fails here and takes the path below
            data = b"\n".join(values)  # type: ignore[arg-type]
            if data[:1] == b"{" and data.count(b"\n{") == len(values) - 1:
                try:
                    longest = max(map(len, values))  # type: ignore[arg-type]
                    return Decoded(self._read_arrow(data, len(values), longest))
                except Exception:
                    pass
        failures: dict[int, str] = {}
        lines: list[bytes] = []
        append = lines.append
        for i, v in enumerate(values):
            if v is None:
                append(b"{}")
                continue
            if v[:1] != b"{":
                stripped = v.lstrip()
                if stripped[:1] != b"{":
                    failures[i] = "value is empty" if not stripped else "value is not a JSON object"
                    append(b"{}")
                    continue
            if b"\n" in v or b"\r" in v:
                # raw newlines are only valid between tokens; pyarrow.json reads one object a line
                v = v.replace(b"\n", b" ").replace(b"\r", b" ")
            append(v)
        return _decode_with_bisect(parse, self._schema, lines, failures)

    def _parse_arrow(self, lines: Sequence[bytes]) -> pa.Table:
        return self._read_arrow(b"\n".join(lines), len(lines), max(map(len, lines)))

    def _read_arrow(self, data: bytes, n: int, longest: int) -> pa.Table:
        import pyarrow.compute as pc
        import pyarrow.json as pj

        table = pj.read_json(
            io.BytesIO(data),
            read_options=pj.ReadOptions(
                use_threads=False, block_size=max(1 << 20, 2 * longest + 2)
            ),
            parse_options=pj.ParseOptions(
                explicit_schema=self._read_schema, unexpected_field_behavior="ignore"
            ),
        )
        if table.num_rows != n:
            raise ValueError(
                f"found {table.num_rows} JSON objects in {n} values "
                "(more than one object in a value?)"
            )
        for i in self._date_columns:
            table = table.set_column(
                i, self._schema.field(i), pc.cast(table.column(i), pa.date32())
            )
        if table.schema.equals(self._schema):
            return table
        return table.select(range(len(self._schema))).cast(self._schema)

    def _parse_python(self, lines: Sequence[bytes]) -> pa.Table:
        rows = []
        for line in lines:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("value is not a JSON object")
            rows.append({f.name: _py_value(obj.get(f.name), f.type) for f in self._schema})
        return pa.Table.from_pylist(rows, schema=self._schema)


def _needs_python(t: pa.DataType, *, top: bool) -> bool:
    """pyarrow.json cannot convert maps, nor dates below the top level."""
    if pa.types.is_map(t):
        return True
    if pa.types.is_date32(t):
        return not top
    if pa.types.is_struct(t):
        return any(_needs_python(f.type, top=False) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _needs_python(t.value_type, top=False)
    return False


def _py_value(v: Any, t: pa.DataType) -> Any:
    """A JSON-decoded value shaped for pa.array(type=t) (the Python path, used for maps)."""
    from datetime import UTC, date, datetime
    from decimal import Decimal

    if v is None:
        return None
    if pa.types.is_timestamp(t):
        if not isinstance(v, str):
            raise ValueError(f"expected an ISO-8601 timestamp string, got {v!r}")
        ts = datetime.fromisoformat(v.replace("Z", "+00:00"))
        if t.tz is not None:
            return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)
        return ts.replace(tzinfo=None)
    if pa.types.is_date32(t):
        if not isinstance(v, str):
            raise ValueError(f"expected a date string YYYY-MM-DD, got {v!r}")
        return date.fromisoformat(v)
    if pa.types.is_decimal(t):
        return Decimal(str(v))
    if pa.types.is_map(t):
        if not isinstance(v, dict):
            raise ValueError(f"expected a JSON object for a map, got {v!r}")
        return [(_py_value(k, t.key_type), _py_value(x, t.item_type)) for k, x in v.items()]
    if pa.types.is_struct(t):
        if not isinstance(v, dict):
            raise ValueError(f"expected a JSON object for a struct, got {v!r}")
        return {f.name: _py_value(v.get(f.name), f.type) for f in t}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        if not isinstance(v, list):
            raise ValueError(f"expected a JSON array, got {v!r}")
        return [_py_value(x, t.value_type) for x in v]
    if pa.types.is_binary(t) and isinstance(v, str):
        return v.encode()
    if pa.types.is_string(t) and not isinstance(v, str):
        raise ValueError(f"expected a string, got {v!r}")
    return v


class RawDeserializer:
    """The value bytes as one nullable binary column `value`."""

    SCHEMA = pa.schema([pa.field("value", pa.binary())])

    @property
    def value_schema(self) -> pa.Schema:
        return self.SCHEMA

    def decode(self, values: Sequence[bytes | None]) -> Decoded:
        return Decoded(pa.table([pa.array(values, pa.binary())], schema=self.SCHEMA))


# --- Avro ---------------------------------------------------------------------------------------

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


class AvroDeserializer:
    """Avro binary values (no container header) of one record schema, read with fastavro.

    `wire_format="confluent"` (the default) expects the Confluent framing (magic byte 0 and a
    4-byte schema id before the Avro bytes), `"plain"` bare Avro bytes; the value must decode to
    exactly its length. There is no guessing: a plain value can also parse as a framed one."""

    def __init__(
        self,
        schema_file: str | Path | None = None,
        *,
        schema: str | dict[str, Any] | None = None,
        wire_format: WireFormat = "confluent",
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
        try:
            self._parsed = parse_schema(raw)
        except Exception as e:
            raise ConfigError(f"the Avro schema is not valid: {e}") from e
        struct = avro_to_arrow_type(raw)
        self._schema = pa.schema(list(struct))
        self._wire_format = wire_format
        self._raw_schema = raw

    @property
    def value_schema(self) -> pa.Schema:
        return self._schema

    def _read(self, value: bytes) -> Any:
        from fastavro import schemaless_reader

        def attempt(skip: int) -> Any:
            buf = io.BytesIO(value)
            buf.seek(skip)
            rec = schemaless_reader(buf, self._parsed, None)
            if buf.tell() != len(value):
                raise ValueError(
                    f"Avro record ends at byte {buf.tell()} of a {len(value)}-byte value"
                )
            return rec

        if self._wire_format == "plain":
            return attempt(0)
        if len(value) < 5 or value[0] != 0:
            raise ValueError(
                "value does not start with the Confluent magic byte 0 and a schema id "
                "(set value.avro.wire.format=plain for bare Avro values)"
            )
        return attempt(5)

    def decode(self, values: Sequence[bytes | None]) -> Decoded:
        failures: dict[int, str] = {}
        rows: list[Any] = []
        names = self._schema.names
        empty = dict.fromkeys(names)
        for i, v in enumerate(values):
            if v is None:
                rows.append(empty)
                continue
            try:
                rows.append(self._read(v))
            except Exception as e:
                failures[i] = f"Avro decode failed: {_reason(e)}"
                rows.append(None)

        def parse(items: Sequence[Any]) -> pa.Table:
            return pa.Table.from_pylist(list(items), schema=self._schema)

        return _decode_with_bisect(parse, self._schema, rows, failures)


def make_deserializer(
    format: str,
    schema: str | None = None,
    schema_file: str | None = None,
    *,
    avro_wire_format: WireFormat = "confluent",
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
            return AvroDeserializer(schema_file, wire_format=avro_wire_format)
        return AvroDeserializer(schema=schema, wire_format=avro_wire_format)
    if schema_file is not None:
        try:
            schema = Path(schema_file).read_text()
        except OSError as e:
            raise ConfigError(f"cannot read the JSON value schema file {schema_file}: {e}") from e
    assert schema is not None
    return JsonDeserializer(schema)
