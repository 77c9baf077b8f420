"""Change-stream record values (write.operation=cdc) as rows of versions: `ChangeDeserializer`.

Each value becomes one row of the declared columns (value.schema) plus the change columns of
lakesink.protocol.mutation: the operation (`OPERATION_COLUMN`, int8 `RowOperation.code`), the
columns whose value the source did not send (`UNAVAILABLE_COLUMN`, list<string>, null when
none) and, for a Debezium stream without table.ordering.field, the source position
(`SOURCE_POSITION_COLUMN`), which orders the versions of a key. The decoding of an event is
lakesink.kafka.debezium's (`DebeziumDecoder`, `OperationFieldDecoder`); this module shapes its
result into Arrow columns and sorts the outcomes:

- a change: a row. An insert or update holds the row after the change; a delete holds its key
  columns (and the ordering field, when the source sent one) and nulls elsewhere, since a
  delete's other values are not to be trusted (PostgreSQL's REPLICA IDENTITY DEFAULT sends only
  the key: Debezium fills the rest with its types' zeros);
- a tombstone (a null value, which Debezium sends after each delete): skipped, neither a row
  nor a failure (`Decoded.skipped`);
- anything else, a failure with the reason: a malformed envelope, an unknown operation, a
  change without a key value, a value that does not fit its column.

Columns: fields that are not declared columns are ignored, a declared column missing from the
row is null. Every column but the key columns is nullable in `value_schema` (deletes and
unavailable values leave nulls). Decimals in Debezium's string mode become the declared
decimal; a TIMESTAMP column takes ISO text (Debezium's ZonedTimestamp) or a number whose unit
the envelope's schema names (io.debezium.time.Timestamp, MicroTimestamp, NanoTimestamp, Kafka
Connect's Timestamp); a DATE column ISO text or days since 1970-01-01.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakesink.errors import ConfigError, RecordError
from lakesink.kafka.avro import AvroDeserializer, BadAvroValue, WireFormat, avro_to_arrow_type
from lakesink.kafka.ddl import ddl_to_arrow
from lakesink.kafka.debezium import (
    ChangeEvent,
    DebeziumDecoder,
    OperationFieldDecoder,
    RowValues,
    parse_json_envelope,
)
from lakesink.kafka.decoded import Decoded, Deserializer, concat_in_order, reason, rows_to_table
from lakesink.kafka.json_values import BadValue, convert
from lakesink.protocol.mutation import (
    OPERATION_COLUMN,
    SOURCE_POSITION_COLUMN,
    UNAVAILABLE_COLUMN,
    RowOperation,
)

CdcFormat = Literal["debezium", "field"]

CHANGE_FIELDS: tuple[pa.Field, ...] = (
    pa.field(OPERATION_COLUMN, pa.int8(), nullable=False),
    pa.field(UNAVAILABLE_COLUMN, pa.list_(pa.string())),
)
"""The columns every change row ends with."""
SOURCE_POSITION_FIELD = pa.field(SOURCE_POSITION_COLUMN, pa.string(), nullable=False)

# The units of a number in a TIMESTAMP column, by the name the envelope's schema gives it
_TIMESTAMP_UNITS: dict[str, int] = {  # microseconds per unit, or -1000 for nanoseconds
    "io.debezium.time.Timestamp": 1000,
    "org.apache.kafka.connect.data.Timestamp": 1000,
    "io.debezium.time.MicroTimestamp": 1,
    "io.debezium.time.NanoTimestamp": -1000,
}


def is_avro_schema(schema: str | None) -> bool:
    """Whether value.schema holds Avro schema JSON rather than a DDL (through the registry,
    the envelope schema a run's rows are pinned from)."""
    return schema is not None and schema.lstrip().startswith("{")


def declared_rows(
    value_format: str,
    cdc_format: CdcFormat,
    schema: str | None,
    schema_file: str | None,
) -> pa.Schema:
    """The columns of a change stream's rows as declared: value.schema (a DDL), or for json a
    DDL file (value.schema.file); for avro without value.schema, the columns of the Avro
    schema file's record: for Debezium the record of its `after` (or `before`) field, the
    envelope's row. For avro value.schema may hold the Avro schema JSON itself (as the
    registry's envelope is pinned for a run). ConfigError when there is none or it cannot be
    read."""
    if value_format not in ("json", "avro"):
        raise ConfigError(
            f"write.operation=cdc reads JSON or Avro values, not value.format={value_format}"
        )
    if schema is not None and not (value_format == "avro" and is_avro_schema(schema)):
        return ddl_to_arrow(schema)
    if schema is not None:
        text, what = schema, "value.schema"
    elif schema_file is None:
        raise ConfigError("write.operation=cdc needs value.schema: the columns of the rows")
    else:
        what = f"value.schema.file {schema_file}"
        try:
            text = Path(schema_file).read_text()
        except OSError as e:
            raise ConfigError(f"cannot read value.schema.file {schema_file}: {e.strerror}") from e
    if value_format == "json":
        return ddl_to_arrow(text)
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{what} is not Avro schema JSON: {e}") from e
    rows = envelope_rows(avro_to_arrow_type(raw), cdc_format)
    if rows is None:
        raise ConfigError(
            f"{what} is not a Debezium envelope: it has no 'after' record "
            "(or declare the row's columns in value.schema)"
        )
    return rows


def envelope_rows(record: pa.DataType, cdc_format: CdcFormat) -> pa.Schema | None:
    """The row's columns in the Arrow type of an Avro value record: for Debezium its `after`
    (else `before`) record, for an operation-field stream the record itself; None when it is
    no record, or a Debezium value has neither."""
    if not pa.types.is_struct(record):
        return None
    if cdc_format == "field":
        return pa.schema(list(record))
    for side in ("after", "before"):
        index = record.get_field_index(side)
        if index >= 0 and pa.types.is_struct(record.field(index).type):
            return pa.schema(list(record.field(index).type))
    return None


class AvroEnvelopes(Protocol):
    """Avro change values whose writer schema is looked up per value (registry_changes.py's
    `RegistryEnvelopes`, the schema registry's ids)."""

    def read(self, value: bytes) -> tuple[Mapping[str, Any], Mapping[str, Mapping[str, Any]]]:
        """The decoded record (the envelope, or the flat record) and its row's field schemas
        (as `avro_field_schemas` gives them); RecordError with the reason for a bad value."""
        ...


def check_change_columns(rows: pa.Schema, *, with_source_position: bool) -> None:
    """ConfigError when a declared column takes the name of a column lakesink adds."""
    added = [f.name for f in CHANGE_FIELDS]
    if with_source_position:
        added.append(SOURCE_POSITION_COLUMN)
    clash = sorted(set(added) & set(rows.names))
    if clash:
        raise ConfigError(
            f"value.schema column(s) {', '.join(clash)} take the name of a column lakesink adds "
            "to change rows; rename them"
        )


class ChangeDeserializer:
    """Change-stream values into rows of versions (the rules are in the module doc).

    `rows` are the declared columns; `key_columns` the record key (table.record.key.fields);
    `ordering_field` table.ordering.field (None: a Debezium stream adds the source position);
    `op_field` and `op_values` the operation field of cdc.format=field. `avro` decodes Avro
    values (the envelope, or the flat record) before the change is read, with its fixed
    schema; `envelopes` instead with each value's writer schema (through the schema registry);
    neither: JSON.

    The Kafka record keys are not passed to `decode` (a `Deserializer` gets values only): a
    Debezium event carries its key columns in `after`, or in `before` for a delete, so only a
    delete without `before` is a failure for want of its key (REPLICA IDENTITY NOTHING, under
    which PostgreSQL refuses the deletes of a published table anyway)."""

    def __init__(
        self,
        rows: pa.Schema,
        key_columns: Sequence[str],
        *,
        cdc_format: CdcFormat = "debezium",
        ordering_field: str | None = None,
        op_field: str = "op",
        op_values: Mapping[str, RowOperation] | None = None,
        avro: AvroDeserializer | None = None,
        avro_field_schemas: Mapping[str, Mapping[str, Any]] | None = None,
        envelopes: AvroEnvelopes | None = None,
    ) -> None:
        if not key_columns:
            raise ConfigError("write.operation=cdc needs table.record.key.fields")
        missing = [k for k in (*key_columns, ordering_field) if k and k not in rows.names]
        if missing:
            raise ConfigError(
                f"column(s) {', '.join(missing)} of table.record.key.fields or "
                f"table.ordering.field are not columns of the rows ({', '.join(rows.names)})"
            )
        self._source_position = cdc_format == "debezium" and ordering_field is None
        check_change_columns(rows, with_source_position=self._source_position)
        self._rows = rows
        self._keys = tuple(key_columns)
        self._kept_by_delete = frozenset(k for k in (*key_columns, ordering_field) if k)
        self._avro = avro
        self._envelopes = envelopes
        values = RowValues(rows)
        self._decoder: DebeziumDecoder | OperationFieldDecoder
        if cdc_format == "debezium":
            self._decoder = DebeziumDecoder(self._keys, values)
        else:
            if op_field not in rows.names:
                raise ConfigError(
                    f"cdc.op.field={op_field} is not a column of the rows ({', '.join(rows.names)})"
                )
            if not op_values:
                raise ConfigError("cdc.op.values maps no value to an operation")
            self._decoder = OperationFieldDecoder(op_field, dict(op_values), self._keys, values)
        value_fields = [f if f.name in self._keys else f.with_nullable(True) for f in rows]
        if self._source_position:
            value_fields.append(SOURCE_POSITION_FIELD)
        self._schema = pa.schema([*value_fields, *CHANGE_FIELDS])
        self._field_schemas = dict(avro_field_schemas or {})

    @classmethod
    def configured(
        cls,
        *,
        value_format: str,
        schema: str | None,
        schema_file: str | None,
        key_columns: Sequence[str],
        cdc_format: CdcFormat,
        ordering_field: str | None,
        op_field: str,
        op_values: Mapping[str, RowOperation],
        avro_wire_format: WireFormat = "confluent",
        avro_schema_ids: str | Collection[int] | None = None,
        envelopes: AvroEnvelopes | None = None,
    ) -> ChangeDeserializer:
        """From the configuration's values (value.*, table.record.key.fields, the mutation
        settings). For avro, value.schema.file is the Avro schema of the values (the Debezium
        envelope) and value.schema, when set, overrides the row's columns; with `envelopes`
        (the schema registry's writer schemas) the values' schema is not configured, and the
        row's columns come from value.schema or value.schema.file."""
        rows = declared_rows(value_format, cdc_format, schema, schema_file)
        avro = None
        field_schemas: dict[str, Any] = {}
        if value_format == "avro" and envelopes is None:
            if schema_file is None:
                raise ConfigError("value.format=avro needs value.schema.file (an .avsc file)")
            avro = AvroDeserializer(
                schema_file, wire_format=avro_wire_format, schema_ids=avro_schema_ids
            )
            field_schemas = avro_field_schemas(
                json.loads(Path(schema_file).read_text()), cdc_format
            )
        return cls(
            rows,
            key_columns,
            cdc_format=cdc_format,
            ordering_field=ordering_field,
            op_field=op_field,
            op_values=op_values,
            avro=avro,
            avro_field_schemas=field_schemas,
            envelopes=envelopes,
        )

    @property
    def value_schema(self) -> pa.Schema:
        return self._schema

    @property
    def row_schema(self) -> pa.Schema:
        """The declared columns of the rows, as declared."""
        return self._rows

    def decode(self, values: Sequence[bytes | None]) -> Decoded:
        failures: dict[int, str] = {}
        skipped: set[int] = set()
        rows: list[tuple[int, dict[str, Any]]] = []
        for i, value in enumerate(values):
            try:
                event, field_schemas = self._event(value)
                if event is None:
                    skipped.add(i)
                    continue
                rows.append((i, self._row(event, field_schemas)))
            except RecordError as e:
                failures[i] = reason(e)
            except RecursionError:  # json.loads of a deeply nested value
                failures[i] = "the value is nested too deeply to decode"
        pieces = rows_to_table(rows, self._schema, failures, "the change does not fit the rows")
        return Decoded(concat_in_order(pieces, self._schema), failures, frozenset(skipped))

    def _event(
        self, value: bytes | None
    ) -> tuple[ChangeEvent | None, Mapping[str, Mapping[str, Any]]]:
        """The change of one value (None for a tombstone), and the field schemas of its row
        where the value carries them (the JSON converter's schema, the Avro schema)."""
        if value is None:
            return None, {}
        if self._envelopes is not None:
            record, field_schemas = self._envelopes.read(value)
            if isinstance(self._decoder, DebeziumDecoder):
                return self._decoder.from_avro(record), field_schemas
            return self._decoder.from_record(record), field_schemas
        if self._avro is not None:
            try:
                record = self._avro.decode_one(value)
            except BadAvroValue as e:
                raise RecordError(str(e)) from None
            if isinstance(self._decoder, DebeziumDecoder):
                return self._decoder.from_avro(record), self._field_schemas
            return self._decoder.from_record(record), self._field_schemas
        if isinstance(self._decoder, OperationFieldDecoder):
            return self._decoder.decode_json(value), {}
        envelope, field_schemas = parse_json_envelope(value)
        if envelope is None:
            return None, {}
        return self._decoder.from_envelope(envelope, field_schemas), field_schemas

    def _row(
        self, event: ChangeEvent, field_schemas: Mapping[str, Mapping[str, Any]]
    ) -> dict[str, Any]:
        source = event.row
        delete = event.operation.is_delete
        out: dict[str, Any] = {}
        for f in self._rows:
            value = source.get(f.name)
            if delete and f.name not in self._kept_by_delete:
                value = None
            out[f.name] = _shaped(value, f, field_schemas.get(f.name))
        if self._source_position:
            if event.position is None:
                raise RecordError(
                    "the event's source holds no position (sequence, lsn, ts_ms) to order it "
                    "by; set table.ordering.field"
                )
            out[SOURCE_POSITION_COLUMN] = event.position
        out[OPERATION_COLUMN] = event.operation.code
        unavailable = sorted(n for n in event.unavailable if n in out)
        out[UNAVAILABLE_COLUMN] = unavailable or None
        return out


def _shaped(value: Any, f: pa.Field, field_schema: Mapping[str, Any] | None) -> Any:
    """A value as Arrow takes it for `f`'s type where the JSON form differs (timestamps and
    dates); RecordError naming the column when it cannot be."""
    if value is None:
        return None
    t = f.type
    where = f"column {f.name!r}"
    try:
        if pa.types.is_timestamp(t):
            if isinstance(value, str):
                return convert(value, t, True, where)
            if isinstance(value, int) and not isinstance(value, bool):
                return _timestamp_micros(value, field_schema, where)
        elif pa.types.is_date32(t) and isinstance(value, str):
            return convert(value, t, True, where)
    except BadValue as e:
        raise RecordError(str(e)) from None
    return value


def _timestamp_micros(value: int, field_schema: Mapping[str, Any] | None, where: str) -> int:
    name = (field_schema or {}).get("name")
    unit = _TIMESTAMP_UNITS.get(name) if isinstance(name, str) else None
    if unit is None:
        raise RecordError(
            f"{where}: the number {value} is a timestamp of unknown unit: the envelope's schema "
            "names none (io.debezium.time.MicroTimestamp, ...); enable the converter's "
            "schemas, or declare the column BIGINT"
        )
    if unit > 0:
        return value * unit
    micros, nanos = divmod(value, -unit)
    if nanos:
        raise RecordError(
            f"{where}: {value} ns has nanoseconds a TIMESTAMP (microseconds) cannot hold; "
            "declare the column BIGINT"
        )
    return micros


def avro_field_schemas(schema: Any, cdc_format: CdcFormat) -> dict[str, Any]:
    """The row's field schemas in an Avro value schema (the Debezium envelope's `after`
    record, or the flat record), as the JSON converter's schema gives them: `name`, the Kafka
    Connect type name (e.g. io.debezium.time.MicroTimestamp) that Debezium's Avro converter
    writes as `connect.name`."""
    record: Any = schema
    named: dict[str, Any] = {}
    _collect_named(schema, named)
    if cdc_format == "debezium":
        record = None
        for f in schema.get("fields") or ():
            if f.get("name") in ("after", "before"):
                record = _record_of(f.get("type"), named)
                if record is not None:
                    break
    out: dict[str, Any] = {}
    for f in (record or {}).get("fields") or ():
        connect = _connect_name(f.get("type"))
        if connect is not None:
            out[f["name"]] = {"name": connect}
    return out


def _collect_named(schema: Any, named: dict[str, Any]) -> None:
    if isinstance(schema, list):
        for s in schema:
            _collect_named(s, named)
    elif isinstance(schema, dict):
        if schema.get("type") == "record" and "name" in schema:
            named[schema["name"]] = schema
            if "namespace" in schema:
                named[f"{schema['namespace']}.{schema['name']}"] = schema
        for f in schema.get("fields") or ():
            _collect_named(f.get("type"), named)


def _record_of(t: Any, named: dict[str, Any]) -> dict[str, Any] | None:
    for branch in t if isinstance(t, list) else [t]:
        if isinstance(branch, str) and branch in named:
            return named[branch]  # type: ignore[no-any-return]
        if isinstance(branch, dict) and branch.get("type") == "record":
            return branch
    return None


def _connect_name(t: Any) -> str | None:
    for branch in t if isinstance(t, list) else [t]:
        if isinstance(branch, dict) and isinstance(branch.get("connect.name"), str):
            return str(branch["connect.name"])
    return None


@dataclass(frozen=True, slots=True)
class KeyedValues:
    """The values of `write.operation=upsert`: `inner`'s rows, except that a record whose key
    (the `key_columns` among the value's columns) is null, or empty text in every key column,
    is a failure with its reason (a dead letter under errors.tolerance=all): a row without a
    key has no version to be."""

    inner: Deserializer
    key_columns: tuple[str, ...]

    @property
    def value_schema(self) -> pa.Schema:
        return self.inner.value_schema

    def decode(self, values: Sequence[bytes | None]) -> Decoded:
        return self._checked(self.inner.decode(values), values)

    def decode_keyed(self, values: Sequence[bytes | None], keys: Sequence[bytes | None]) -> Decoded:
        """As decode, handing `inner` the records' keys (key.format: kafka.registry_keys)."""
        from lakesink.kafka.registry_keys import decode_with_keys

        return self._checked(decode_with_keys(self.inner, values, keys), values)

    def _checked(self, decoded: Decoded, values: Sequence[bytes | None]) -> Decoded:
        table = decoded.table
        keys = [k for k in self.key_columns if k in table.column_names]
        if not keys or table.num_rows == 0:
            return decoded
        reasons: list[str | None] = [None] * table.num_rows
        empty_everywhere = np.ones(table.num_rows, dtype=bool)
        for name in keys:
            column = table.column(name)
            nulls = column.is_null().to_numpy(zero_copy_only=False)
            for row in np.flatnonzero(nulls):
                reasons[row] = reasons[row] or f"the record key column {name!r} is null"
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                empty = pc.fill_null(pc.equal(column, ""), False).to_numpy(zero_copy_only=False)
                empty_everywhere &= empty
            else:
                empty_everywhere[:] = False
        for row in np.flatnonzero(empty_everywhere):
            reasons[row] = reasons[row] or "the record key is empty text"
        if not any(reasons):
            return decoded
        # row k of the table is the k-th value that neither failed nor was skipped
        rows = [
            i for i in range(len(values)) if i not in decoded.failures and i not in decoded.skipped
        ]
        failures = dict(decoded.failures)
        failures.update({rows[k]: why for k, why in enumerate(reasons) if why})
        kept = pa.array([why is None for why in reasons])
        return Decoded(table.filter(kept), failures, decoded.skipped)
