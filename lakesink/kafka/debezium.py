"""Debezium change events, and records with an operation field, as `RowChange`s.

One mapping for every encoding: a JSON value is parsed and unwrapped (with or without the
converter's `schema`/`payload` wrapper, `schemas.enable`), an Avro value arrives as the dict that
lakesink's Avro decoder returns; both reach `DebeziumDecoder.from_envelope`.

The rules (Debezium's event shape: `before`, `after`, `source`, `op`, `ts_ms`):

- `op` `c` (create) and `r` (snapshot read) are inserts, `u` an update, all with the row `after`;
  `d` is a delete with the row `before` (with REPLICA IDENTITY DEFAULT only the key columns hold
  values; with NOTHING `before` is null and the Kafka key gives the key). `t` (truncate), `m`
  (message) and anything else are failures with a reason, never dropped in silence.
- A tombstone (a null value, which Debezium sends after each delete for log compaction) is
  recognised and yields nothing (`None`); it is not a failure. A primary-key change arrives as a
  delete of the old key, a tombstone and a create of the new key: each is decoded on its own.
- The key: the values of `key_columns` in the row, else in the Kafka key (JSON, wrapped or not).
  A key column without a value is a failure.
- Ordering: by default the source position (`source_position`), a text whose string order is the
  order of the changes within one connector; or the value at a dotted path of the envelope
  (`ordering_path`, e.g. `source.ts_ms` or `after.updated_at`); a null value orders lowest.
- Unavailable values: a column whose value is the placeholder (`unavailable.value.placeholder`,
  by default `__debezium_unavailable_value`) is unavailable: its value becomes None and its name
  joins `unavailable`, so that a merge keeps the stored value. Recognised forms: the text (text,
  varchar, json and jsonb columns), its bytes or their base64 text (bytea in a JSON envelope),
  a one-element array of the text (text[]) and an array of the placeholder's byte values
  (int[] and bigint[]).
- Decimals: with `decimal.handling.mode=string` a decimal column holds a string; it becomes a
  `Decimal` when the column's type (`columns`) is a decimal, and must fit its precision and scale.
  The precise mode (`org.apache.kafka.connect.data.Decimal`: base64 of the unscaled big-endian
  two's-complement integer, the scale in the field schema's parameters) is read when the envelope
  carries its schema; an Avro decimal is a `Decimal` already. A JSON string for a binary column is
  base64 (Kafka Connect's JSON form of bytes).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation, localcontext
from typing import Any

import pyarrow as pa

from lakesink.errors import RecordError
from lakesink.kafka.decoded import reason
from lakesink.protocol.mutation import Ordering, RowChange, RowOperation

PLACEHOLDER = "__debezium_unavailable_value"
"""Debezium's default `unavailable.value.placeholder`."""

_CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_OPERATIONS = {
    "c": RowOperation.INSERT,
    "r": RowOperation.INSERT,
    "u": RowOperation.UPDATE,
    "d": RowOperation.DELETE,
}
_REFUSED_OPERATIONS = {
    "t": "a truncate event (op 't') cannot be applied row by row; "
    "exclude truncates from the connector (skipped.operations=t)",
    "m": "a logical decoding message (op 'm') is not a row change",
}


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """A decoded change event: the row change, and where the source wrote it (`position`, the
    source position text; None for streams without one) and which connector (`connector`)."""

    change: RowChange
    position: str | None = None
    connector: str | None = None

    @property
    def operation(self) -> RowOperation:
        return self.change.operation

    @property
    def key(self) -> tuple[tuple[str, Any], ...]:
        return self.change.key

    @property
    def row(self) -> Mapping[str, Any]:
        return self.change.row

    @property
    def ordering(self) -> Ordering | None:
        return self.change.ordering

    @property
    def unavailable(self) -> frozenset[str]:
        return self.change.unavailable


@dataclass(frozen=True, slots=True)
class DecodedChanges:
    """The result of decoding N values: the events with their index, the indexes of the
    tombstones (nothing to write, not failures), and the reason of each failure by index."""

    events: list[tuple[int, ChangeEvent]] = field(default_factory=list)
    tombstones: list[int] = field(default_factory=list)
    failures: dict[int, str] = field(default_factory=dict)


def _hex64(value: int, what: str) -> str:
    if not 0 <= value < 1 << 64:
        raise RecordError(f"{what} {value} is not an unsigned 64-bit position")
    return f"{value:016x}"


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or value is None:
        raise RecordError(f"{what} {value!r} is not a number")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise RecordError(f"{what} {value!r} is not a number")


def source_position(source: Mapping[str, Any]) -> str | None:
    """The position of a change in its source, as text whose string order is the order of
    the changes within one connector (each number as 16 hex digits):

    - postgresql: `source.sequence`, `["<last committed lsn>", "<lsn>"]` (a null first element
      is 0), as `<last committed lsn><lsn>`. Transactions are streamed in commit order and each
      event carries the commit LSN of the transaction before it, so the first part orders
      transactions by commit, the second the changes inside one. Without `sequence` (before
      Debezium 1.2): `0` and `source.lsn`.
    - mysql, mariadb: the binlog file's number (`mysql-bin.000003` is 3), `pos`, `row`.
    - sqlserver: `commit_lsn` then `change_lsn` (fixed-width hex text already).
    - any other connector: `source.ts_ms` only (milliseconds; ties go to the later Kafka offset).

    None when the source holds no position at all."""
    connector = source.get("connector")
    if connector == "postgresql":
        sequence = source.get("sequence")
        if sequence is not None:
            try:
                parts = json.loads(sequence) if isinstance(sequence, str) else sequence
            except ValueError:
                raise RecordError(f"source.sequence {sequence!r} is not a JSON array") from None
            if not isinstance(parts, list) or len(parts) != 2 or parts[1] is None:
                raise RecordError(f"source.sequence {sequence!r} is not [last committed lsn, lsn]")
            committed = 0 if parts[0] is None else _as_int(parts[0], "source.sequence lsn")
            current = _as_int(parts[1], "source.sequence lsn")
            return _hex64(committed, "lsn") + _hex64(current, "lsn")
        if source.get("lsn") is not None:
            return _hex64(0, "lsn") + _hex64(_as_int(source["lsn"], "source.lsn"), "lsn")
    elif connector in ("mysql", "mariadb") and source.get("file"):
        file = str(source["file"])
        number = file.rpartition(".")[2]
        if not number.isdigit():
            raise RecordError(f"source.file {file!r} does not end in a binlog number")
        return "".join(
            (
                _hex64(int(number), "binlog number"),
                _hex64(_as_int(source.get("pos", 0), "source.pos"), "source.pos"),
                _hex64(_as_int(source.get("row", 0), "source.row"), "source.row"),
            )
        )
    elif connector == "sqlserver" and source.get("commit_lsn"):
        return f"{source['commit_lsn']}{source.get('change_lsn') or ''}"
    if source.get("ts_ms") is not None:
        return _hex64(_as_int(source["ts_ms"], "source.ts_ms"), "source.ts_ms")
    return None


def value_at(envelope: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path (`source.lsn`); a missing field is a failure."""
    node: Any = envelope
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise RecordError(f"the envelope has no field {path!r} (the ordering path)")
        node = node[part]
    return node


def _ordering_value(value: Any, path: str) -> Ordering | None:
    if value is None or (isinstance(value, (int, float, str, bytes, Decimal))):
        if isinstance(value, bool):
            raise RecordError(f"the ordering value at {path!r} is a boolean")
        if isinstance(value, float) and value != value:
            raise RecordError(f"the ordering value at {path!r} is NaN")
        return value
    raise RecordError(f"the ordering value at {path!r} is a {type(value).__name__}, not a scalar")


def parse_json_value(value: bytes, what: str = "value") -> Any:
    """A record value (or key) as JSON, unwrapped from `{"schema": ..., "payload": ...}`."""
    try:
        parsed = json.loads(value)
    except (ValueError, UnicodeDecodeError) as e:
        raise RecordError(f"the {what} is not JSON: {reason(e)}") from None
    if isinstance(parsed, dict) and parsed.keys() == {"schema", "payload"}:
        return parsed["payload"]
    return parsed


def _row_field_schemas(wrapped: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The field schemas of the row (of `after`, else `before`) in a JSON converter schema."""
    schema = wrapped.get("schema")
    if not isinstance(schema, Mapping):
        return {}
    out: dict[str, Mapping[str, Any]] = {}
    for part in schema.get("fields") or ():
        if isinstance(part, Mapping) and part.get("field") in ("after", "before"):
            for f in part.get("fields") or ():
                if isinstance(f, Mapping) and isinstance(f.get("field"), str):
                    out.setdefault(f["field"], f)
    return out


@dataclass(frozen=True, slots=True)
class RowValues:
    """How the columns' values are read: the target types (`columns`, the table's row schema;
    None leaves values as decoded) and the unavailable-value placeholder."""

    columns: pa.Schema | None = None
    placeholder: str = PLACEHOLDER

    def is_placeholder(self, value: Any, *, maybe_bytes: bool = True) -> bool:
        """Whether `value` is the placeholder in one of its forms; its base64 text counts only
        where the column may hold bytes (`maybe_bytes`: binary, or of unknown type)."""
        text = self.placeholder
        raw = text.encode()
        if isinstance(value, str):
            return value == text or (maybe_bytes and value == base64.b64encode(raw).decode())
        if isinstance(value, bytes):
            return value == raw
        if isinstance(value, list) and value:
            return value == [text] or value == list(raw)
        return False

    def convert(
        self, row: Mapping[str, Any], field_schemas: Mapping[str, Mapping[str, Any]]
    ) -> tuple[dict[str, Any], frozenset[str]]:
        out: dict[str, Any] = {}
        unavailable: set[str] = set()
        for name, value in row.items():
            if self.is_placeholder(value, maybe_bytes=self._maybe_bytes(name, field_schemas)):
                out[name] = None
                unavailable.add(name)
                continue
            out[name] = self._convert_one(name, value, field_schemas.get(name))
        return out, frozenset(unavailable)

    def _maybe_bytes(self, name: str, field_schemas: Mapping[str, Mapping[str, Any]]) -> bool:
        if self.columns is not None and self.columns.get_field_index(name) >= 0:
            t = self.columns.field(name).type
            return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))
        schema = field_schemas.get(name)
        if schema is not None:
            return schema.get("type") == "bytes" and schema.get("name") != _CONNECT_DECIMAL
        return True

    def _convert_one(self, name: str, value: Any, field_schema: Mapping[str, Any] | None) -> Any:
        if value is None:
            return None
        target = None
        if self.columns is not None and self.columns.get_field_index(name) >= 0:
            target = self.columns.field(name).type
        precise = field_schema is not None and field_schema.get("name") == _CONNECT_DECIMAL
        if precise and field_schema is not None and isinstance(value, str):
            value = _precise_decimal(name, value, field_schema)
        if target is not None and pa.types.is_decimal(target):
            return _fit_decimal(name, value, target)
        if (
            target is not None
            and (pa.types.is_binary(target) or pa.types.is_large_binary(target))
            and isinstance(value, str)
        ):
            try:
                return base64.b64decode(value, validate=True)
            except binascii.Error:
                raise RecordError(f"column {name!r}: {value!r} is not base64") from None
        return value


def _precise_decimal(name: str, text: str, field_schema: Mapping[str, Any]) -> Decimal:
    params = field_schema.get("parameters") or {}
    try:
        scale = int(params["scale"])
        raw = base64.b64decode(text, validate=True)
    except (KeyError, ValueError, TypeError, binascii.Error):
        raise RecordError(
            f"column {name!r}: {text!r} is not a Kafka Connect decimal (base64 with a scale)"
        ) from None
    return Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale)


def _fit_decimal(name: str, value: Any, target: pa.DataType) -> Decimal:
    if isinstance(value, bool):
        raise RecordError(f"column {name!r}: a boolean is not a decimal")
    try:
        number = value if isinstance(value, Decimal) else Decimal(str(value))
    except InvalidOperation:
        raise RecordError(f"column {name!r}: {value!r} is not a decimal number") from None
    if not number.is_finite():
        raise RecordError(f"column {name!r}: {value!r} is not a finite decimal")
    scale: int = target.scale
    precision: int = target.precision
    with localcontext() as ctx:
        ctx.prec = 100  # enough for decimal256's 76 digits: quantize must not round
        try:
            fitted = number.quantize(Decimal(1).scaleb(-scale))
        except InvalidOperation:
            fitted = None
    if fitted is not None and fitted != number:
        raise RecordError(f"column {name!r}: {value!r} has more than {scale} fractional digits")
    if fitted is None or len(fitted.as_tuple().digits) > precision:
        raise RecordError(f"column {name!r}: {value!r} does not fit decimal({precision},{scale})")
    return fitted


def _key_of(
    key_columns: Sequence[str],
    row: Mapping[str, Any] | None,
    record_key: Mapping[str, Any] | None,
) -> tuple[tuple[str, Any], ...]:
    out = []
    for name in key_columns:
        value = row.get(name) if row is not None else None
        if value is None and record_key is not None:
            value = record_key.get(name)
        if value is None:
            raise RecordError(f"the change has no value for key column {name!r}")
        out.append((name, value))
    return tuple(out)


def _record_key(key: bytes | None) -> Mapping[str, Any] | None:
    if key is None:
        return None
    parsed = parse_json_value(key, "record key")
    return parsed if isinstance(parsed, Mapping) else None


def parse_json_envelope(
    value: bytes,
) -> tuple[Mapping[str, Any] | None, Mapping[str, Mapping[str, Any]]]:
    """A JSON Debezium value: its envelope (None: a null payload, a tombstone) and the field
    schemas of its row when the converter's schema/payload wrapper carries them."""
    try:
        parsed = json.loads(value)
    except (ValueError, UnicodeDecodeError) as e:
        raise RecordError(f"the value is not JSON: {reason(e)}") from None
    field_schemas: Mapping[str, Mapping[str, Any]] = {}
    if isinstance(parsed, dict) and parsed.keys() == {"schema", "payload"}:
        field_schemas = _row_field_schemas(parsed)
        parsed = parsed["payload"]
        if parsed is None:
            return None, {}
    if not isinstance(parsed, dict):
        raise RecordError(f"a Debezium value is a JSON object, not {type(parsed).__name__}")
    return parsed, field_schemas


@dataclass(frozen=True, slots=True)
class DebeziumDecoder:
    """Decodes Debezium change events into `ChangeEvent`s (the rules are in the module doc)."""

    key_columns: tuple[str, ...]
    values: RowValues = field(default_factory=RowValues)
    ordering_path: str | None = None
    """A dotted path into the envelope for the ordering value; None: the source position."""

    def __post_init__(self) -> None:
        if not self.key_columns:
            raise RecordError("a change stream needs at least one key column")

    def decode_json(self, value: bytes | None, key: bytes | None = None) -> ChangeEvent | None:
        """One JSON record value (and its key); None for a tombstone."""
        if value is None:
            return None
        envelope, field_schemas = parse_json_envelope(value)
        if envelope is None:
            return None
        return self.from_envelope(envelope, field_schemas, record_key=_record_key(key))

    def from_avro(
        self, envelope: Mapping[str, Any] | None, key: Mapping[str, Any] | None = None
    ) -> ChangeEvent | None:
        """An Avro envelope as lakesink's Avro decoder returns it (None for a tombstone)."""
        if envelope is None:
            return None
        return self.from_envelope(envelope, {}, record_key=key)

    def from_envelope(
        self,
        envelope: Mapping[str, Any],
        field_schemas: Mapping[str, Mapping[str, Any]],
        *,
        record_key: Mapping[str, Any] | None = None,
    ) -> ChangeEvent:
        if "op" not in envelope:
            raise RecordError("not a Debezium change event: the envelope has no 'op' field")
        op = envelope["op"]
        if not isinstance(op, str) or op not in _OPERATIONS:
            refused = _REFUSED_OPERATIONS.get(op) if isinstance(op, str) else None
            raise RecordError(refused or f"unknown Debezium operation {op!r} (expected c, r, u, d)")
        operation = _OPERATIONS[op]
        side = "before" if operation.is_delete else "after"
        raw_row = envelope.get(side)
        if raw_row is not None and not isinstance(raw_row, Mapping):
            raise RecordError(f"'{side}' of an op {op!r} event is not a row object")
        if raw_row is None and not operation.is_delete:
            raise RecordError(f"an op {op!r} event has no '{side}' row")
        source = envelope.get("source")
        if source is not None and not isinstance(source, Mapping):
            raise RecordError("'source' of the event is not an object")
        row, unavailable = self.values.convert(raw_row or {}, field_schemas)
        key = _key_of(self.key_columns, row, record_key)
        if raw_row is None:
            row = dict(key)
        position = source_position(source) if source is not None else None
        if self.ordering_path is None:
            ordering: Ordering | None = position
        else:
            ordering = _ordering_value(value_at(envelope, self.ordering_path), self.ordering_path)
        change = RowChange(operation, key, row, ordering, unavailable)
        connector = source.get("connector") if source is not None else None
        return ChangeEvent(change, position, connector if isinstance(connector, str) else None)

    def decode_all(
        self, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None = None
    ) -> DecodedChanges:
        """Every value of a batch: events, tombstones and failures by index."""
        return _decode_all(self.decode_json, values, keys)


@dataclass(frozen=True, slots=True)
class OperationFieldDecoder:
    """Records of a non-Debezium stream whose operation is one field of a flat JSON object
    (`op_field`), its values mapped to operations (`operations`, e.g. {"I": INSERT, "U": UPDATE,
    "D": DELETE}; a number or boolean field is matched by its JSON text). The row is the whole
    object, the operation field included; the ordering is the value at `ordering_path` (None:
    no ordering value, so the later Kafka offset wins); a null value is a tombstone."""

    op_field: str
    operations: Mapping[str, RowOperation]
    key_columns: tuple[str, ...]
    values: RowValues = field(default_factory=RowValues)
    ordering_path: str | None = None

    def __post_init__(self) -> None:
        if not self.key_columns:
            raise RecordError("a change stream needs at least one key column")
        if not self.operations:
            raise RecordError(f"the operation field {self.op_field!r} maps no values")

    def decode_json(self, value: bytes | None, key: bytes | None = None) -> ChangeEvent | None:
        if value is None:
            return None
        parsed = parse_json_value(value)
        if parsed is None:
            return None
        if not isinstance(parsed, dict):
            raise RecordError(f"the value is a JSON {type(parsed).__name__}, not an object")
        return self.from_record(parsed, record_key=_record_key(key))

    def from_record(
        self, record: Mapping[str, Any], *, record_key: Mapping[str, Any] | None = None
    ) -> ChangeEvent:
        """One record as a dict (parsed JSON, or a decoded Avro record)."""
        if self.op_field not in record:
            raise RecordError(f"the record has no operation field {self.op_field!r}")
        raw = record[self.op_field]
        text = raw if isinstance(raw, str) else json.dumps(raw)
        operation = self.operations.get(text)
        if operation is None:
            known = ", ".join(sorted(self.operations))
            raise RecordError(
                f"operation field {self.op_field!r} has value {text!r}, not one of {known}"
            )
        row, unavailable = self.values.convert(record, {})
        key = _key_of(self.key_columns, row, record_key)
        ordering = None
        if self.ordering_path is not None:
            ordering = _ordering_value(value_at(record, self.ordering_path), self.ordering_path)
        return ChangeEvent(RowChange(operation, key, row, ordering, unavailable))

    def decode_all(
        self, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None = None
    ) -> DecodedChanges:
        return _decode_all(self.decode_json, values, keys)


def _decode_all(
    decode: Callable[[bytes | None, bytes | None], ChangeEvent | None],
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None,
) -> DecodedChanges:
    if keys is not None and len(keys) != len(values):
        raise RecordError(f"{len(keys)} keys for {len(values)} values")
    out = DecodedChanges()
    for i, value in enumerate(values):
        try:
            event = decode(value, keys[i] if keys is not None else None)
        except RecordError as e:
            out.failures[i] = reason(e)
            continue
        if event is None:
            out.tombstones.append(i)
        else:
            out.events.append((i, event))
    return out
