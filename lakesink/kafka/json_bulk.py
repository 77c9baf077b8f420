"""JSON values in bulk: pyarrow.json where it provably gives the reference rows, else one by one.

`JsonDeserializer.decode` gives exactly what `JsonValueDecoder` (json_values.py, the rules) gives
value by value; pyarrow.json is only a faster way to the same rows, used on *plain* values:

- a plain value starts with ``{``, ends with ``}``, holds no line feed or carriage return, is
  valid UTF-8, and holds none of the texts pyarrow.json reads differently from the rules
  (``NaN``/``Inf`` literals, ``\\uD800``-``\\uDFFF`` escapes; more than MAX_DEPTH brackets);
- plain values are joined with line feeds and read with an explicit schema. A document that does
  not end on its own line meets the ``{`` starting the next line (or the end), which is a syntax
  error; so every line yields at least one row and, when the row count equals the number of
  values, row i is value i (a second document in one value cannot hide a missing one elsewhere);
- the column types where pyarrow's conversions differ from the rules are read as strings or
  wider types and converted here (TIMESTAMP/DATE: the rules' pattern, checked column-wise, then a
  cast; FLOAT: read as DOUBLE, narrowed, overflow refused); schemas with MAP or DECIMAL columns, or
  TIMESTAMP/DATE/FLOAT inside STRUCT/ARRAY, are decoded by the rules alone.

Any error of the fast read (a bad value, an unexpected row count) splits the batch in halves until
each value pyarrow refuses alone is decoded by the rules, which then accept it or give the reason.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from lakesink.errors import ConfigError
from lakesink.kafka.ddl import ddl_to_arrow
from lakesink.kafka.decoded import Decoded, bisect_parse, concat_in_order, rows_to_table
from lakesink.kafka.json_values import MAX_DEPTH, BadValue, JsonValueDecoder, check_json_type

_YEAR = r"(?:000[1-9]|00[1-9]\d|0[1-9]\d\d|[1-9]\d{3})-\d{2}-\d{2}"
_TIME = r"[T ](?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,6})?"
_ZONE = r"(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_TS_UTC = f"^{_YEAR}{_TIME}{_ZONE}?$"
_TS_NTZ = f"^{_YEAR}{_TIME}$"
_DATE_ONLY = f"^{_YEAR}$"


def _fast_type(t: pa.DataType, *, top: bool) -> bool:
    """Can pyarrow.json read this type (as itself, or widened at the top level) by the rules?"""
    if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_float64(t):
        return True
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return True
    if pa.types.is_float32(t) or pa.types.is_timestamp(t) or pa.types.is_date32(t):
        return top
    if pa.types.is_struct(t):
        return all(_fast_type(f.type, top=False) for f in t)
    if pa.types.is_list(t):
        return _fast_type(t.value_type, top=False)
    return False  # maps, decimals


def _read_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t) or pa.types.is_date32(t):
        return pa.string()
    if pa.types.is_float32(t):
        return pa.float64()
    return t


def _shallow(v: bytes) -> bool:
    return len(v) <= 2 * MAX_DEPTH or v.count(b"[") + v.count(b"{") <= MAX_DEPTH


def _plain(v: bytes | None) -> bool:
    """A value the fast read may take (see the module docstring)."""
    if v is None or v[:1] != b"{" or v[-1:] != b"}" or b"\n" in v or b"\r" in v:
        return False
    if b"NaN" in v or b"Inf" in v or b"\\ud" in v or b"\\uD" in v:
        return False
    if len(v) > 2 * MAX_DEPTH and not _shallow(v):
        return False
    if not v.isascii():
        try:
            v.decode("utf-8")
        except UnicodeDecodeError:
            return False
    return True


_SCAN_BYTES = 1 << 18  # slices that stay in the CPU's cache: 2-3x faster than whole passes
Positions = npt.NDArray[np.intp]


def _scan(data: bytes, opens: bool) -> tuple[Positions, Positions | None]:
    """The positions of the line feeds in `data` and, with `opens`, of its `[` and `{`, found
    slice by slice with numpy."""
    raw = np.frombuffer(data, np.uint8)
    size = min(len(raw), _SCAN_BYTES)
    hit = np.empty(size, np.bool_)
    folded = np.empty(size, np.uint8)
    feeds: list[Positions] = []
    brackets: list[Positions] = []
    for at in range(0, len(raw), _SCAN_BYTES):
        part = raw[at : at + _SCAN_BYTES]
        k = len(part)
        np.equal(part, ord("\n"), out=hit[:k])
        feeds.append(np.flatnonzero(hit[:k]) + at)
        if opens:
            # `[` (0x5B) and `{` (0x7B) are the two bytes that give 0x7B with the 0x20 bit set
            np.bitwise_or(part, 0x20, out=folded[:k])
            np.equal(folded[:k], ord("{"), out=hit[:k])
            brackets.append(np.flatnonzero(hit[:k]) + at)
    none: Positions = np.empty(0, np.intp)
    found = np.concatenate(feeds) if feeds else none
    return found, (np.concatenate(brackets) if brackets else none) if opens else None


def _one_value_a_line(data: bytes, breaks: Positions, n: int) -> bool:
    """Are the line feeds of `data` (n values joined by line feeds) exactly n - 1, each between
    a `}` and a `{`? (The same test as counting "\\n" and "}\\n{" in `data`.)"""
    if len(breaks) != n - 1:
        return False
    raw = np.frombuffer(data, np.uint8)
    # data starts with `{` and ends with `}`: no break is at either end
    return bool((raw[breaks - 1] == ord("}")).all() and (raw[breaks + 1] == ord("{")).all())


def _all_shallow(breaks: Positions, opens: Positions, n: int) -> bool:
    """Does every value hold at most MAX_DEPTH `[` and `{`, so that none nests deeper? (What
    `_shallow` checks value by value.) `breaks` split the values, `opens` are the brackets."""
    per_value = np.bincount(np.searchsorted(breaks, opens), minlength=n)
    return int(per_value.max()) <= MAX_DEPTH


def _all_match(col: pa.ChunkedArray, pattern: str, *, clock: bool) -> bool:
    """Does every non-null text of `col` match `pattern` (a date or timestamp pattern above)?"""
    import pyarrow.compute as pc

    if _one_shape_matches(col, pattern, clock=clock):
        return True
    ok = pc.match_substring_regex(col, pattern)
    return bool(ok.null_count == col.null_count and pc.all(ok).as_py())


def _one_shape_matches(col: pa.ChunkedArray, pattern: str, *, clock: bool) -> bool:
    """True when every text of `col` matches `pattern` by a cheaper proof than the regex; False
    when that proof does not apply (the regex decides then). It applies to the usual column: no
    nulls, every text of one length, and the first one matching. The first text is then a
    template: every text must have its non-digit bytes where it has them and digits where it
    has digits, and the ranges the pattern puts on some digits are checked column by column
    (year not 0000; with `clock`, hours up to 23 and minutes and seconds up to 59 at their fixed
    places, and the same for a `+HH:MM` zone at the end)."""
    import pyarrow.compute as pc

    n = len(col)
    if n == 0 or col.null_count or not pa.types.is_string(col.type):
        return False
    texts = col.combine_chunks()
    bounds = pc.min_max(pc.binary_length(texts))
    width = bounds["min"].as_py()
    if width != bounds["max"].as_py() or width < 10:
        return False
    first: str = texts[0].as_py()
    if re.fullmatch(pattern, first, re.ASCII) is None:
        return False
    start = int(np.frombuffer(texts.buffers()[1], np.int32)[texts.offset])
    rows = np.frombuffer(texts.buffers()[2], np.uint8)[start : start + n * width]
    rows = rows.reshape(n, width)
    template = np.frombuffer(first.encode("ascii"), np.uint8)
    digit = (template >= ord("0")) & (template <= ord("9"))
    if not (rows[:, ~digit] == template[~digit]).all():
        return False
    if not (rows[:, digit] - np.uint8(ord("0")) <= 9).all():  # uint8: below "0" wraps high
        return False
    if (rows[:, :4] == ord("0")).all(axis=1).any():
        return False  # year 0000
    if not clock:
        return True
    places: list[tuple[int, int, int | None]] = [(11, 14, 17)]  # HH:MM:SS after the date and T
    if int(template[width - 6]) in b"+-" and template[width - 3] == ord(":"):
        places.append((width - 5, width - 2, None))  # the zone's HH:MM
    for hour, minute, second in places:
        tens, ones = rows[:, hour], rows[:, hour + 1]
        if not ((tens <= ord("1")) | ((tens == ord("2")) & (ones <= ord("3")))).all():
            return False
        for at in (minute, second):
            if at is not None and not (rows[:, at] <= ord("5")).all():
                return False
    return True


class JsonDeserializer:
    """JSON objects → columns of `schema` (a Spark DDL string or an Arrow schema), by the rules
    of json_values.py."""

    def __init__(self, schema: pa.Schema | str) -> None:
        self._schema = ddl_to_arrow(schema) if isinstance(schema, str) else schema
        if len(self._schema) == 0:
            raise ConfigError("a JSON value schema needs at least one column")
        for f in self._schema:
            check_json_type(f.type, f.name)
        self._rules = JsonValueDecoder(self._schema)
        self._fast = all(_fast_type(f.type, top=True) for f in self._schema)
        self._read_schema = pa.schema(
            [pa.field(f.name, _read_type(f.type), f.nullable) for f in self._schema]
        )
        self._converted = [i for i, f in enumerate(self._schema) if _read_type(f.type) != f.type]

    @property
    def value_schema(self) -> pa.Schema:
        return self._schema

    def decode(self, values: Sequence[bytes | None]) -> Decoded:
        n = len(values)
        if n == 0:
            return Decoded(self._schema.empty_table())
        if self._fast and None not in values:
            data = b"\n".join(values)  # type: ignore[arg-type]
            longest = max(map(len, values))  # type: ignore[arg-type]
            if self._batch_is_plain(data, values, longest):  # type: ignore[arg-type]
                try:
                    return Decoded(self._read(data, n, longest))
                except Exception:  # a value pyarrow refuses: find it below
                    return self._decode_mixed(values, all_plain=True)
        return self._decode_mixed(values)

    def _batch_is_plain(self, data: bytes, values: Sequence[bytes], longest: int) -> bool:
        """Are all values plain? Checked over the joined bytes (C speed); a one-byte search
        (memchr) first spares the longer searches on ordinary data."""
        if data[:1] != b"{" or data[-1:] != b"}" or b"\r" in data:
            return False
        n = len(values)
        deep_possible = longest > 2 * MAX_DEPTH
        breaks, opens = _scan(data, opens=deep_possible)
        if not _one_value_a_line(data, breaks, n):
            return False  # a value with a line break, or a line not from `{` to `}`
        if b"N" in data and b"NaN" in data:
            return False
        if b"I" in data and b"Inf" in data:
            return False
        if b"\\" in data and (b"\\ud" in data or b"\\uD" in data):
            return False
        if not data.isascii():
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                return False
        return opens is None or _all_shallow(breaks, opens, n)

    def _decode_mixed(self, values: Sequence[bytes | None], all_plain: bool = False) -> Decoded:
        """Runs of plain values through the fast read (halved on errors), the rest by the rules.
        `all_plain`: the batch check already proved every value plain."""
        failures: dict[int, str] = {}
        pieces: list[tuple[int, pa.Table]] = []
        by_rules: list[tuple[int, dict[str, Any]]] = []

        def rules(i: int, _: BaseException | None = None) -> None:
            try:
                by_rules.append((i, self._rules.decode_one(values[i])))
            except BadValue as e:
                failures[i] = str(e)

        def parse(lines: Sequence[bytes]) -> pa.Table:
            return self._read(b"\n".join(lines), len(lines), max(map(len, lines)))

        n = len(values)
        if all_plain:
            plain = [True] * n
        else:
            plain = [_plain(v) for v in values] if self._fast else [False] * n
        i = 0
        while i < n:
            j = i
            while j < n and plain[j]:
                j += 1
            if j > i:
                run: list[bytes] = values[i:j]  # type: ignore[assignment]
                bisect_parse(parse, run, i, rules, pieces)
                i = j
            else:
                rules(i)
                i += 1
        by_rules.sort(key=lambda r: r[0])
        pieces += rows_to_table(by_rules, self._schema, failures, "value does not fit the schema")
        return Decoded(concat_in_order(pieces, self._schema), failures)

    def _read(self, data: bytes, n: int, longest: int) -> pa.Table:
        """Plain values joined by line feeds → exactly n rows of the schema, or an exception."""
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
            raise ValueError(f"found {table.num_rows} JSON documents in {n} values")
        table = table.select(range(len(self._schema)))
        for i in self._converted:
            f = self._schema.field(i)
            col = table.column(i)
            if pa.types.is_float32(f.type):
                narrow = pc.cast(col, pa.float32(), safe=False)
                if pc.any(pc.is_inf(narrow)).as_py():
                    raise ValueError(f"{f.name}: a number is out of range for FLOAT")
            else:
                if pa.types.is_date32(f.type):
                    pattern = _DATE_ONLY
                elif f.type.tz is not None:
                    pattern = _TS_UTC
                else:
                    pattern = _TS_NTZ
                if not _all_match(col, pattern, clock=pattern != _DATE_ONLY):
                    raise ValueError(f"{f.name}: a value does not match {pattern}")
                # a value that matched ends with a digit or a zone: all ending with "Z" (the
                # usual case) are all zoned, which spares the second regex
                if (
                    pa.types.is_timestamp(f.type)
                    and f.type.tz is not None
                    and not pc.all(pc.ends_with(col, "Z")).as_py()
                ):
                    zoned = pc.match_substring_regex(col, f"{_ZONE}$")
                    if not pc.all(zoned).as_py():  # no zone means UTC
                        col = pc.if_else(zoned, col, pc.binary_join_element_wise(col, "Z", ""))
                narrow = pc.cast(col, f.type)
            table = table.set_column(i, f, narrow)
        if not table.schema.equals(self._schema):
            table = table.cast(self._schema)
        return table
