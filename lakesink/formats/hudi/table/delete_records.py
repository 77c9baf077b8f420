"""The records of a log file's delete block: Avro binary of one `HoodieDeleteRecordList` datum
(an array of records of a nullable record key, a nullable partition path and the ordering
value), written and read without a schema library so that the union branch of each ordering
value is exactly the one Hudi 1.2.0 declares (`OrderingBranch`)."""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa

from lakesink.errors import CorruptTableError, UnsupportedTableError

__all__ = [
    "DeleteRecord",
    "OrderingBranch",
    "decode_deletes",
    "encode_deletes",
    "ordering_branch",
    "ordering_python_value",
    "ordering_values",
]


class OrderingBranch(enum.IntEnum):
    """The branches of `HoodieDeleteRecord.orderingVal` as Hudi 1.2.0 declares it: a union of
    null and one-field wrapper records (`BooleanWrapper`, `IntWrapper`, ...), which Avro encodes
    as the branch index then the wrapped value. An `IntWrapper` of 0 is Hudi's default ordering
    value: a delete without one (what Spark SQL's DELETE writes)."""

    BOOLEAN = 1
    INT = 2
    LONG = 3
    FLOAT = 4
    DOUBLE = 5
    BYTES = 6
    STRING = 7
    DATE = 8  # int days
    DECIMAL = 9  # bytes
    TIME_MICROS = 10  # long
    TIMESTAMP_MICROS = 11  # long
    ARRAY = 12  # several ordering fields: not read by lakesink


_INTS = {OrderingBranch.INT, OrderingBranch.DATE}
_LONGS = {OrderingBranch.LONG, OrderingBranch.TIME_MICROS, OrderingBranch.TIMESTAMP_MICROS}
_EPOCH_DAY = date(1970, 1, 1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ordering_branch(arrow_type: pa.DataType) -> OrderingBranch:
    """The `orderingVal` branch of an ordering column's type; UnsupportedTableError for a type
    lakesink does not carry in a delete record."""
    t = arrow_type
    if pa.types.is_boolean(t):
        return OrderingBranch.BOOLEAN
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t):
        return OrderingBranch.INT
    if pa.types.is_integer(t):
        return OrderingBranch.LONG
    if pa.types.is_float32(t):
        return OrderingBranch.FLOAT
    if pa.types.is_float64(t):
        return OrderingBranch.DOUBLE
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return OrderingBranch.BYTES
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return OrderingBranch.STRING
    if pa.types.is_date32(t):
        return OrderingBranch.DATE
    if pa.types.is_timestamp(t) and t.unit == "us":
        return OrderingBranch.TIMESTAMP_MICROS
    raise UnsupportedTableError(
        f"an ordering column of type {t} cannot be carried by a delete record; use a boolean, "
        "integer, float, string, binary, date or microsecond timestamp column"
    )


@dataclass(frozen=True, slots=True)
class DeleteRecord:
    """One deleted key in a delete block: the record key, its partition path, and the ordering
    value of the delete as Avro stores it (`branch`: its wrapper; a date is its day number, a
    timestamp its microseconds). The default, an `IntWrapper` of 0, is no ordering value."""

    record_key: str
    partition_path: str
    ordering_value: bool | int | float | str | bytes = 0
    branch: OrderingBranch = OrderingBranch.INT

    @property
    def is_unordered(self) -> bool:
        """Hudi's delete without an ordering value (`Comparables.isDefault`: Integer 0)."""
        return self.branch is OrderingBranch.INT and self.ordering_value == 0


def ordering_values(column: pa.Array | pa.ChunkedArray) -> tuple[OrderingBranch, list[Any]]:
    """(branch, values as Avro stores them) of an ordering column's values."""
    branch = ordering_branch(column.type)
    if column.null_count:
        raise UnsupportedTableError(
            "a delete without an ordering value cannot be written: Hudi's readers need one"
        )
    if branch is OrderingBranch.DATE:
        return branch, [(v - _EPOCH_DAY).days for v in column.to_pylist()]
    if branch is OrderingBranch.TIMESTAMP_MICROS:
        return branch, column.cast(pa.int64()).to_pylist()
    return branch, column.to_pylist()


def _zigzag(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _avro_bytes(b: bytes) -> bytes:
    return _zigzag(len(b)) + b


def encode_deletes(records: Sequence[DeleteRecord]) -> bytes:
    """Avro binary of one `HoodieDeleteRecordList` datum."""
    out = bytearray()
    if records:
        out += _zigzag(len(records))
        for r in records:
            out += b"\x02" + _avro_bytes(r.record_key.encode("utf-8"))
            out += b"\x02" + _avro_bytes(r.partition_path.encode("utf-8"))
            out += _zigzag(int(r.branch))
            v, b = r.ordering_value, r.branch
            if b is OrderingBranch.BOOLEAN:
                out += b"\x01" if v else b"\x00"
            elif b in _INTS or b in _LONGS:
                out += _zigzag(int(v))
            elif b is OrderingBranch.FLOAT:
                out += struct.pack("<f", float(v))
            elif b is OrderingBranch.DOUBLE:
                out += struct.pack("<d", float(v))
            elif b is OrderingBranch.STRING:
                out += _avro_bytes(str(v).encode("utf-8"))
            elif isinstance(v, bytes) and b in (OrderingBranch.BYTES, OrderingBranch.DECIMAL):
                out += _avro_bytes(v)
            else:
                raise ValueError(f"a delete record cannot carry {v!r} as {b.name}")
    out += b"\x00"  # the array's end
    return bytes(out)


class _AvroReader:
    """The few Avro binary reads a delete list needs; CorruptTableError on truncation."""

    def __init__(self, data: bytes, where: str) -> None:
        self.data, self.pos, self.where = data, 0, where

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise CorruptTableError(f"{self.where}: the delete list is truncated")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def long(self) -> int:
        shift = z = 0
        while True:
            b = self.take(1)[0]
            z |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return (z >> 1) ^ -(z & 1)
            if shift > 63:
                raise CorruptTableError(f"{self.where}: a varint in the delete list is too long")

    def text(self) -> str:
        return self.take(self.long()).decode("utf-8", errors="strict")

    def optional_text(self) -> str:
        branch = self.long()
        if branch == 0:
            return ""
        if branch != 1:
            raise CorruptTableError(f"{self.where}: union branch {branch} of a nullable string")
        return self.text()


def decode_deletes(data: bytes, where: str) -> tuple[DeleteRecord, ...]:
    r = _AvroReader(data, where)
    out: list[DeleteRecord] = []
    try:
        while (count := r.long()) != 0:
            if count < 0:  # a block with its byte size
                count = -count
                r.long()
            for _ in range(count):
                key, partition = r.optional_text(), r.optional_text()
                raw = r.long()
                try:
                    branch = OrderingBranch(raw)
                except ValueError:
                    raise CorruptTableError(
                        f"{where}: a delete record's ordering value has union branch {raw}"
                    ) from None
                value: bool | int | float | str | bytes
                if branch is OrderingBranch.BOOLEAN:
                    value = r.take(1) != b"\x00"
                elif branch in _INTS or branch in _LONGS:
                    value = r.long()
                elif branch is OrderingBranch.FLOAT:
                    value = struct.unpack("<f", r.take(4))[0]
                elif branch is OrderingBranch.DOUBLE:
                    value = struct.unpack("<d", r.take(8))[0]
                elif branch is OrderingBranch.STRING:
                    value = r.text()
                elif branch in (OrderingBranch.BYTES, OrderingBranch.DECIMAL):
                    value = r.take(r.long())
                else:
                    raise UnsupportedTableError(
                        f"{where}: a delete record orders by several fields (an ArrayWrapper); "
                        "lakesink reads one ordering field"
                    )
                out.append(DeleteRecord(key, partition, value, branch))
    except UnicodeDecodeError as e:
        raise CorruptTableError(f"{where}: a delete record's text is not UTF-8: {e}") from e
    if r.pos != len(data):
        raise CorruptTableError(f"{where}: {len(data) - r.pos} bytes follow the delete list")
    return tuple(out)


def ordering_python_value(record: DeleteRecord) -> Any:
    """A delete's ordering value as Arrow takes it for the column (dates as dates, timestamps
    as datetimes)."""
    v = record.ordering_value
    if record.branch is OrderingBranch.DATE:
        return date.fromordinal(_EPOCH_DAY.toordinal() + int(v))
    if record.branch is OrderingBranch.TIMESTAMP_MICROS:
        return _EPOCH + timedelta(microseconds=int(v))
    return v
