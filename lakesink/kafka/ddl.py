"""Spark DDL strings ("id BIGINT, name STRING, tags ARRAY<STRING>") parsed into Arrow schemas.

Covers the common Spark SQL types: BOOLEAN, TINYINT/BYTE, SMALLINT/SHORT, INT/INTEGER,
BIGINT/LONG, FLOAT/REAL, DOUBLE, DECIMAL(p,s)/NUMERIC, STRING/VARCHAR(n)/CHAR(n), BINARY, DATE,
TIMESTAMP (UTC instants), TIMESTAMP_NTZ, ARRAY<t>, MAP<k,v>, STRUCT<name: t, ...>.
Field names may be quoted with backticks; `NOT NULL` and `COMMENT '...'` are accepted.
"""

from __future__ import annotations

import re

import pyarrow as pa

from lakesink.errors import ConfigError

_TOKEN = re.compile(
    r"\s*(?:(`(?:[^`]|``)*`)|('(?:[^'\\]|\\.)*')|([A-Za-z_][A-Za-z0-9_]*)|(-?\d+)|(.))"
)

_SIMPLE: dict[str, pa.DataType] = {
    "BOOLEAN": pa.bool_(),
    "BOOL": pa.bool_(),
    "TINYINT": pa.int8(),
    "BYTE": pa.int8(),
    "SMALLINT": pa.int16(),
    "SHORT": pa.int16(),
    "INT": pa.int32(),
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "LONG": pa.int64(),
    "FLOAT": pa.float32(),
    "REAL": pa.float32(),
    "DOUBLE": pa.float64(),
    "STRING": pa.string(),
    "TEXT": pa.string(),
    "BINARY": pa.binary(),
    "DATE": pa.date32(),
    "TIMESTAMP": pa.timestamp("us", tz="UTC"),
    "TIMESTAMP_LTZ": pa.timestamp("us", tz="UTC"),
    "TIMESTAMP_NTZ": pa.timestamp("us"),
}


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                break
            tok = next((g for g in m.groups() if g is not None), None)
            if tok is not None:
                self.tokens.append(tok)
            pos = m.end()
        self.i = 0

    def error(self, what: str) -> ConfigError:
        near = " ".join(self.tokens[self.i : self.i + 4]) or "end of text"
        return ConfigError(f"schema DDL {self.text!r} is not valid: {what} near {near!r}")

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise self.error("unexpected end")
        self.i += 1
        return tok

    def expect(self, tok: str) -> None:
        got = self.peek()
        if got is None or got.upper() != tok:
            raise self.error(f"expected {tok!r}")
        self.i += 1

    def accept(self, tok: str) -> bool:
        got = self.peek()
        if got is not None and got.upper() == tok:
            self.i += 1
            return True
        return False

    def name(self) -> str:
        tok = self.take()
        if tok.startswith("`"):
            return tok[1:-1].replace("``", "`")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", tok):
            raise self.error(f"expected a field name, got {tok!r}")
        return tok

    def fields(self, end: str | None, colon: bool) -> list[pa.Field]:
        out: list[pa.Field] = []
        seen: set[str] = set()
        while True:
            name = self.name()
            if colon:
                self.accept(":")
            typ = self.type()
            nullable = True
            while True:
                if self.accept("NOT"):
                    self.expect("NULL")
                    nullable = False
                elif self.accept("COMMENT"):
                    tok = self.take()
                    if not tok.startswith("'"):
                        raise self.error("expected a quoted comment")
                else:
                    break
            if name.lower() in seen:
                raise self.error(f"field {name!r} appears twice")
            seen.add(name.lower())
            out.append(pa.field(name, typ, nullable=nullable))
            if not self.accept(","):
                break
        if end is not None:
            self.expect(end)
        elif self.peek() is not None:
            raise self.error("unexpected text")
        return out

    def int_arg(self) -> int:
        tok = self.take()
        if not tok.lstrip("-").isdigit():
            raise self.error(f"expected a number, got {tok!r}")
        return int(tok)

    def type(self) -> pa.DataType:
        word = self.take().upper()
        if word in ("DECIMAL", "DEC", "NUMERIC"):
            precision, scale = 10, 0
            if self.accept("("):
                precision = self.int_arg()
                if self.accept(","):
                    scale = self.int_arg()
                self.expect(")")
            if not 1 <= precision <= 38 or not 0 <= scale <= precision:
                raise self.error(f"DECIMAL({precision},{scale}) is out of range (precision 1..38)")
            return pa.decimal128(precision, scale)
        if word in ("VARCHAR", "CHAR"):
            self.expect("(")
            self.int_arg()
            self.expect(")")
            return pa.string()
        if word == "ARRAY":
            self.expect("<")
            item = self.type()
            self.expect(">")
            return pa.list_(item)
        if word == "MAP":
            self.expect("<")
            key = self.type()
            self.expect(",")
            value = self.type()
            self.expect(">")
            return pa.map_(key, value)
        if word == "STRUCT":
            self.expect("<")
            if self.peek() == ">":  # Parquet cannot store a struct without fields
                raise self.error("STRUCT<> has no fields; give at least one, e.g. STRUCT<a: INT>")
            return pa.struct(self.fields(">", colon=True))
        if word in _SIMPLE:
            return _SIMPLE[word]
        raise self.error(f"unknown type {word!r}")


def ddl_to_arrow(ddl: str) -> pa.Schema:
    """Parse a Spark DDL column list into an Arrow schema. Raises ConfigError naming the problem."""
    text = ddl.strip()
    if not text:
        raise ConfigError("schema DDL is empty; give columns like 'id BIGINT, name STRING'")
    parser = _Parser(text)
    first = parser.peek()
    if first is not None and first.upper() == "STRUCT" and parser.tokens[1:2] == ["<"]:
        typ = parser.type()
        if parser.peek() is not None:
            raise parser.error("unexpected text")
        return pa.schema(list(typ))
    return pa.schema(parser.fields(None, colon=False))


def arrow_type_to_ddl(t: pa.DataType, required: bool = False) -> str:
    """The Spark DDL spelling of an Arrow type (inverse of the parser for the covered types);
    `required`: the type's field is required, so its struct's required fields stay so."""
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    simple = {
        pa.int8(): "TINYINT",
        pa.int16(): "SMALLINT",
        pa.int32(): "INT",
        pa.int64(): "BIGINT",
        pa.float32(): "FLOAT",
        pa.float64(): "DOUBLE",
        pa.string(): "STRING",
        pa.large_string(): "STRING",
        pa.binary(): "BINARY",
        pa.large_binary(): "BINARY",
        pa.date32(): "DATE",
    }
    for k, v in simple.items():
        if t == k:
            return v
    if pa.types.is_timestamp(t):
        return "TIMESTAMP" if t.tz is not None else "TIMESTAMP_NTZ"
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_map(t):
        return f"MAP<{arrow_type_to_ddl(t.key_type)}, {arrow_type_to_ddl(t.item_type)}>"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"ARRAY<{arrow_type_to_ddl(t.value_type)}>"
    if pa.types.is_struct(t):
        # a required field of a required struct stays required (NOT NULL); under an optional
        # struct it is written optional, as the Iceberg readers expect a null struct's fields
        inner = ", ".join(
            f"`{f.name}`: {arrow_type_to_ddl(f.type, required and not f.nullable)}"
            f"{' NOT NULL' if required and not f.nullable else ''}"
            for f in t
        )
        return f"STRUCT<{inner}>"
    raise ConfigError(f"Arrow type {t} has no Spark DDL spelling in lakesink")


def arrow_to_ddl(schema: pa.Schema) -> str:
    """A Spark DDL column list for an Arrow schema."""
    parts = []
    for f in schema:
        not_null = "" if f.nullable else " NOT NULL"
        parts.append(f"`{f.name}` {arrow_type_to_ddl(f.type, not f.nullable)}{not_null}")
    return ", ".join(parts)
