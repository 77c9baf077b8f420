"""One-record Avro container files (the commit metadata of layout 2), encoded by an encoder
compiled once per schema.

fastavro resolves each union by validating the value against the branches first; the commit
metadata's `partitionToWriteStats` is a nullable map, so every write stat was validated in full
and then written, field by nullable field: at 512 Kafka partitions that was the largest single
cost of a publish. The schemas lakesink writes use a small part of Avro (records, maps, arrays,
unions, strings, longs, ints, booleans), so each schema is compiled into plain functions, and
the container header is fastavro's own (only the sync marker is new per file). The bytes are
those fastavro writes for the same record and sync marker (tests/unit check it), and fastavro
reads them back.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Mapping
from typing import Any

import fastavro

Encoder = Callable[[Any, bytearray], None]


def _long(n: int, out: bytearray) -> None:
    n = (n << 1) ^ (n >> 63)  # zig-zag
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _int(v: Any, out: bytearray) -> None:
    if type(v) is not int:  # bool is an int subclass, and not an Avro long
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"expected an int, got {v!r}")
        v = int(v)
    if 0 <= v < 64:  # most counters: one byte
        out.append(v << 1)
    else:
        _long(v, out)


def _string(v: Any, out: bytearray) -> None:
    data = v.encode("utf-8")  # AttributeError for anything but str: raised below as TypeError
    _long(len(data), out)
    out += data


def _boolean(v: Any, out: bytearray) -> None:
    if not isinstance(v, bool):
        raise TypeError(f"expected a boolean, got {v!r}")
    out.append(1 if v else 0)


def _null(v: Any, out: bytearray) -> None:
    if v is not None:
        raise TypeError(f"expected null, got {v!r}")


_PRIMITIVES: dict[str, Encoder] = {
    "null": _null,
    "boolean": _boolean,
    "int": _int,
    "long": _int,
    "string": _string,
}


def _compile(schema: Any, named: dict[str, Encoder]) -> Encoder:
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema]
        if schema in named:
            return named[schema]
        raise ValueError(f"Avro type {schema!r} is not supported by the compiled encoder")
    if isinstance(schema, list):
        return _union(schema, named)
    kind = schema["type"]
    if kind == "record":
        return _record(schema, named)
    if kind == "map":
        values = _compile(schema["values"], named)

        def encode_map(v: Any, out: bytearray) -> None:
            if v:
                _long(len(v), out)
                for key, item in v.items():
                    _string(key, out)
                    values(item, out)
            out.append(0)

        return encode_map
    if kind == "array":
        items = _compile(schema["items"], named)

        def encode_array(v: Any, out: bytearray) -> None:
            if v:
                _long(len(v), out)
                for item in v:
                    items(item, out)
            out.append(0)

        return encode_array
    return _compile(kind, named)


def _union(branches: list[Any], named: dict[str, Encoder]) -> Encoder:
    if len(branches) != 2 or "null" not in branches:
        raise ValueError("only unions of null and one other type are supported")
    null_index = branches.index("null")
    other_index = 1 - null_index
    other = _compile(branches[other_index], named)
    null_tag, other_tag = null_index * 2, other_index * 2  # zig-zag of 0 and 1, one byte each

    def encode_union(v: Any, out: bytearray) -> None:
        if v is None:
            out.append(null_tag)
        else:
            out.append(other_tag)
            other(v, out)

    return encode_union


def _record(schema: Mapping[str, Any], named: dict[str, Encoder]) -> Encoder:
    fields: list[tuple[str, Any, Encoder]] = []

    def encode_record(v: Any, out: bytearray) -> None:
        get = v.get
        for name, default, encode in fields:
            encode(get(name, default), out)

    named[schema["name"]] = encode_record  # before its fields: a record may refer to itself
    for f in schema["fields"]:
        fields.append((f["name"], f.get("default"), _compile(f["type"], named)))
    return encode_record


class ContainerWriter:
    """Writes one record per Avro container file for one schema (parsed by fastavro)."""

    def __init__(self, schema: Any) -> None:
        """`schema`: a record schema as fastavro.parse_schema returns it."""
        if not isinstance(schema, dict) or schema.get("type") != "record":
            raise ValueError("a container writer needs a record schema")
        self._encode = _compile(schema, {})
        header = io.BytesIO()
        fastavro.writer(header, schema, [], codec="null", sync_marker=b"\0" * 16)
        self._header = header.getvalue()[:-16]  # magic and metadata, without the sync marker

    def encode_record(self, record: Mapping[str, Any]) -> bytes:
        """The Avro binary encoding of `record` alone (no container)."""
        out = bytearray()
        try:
            self._encode(record, out)
        except AttributeError as e:  # a non-string where a string belongs
            raise TypeError(f"record does not match its Avro schema: {e}") from e
        return bytes(out)

    def file_bytes(self, record: Mapping[str, Any], sync_marker: bytes | None = None) -> bytes:
        """A whole container file holding `record` (a fresh random sync marker by default)."""
        sync = os.urandom(16) if sync_marker is None else sync_marker
        body = self.encode_record(record)
        out = bytearray(self._header)
        out += sync
        _long(1, out)
        _long(len(body), out)
        out += body
        out += sync
        return bytes(out)
