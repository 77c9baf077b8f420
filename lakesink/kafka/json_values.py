"""The JSON value rules, one value at a time: the reference that every JSON path must agree with.

`JsonValueDecoder.decode_one(value)` turns one Kafka record value into one row (a dict of Python
values that `pyarrow` converts to the column types without further judgement) or raises
`BadValue` with the reason. It is plain on purpose: stdlib `json` plus an explicit conversion per
column type. The bulk decoder (`json_bulk.JsonDeserializer`) may use `pyarrow.json` for speed,
but it must give exactly the rows and failures that this module gives (a differential test checks
it); values it cannot prove to be ordinary are decoded here.

The rules (also in docs/bad-records.md):

- Tombstone (null value): a row of nulls when every value column is nullable, otherwise a failure
  naming the required column.
- The value is exactly one JSON text (RFC 8259) in UTF-8: an object, optionally surrounded by JSON
  whitespace (space, tab, line feed, carriage return). Refused: empty values, a byte order mark,
  invalid UTF-8 anywhere in the value, a second document or any other trailing data, raw control
  characters inside strings, NaN/Infinity literals, comments, nesting deeper than
  `MAX_DEPTH` levels.
- Fields are matched by exact name; fields that are not columns are ignored (after the syntax
  checks above). A column or struct field named twice in one object, or a map key given twice,
  is a failure. A missing field is null; null or missing in a NOT NULL column is a failure.
- Strings that become column values (STRING, BINARY, map keys) must be valid Unicode: a lone
  surrogate escape such as ``"\\ud800"`` is a failure. BINARY takes the UTF-8 bytes of a string.
- Numbers are never coerced: integer columns take JSON integers within the column's range
  (``1.0``, ``1e3`` and ``-0.0`` are failures; ``-0`` is 0); FLOAT/DOUBLE take any JSON number
  whose value is finite in the column's type (``1e400`` is a failure; underflow rounds to zero);
  DECIMAL(p,s) takes a JSON number or a string in JSON number syntax whose value has at most s
  fractional digits (trailing zeros aside) and p digits in all (``" 1.5"`` and ``"+1"`` are
  failures). A number never fills a STRING column, a string never fills a number column, and
  BOOLEAN takes only true/false.
- TIMESTAMP: a string ``YYYY-MM-DD(T| )hh:mm:ss[.f]`` with 1 to 6 fractional digits and an
  optional zone ``Z`` or ``±hh:mm``; no zone means UTC, an offset is converted to UTC. More than 6
  fractional digits (nanoseconds), compact forms (``20240101T000000Z``), a date without a time
  and leap seconds are failures. TIMESTAMP_NTZ: the same without a zone. DATE: ``YYYY-MM-DD``.
  Years run from 0001 to 9999 (before an offset is applied).
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from datetime import date
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa

from lakesink.errors import ConfigError

MAX_DEPTH = 128
"""The deepest nesting of arrays and objects a JSON value may have."""

_BOM = b"\xef\xbb\xbf"
_JSON_WS = " \t\n\r"
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})", re.ASCII)
_TIMESTAMP = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[T ]([01]\d|2[0-3]):([0-5]\d):([0-5]\d)(?:\.(\d{1,6}))?"
    r"(Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)?",
    re.ASCII,
)
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.S)
_INT_RANGES = {
    pa.int8(): (-(2**7), 2**7 - 1),
    pa.int16(): (-(2**15), 2**15 - 1),
    pa.int32(): (-(2**31), 2**31 - 1),
    pa.int64(): (-(2**63), 2**63 - 1),
}
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_US_PER_DAY = 86_400_000_000


class BadValue(ValueError):
    """One value breaks the JSON rules; the message says how."""


class _NegativeZero(int):
    """The JSON integer ``-0``: 0 in an integer column, -0.0 in a float column."""


class _LongInteger(Decimal):
    """A JSON integer of more than 40 digits (beyond every column type; kept exact)."""


class _Object(dict[str, Any]):
    """A JSON object that remembers the names it held more than once."""

    __slots__ = ("repeated",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.repeated: frozenset[str] = frozenset() if len(self) == len(pairs) else _repeated(pairs)


def _repeated(pairs: list[tuple[str, Any]]) -> frozenset[str]:
    seen: set[str] = set()
    twice: set[str] = set()
    for k, _ in pairs:
        (twice if k in seen else seen).add(k)
    return frozenset(twice)


def _reject_constant(name: str) -> Any:
    raise BadValue(f"{name} is not a JSON number (NaN and Infinity literals are not valid JSON)")


def _parse_int(text: str) -> int | Decimal:
    if len(text) > 40:  # int() of thousands of digits is slow or refused; no column takes it
        return _LongInteger(text)
    return _NegativeZero(0) if text == "-0" else int(text)


def check_depth(text: str) -> None:
    """Raise BadValue when arrays/objects nest deeper than MAX_DEPTH (strings are skipped)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return
    depth = 0
    for m in _TOKENS.finditer(text):
        tok = m.group()
        if tok in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise BadValue(f"JSON value nests deeper than {MAX_DEPTH} levels")
        elif tok in "]}":
            depth -= 1


def parse_document(value: bytes) -> Any:
    """The one JSON text of `value` (syntax rules only), or BadValue."""
    if value.startswith(_BOM):
        raise BadValue("value starts with a byte order mark")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadValue(f"value is not valid UTF-8 (byte {e.start}: {e.reason})") from e
    if not text.strip(_JSON_WS):
        raise BadValue("value is empty")
    check_depth(text)
    try:
        return json.loads(
            text,
            object_pairs_hook=_Object,
            parse_constant=_reject_constant,
            parse_float=Decimal,
            parse_int=_parse_int,
        )
    except BadValue:
        raise
    except RecursionError as e:  # pragma: no cover - check_depth stops this first
        raise BadValue(f"JSON value nests deeper than {MAX_DEPTH} levels") from e
    except ValueError as e:
        raise BadValue(f"value is not one valid JSON document: {e}") from e


def _valid_unicode(s: str, where: str) -> str:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadValue(f"{where}: string holds a lone surrogate escape, not valid Unicode") from e
    return s


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, _LongInteger)):
        return "an integer"
    if isinstance(v, Decimal):
        return "a number with a fraction or exponent"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def _days(y: str, m: str, d: str, where: str) -> int:
    try:
        return date(int(y), int(m), int(d)).toordinal() - _EPOCH_ORDINAL
    except ValueError as e:
        raise BadValue(f"{where}: {y}-{m}-{d} is not a date ({e})") from e


def _timestamp_us(s: str, tz: bool, where: str) -> int:
    m = _TIMESTAMP.fullmatch(s)
    if m is None or (m.group(8) is not None and not tz):
        form = "YYYY-MM-DDThh:mm:ss[.ffffff][Z|±hh:mm]" if tz else "YYYY-MM-DDThh:mm:ss[.ffffff]"
        raise BadValue(f"{where}: {s[:60]!r} is not a timestamp of the form {form}")
    y, mo, d, hh, mm, ss, frac, zone = m.groups()
    us = _days(y, mo, d, where) * _US_PER_DAY
    us += ((int(hh) * 60 + int(mm)) * 60 + int(ss)) * 1_000_000
    if frac:
        us += int(frac.ljust(6, "0"))
    if zone and zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        us -= sign * (int(zone[1:3]) * 60 + int(zone[4:6])) * 60_000_000
    return us


def _decimal(v: Any, t: pa.Decimal128Type, where: str) -> Decimal:
    if isinstance(v, str):
        if not _NUMBER.fullmatch(v):
            raise BadValue(f"{where}: string {v[:60]!r} is not a number in JSON syntax")
        d = Decimal(v)
    elif isinstance(v, Decimal) or (isinstance(v, int) and not isinstance(v, bool)):
        d = Decimal(v)
    else:
        raise BadValue(f"{where}: expected a number for {t}, got {_type_name(v)}")
    try:
        sign, digits, exponent = d.as_tuple()
        assert isinstance(exponent, int)
        unscaled = int("".join(map(str, digits)) or "0")
        shift = exponent + t.scale
        if shift >= 0:
            if shift > t.precision:
                raise BadValue(f"{where}: {v} does not fit {t}")
            unscaled *= 10**shift
        elif -shift > len(digits):
            if unscaled:
                raise BadValue(f"{where}: {v} has more than {t.scale} fractional digits ({t})")
        else:
            unscaled, rest = divmod(unscaled, 10**-shift)
            if rest:
                raise BadValue(f"{where}: {v} has more than {t.scale} fractional digits ({t})")
    except InvalidOperation as e:  # pragma: no cover - as_tuple of a parsed number
        raise BadValue(f"{where}: {v} is not a decimal") from e
    if len(str(unscaled)) > t.precision:
        raise BadValue(f"{where}: {v} does not fit {t}")
    return Decimal(-unscaled if sign else unscaled).scaleb(-t.scale)


def _float(v: Any, t: pa.DataType, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, Decimal)):
        raise BadValue(f"{where}: expected a number for {t}, got {_type_name(v)}")
    if isinstance(v, _NegativeZero):
        return -0.0
    try:
        x = float(v)
    except OverflowError as e:
        raise BadValue(f"{where}: {v} is out of range for {t}") from e
    if x in (float("inf"), float("-inf")):
        raise BadValue(f"{where}: {str(v)[:60]} is out of range for {t}")
    if pa.types.is_float32(t):
        try:
            (x,) = struct.unpack("<f", struct.pack("<f", x))
        except OverflowError as e:
            raise BadValue(f"{where}: {str(v)[:60]} is out of range for {t}") from e
    return x


def convert(v: Any, t: pa.DataType, nullable: bool, where: str) -> Any:
    """One JSON-decoded value shaped for `t` by the rules above, or BadValue."""
    if v is None:
        if not nullable:
            raise BadValue(f"{where}: required (NOT NULL) field is missing or null")
        return None
    if pa.types.is_string(t):
        if not isinstance(v, str):
            raise BadValue(f"{where}: expected a string, got {_type_name(v)}")
        return _valid_unicode(v, where)
    if pa.types.is_binary(t):
        if not isinstance(v, str):
            raise BadValue(f"{where}: expected a string for BINARY, got {_type_name(v)}")
        return _valid_unicode(v, where).encode("utf-8")
    if pa.types.is_boolean(t):
        if not isinstance(v, bool):
            raise BadValue(f"{where}: expected true or false, got {_type_name(v)}")
        return v
    if pa.types.is_integer(t):
        if isinstance(v, _LongInteger):
            raise BadValue(f"{where}: {str(v)[:40]}... is out of range for {t}")
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadValue(f"{where}: expected an integer for {t}, got {_type_name(v)}")
        lo, hi = _INT_RANGES[t]
        if not lo <= v <= hi:
            raise BadValue(f"{where}: {str(v)[:60]} is out of range for {t}")
        return int(v)
    if pa.types.is_floating(t):
        return _float(v, t, where)
    if pa.types.is_decimal(t):
        return _decimal(v, t, where)
    if pa.types.is_timestamp(t):
        if not isinstance(v, str):
            raise BadValue(f"{where}: expected a timestamp string, got {_type_name(v)}")
        return _timestamp_us(v, t.tz is not None, where)
    if pa.types.is_date32(t):
        m = _DATE.fullmatch(v) if isinstance(v, str) else None
        if m is None:
            raise BadValue(f"{where}: expected a date string YYYY-MM-DD, got {str(v)[:60]!r}")
        y, mo, d = m.groups()
        return _days(y, mo, d, where)
    if pa.types.is_map(t):
        if not isinstance(v, _Object):
            raise BadValue(f"{where}: expected an object for a map, got {_type_name(v)}")
        if v.repeated:
            raise BadValue(f"{where}: map key {sorted(v.repeated)[0]!r} appears twice")
        item = t.item_field
        return [
            (_valid_unicode(k, where), convert(x, item.type, item.nullable, f"{where}[{k!r}]"))
            for k, x in v.items()
        ]
    if pa.types.is_struct(t):
        if not isinstance(v, _Object):
            raise BadValue(f"{where}: expected an object, got {_type_name(v)}")
        return convert_fields(v, list(t), where)
    if pa.types.is_list(t):
        if not isinstance(v, list):
            raise BadValue(f"{where}: expected an array, got {_type_name(v)}")
        item = t.value_field
        return [convert(x, item.type, item.nullable, f"{where}[{i}]") for i, x in enumerate(v)]
    raise BadValue(f"{where}: type {t} is not supported for JSON")  # pragma: no cover


def convert_fields(obj: _Object, fields: list[pa.Field], where: str = "") -> dict[str, Any]:
    """The fields of a struct (or the columns of a row) from one JSON object."""
    prefix = f"{where}." if where else ""
    if obj.repeated:
        twice = [f.name for f in fields if f.name in obj.repeated]
        if twice:
            raise BadValue(f"{prefix}{twice[0]}: field appears twice")
    return {
        f.name: convert(obj.get(f.name), f.type, f.nullable, f"{prefix}{f.name}") for f in fields
    }


def check_json_type(t: pa.DataType, where: str) -> None:
    """ConfigError for column types JSON cannot fill (maps need string keys)."""
    if pa.types.is_map(t):
        if not pa.types.is_string(t.key_type):
            raise ConfigError(
                f"JSON column {where}: map keys are JSON names, so use MAP<STRING, ...>"
            )
        check_json_type(t.item_type, where)
    elif pa.types.is_struct(t):
        for f in t:
            check_json_type(f.type, f"{where}.{f.name}")
    elif pa.types.is_list(t):
        check_json_type(t.value_type, where)


@dataclass(frozen=True, slots=True)
class JsonValueDecoder:
    """Decodes one JSON value at a time into a row of `schema` (the reference rules)."""

    schema: pa.Schema

    def decode_one(self, value: bytes | None) -> dict[str, Any]:
        fields = list(self.schema)
        if value is None:
            required = [f.name for f in fields if not f.nullable]
            if required:
                raise BadValue(
                    f"tombstone (null value) for a schema with required column {required[0]}"
                )
            return dict.fromkeys(self.schema.names)
        doc = parse_document(value)
        if not isinstance(doc, _Object):
            raise BadValue(f"value is not a JSON object (it is {_type_name(doc)})")
        return convert_fields(doc, fields)
