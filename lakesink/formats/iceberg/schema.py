"""From the decoded Arrow schema to an Iceberg schema with field ids, and the partition spec.

A table is created on first use from the Arrow schema of the decoded rows (`iceberg_schema`) and
the partition fields of the settings (`PartitionFieldSetting`, parsed from text such as
`day(kafka_timestamp)` or `bucket[16](user_id)`). An existing table must accept the rows:
`check_compatible` names the first column that does not fit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from lakesink.errors import SchemaMismatchError
from lakesink.extras import require
from lakesink.formats.iceberg.errors import PartitionSpecError

if TYPE_CHECKING:
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.types import IcebergType

__all__ = [
    "PartitionFieldSetting",
    "Transform",
    "check_compatible",
    "iceberg_schema",
    "iceberg_type",
    "parse_partition_field",
    "parse_partition_spec",
    "partition_spec",
]

Transform = Literal["identity", "day", "hour", "bucket"]

PARTITION_FORMS = "'col', 'identity(col)', 'day(col)', 'hour(col)', 'bucket[N](col)'"
"""The partition field forms the settings accept, for error messages."""

_FIELD_ID_START = 1000  # Iceberg's first partition field id


@dataclass(frozen=True, slots=True)
class PartitionFieldSetting:
    """One partition field: a transform of a source column (`buckets` only for `bucket`)."""

    transform: Transform
    column: str
    buckets: int | None = None

    def __str__(self) -> str:
        if self.transform == "bucket":
            return f"bucket[{self.buckets}]({self.column})"
        return f"{self.transform}({self.column})"

    @property
    def name(self) -> str:
        """The partition field's name in the spec (Iceberg's convention)."""
        if self.transform == "identity":
            return self.column
        if self.transform == "bucket":
            return f"{self.column}_bucket_{self.buckets}"
        return f"{self.column}_{self.transform}"


_CALL = re.compile(
    r"^\s*(?P<fn>[a-z]+)\s*(?:\[\s*(?P<n>\d+)\s*\])?\s*\(\s*(?P<args>[^()]*?)\s*\)\s*$"
)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ALIASES: dict[str, Transform] = {
    "identity": "identity",
    "day": "day",
    "days": "day",
    "hour": "hour",
    "hours": "hour",
    "bucket": "bucket",
}


def parse_partition_field(text: str) -> PartitionFieldSetting:
    """`col`, `identity(col)`, `day(col)`/`days(col)`, `hour(col)`/`hours(col)`,
    `bucket[N](col)` or Spark's `bucket(N, col)`."""
    t = text.strip()
    if _NAME.match(t):
        return PartitionFieldSetting("identity", t)
    m = _CALL.match(t)
    if m is None or m.group("fn") not in _ALIASES:
        raise PartitionSpecError(
            f"partition field {text!r} is not valid; use one of {PARTITION_FORMS}"
        )
    transform = _ALIASES[m.group("fn")]
    args = [a.strip() for a in m.group("args").split(",")]
    n: int | None = int(m.group("n")) if m.group("n") is not None else None
    if transform == "bucket" and n is None and len(args) == 2 and args[0].isdigit():
        n, args = int(args[0]), args[1:]
    if len(args) != 1 or not _NAME.match(args[0]):
        raise PartitionSpecError(
            f"partition field {text!r} names no single column; use one of {PARTITION_FORMS}"
        )
    if transform == "bucket":
        if n is None or n <= 0:
            raise PartitionSpecError(
                f"partition field {text!r}: bucket needs a positive count, e.g. bucket[16](col)"
            )
    elif n is not None:
        raise PartitionSpecError(f"partition field {text!r}: only bucket takes a count [N]")
    return PartitionFieldSetting(transform, args[0], n)


def parse_partition_spec(texts: Iterable[str] | str) -> tuple[PartitionFieldSetting, ...]:
    """Partition fields from a list, or from one comma-separated text (`day(ts), bucket[4](id)`)
    whose commas inside brackets do not separate fields."""
    if isinstance(texts, str):
        parts, depth, cur = [], 0, ""
        for ch in texts:
            depth += ch in "(["
            depth -= ch in ")]"
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        parts.append(cur)
        texts = [p for p in parts if p.strip()]
    fields = tuple(parse_partition_field(t) for t in texts)
    names = [f.name for f in fields]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PartitionSpecError(f"partition fields repeat {', '.join(dupes)}")
    return fields


def iceberg_type(t: pa.DataType, column: str = "?") -> IcebergType:
    """The Iceberg type of an Arrow type (nested fields get placeholder ids, see
    `iceberg_schema`); SchemaMismatchError naming `column` for a type Iceberg has not."""
    require("pyiceberg", "Iceberg tables")
    from pyiceberg import types as it

    if pa.types.is_boolean(t):
        return it.BooleanType()
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t):
        return it.IntegerType()
    if pa.types.is_uint8(t) or pa.types.is_uint16(t):
        return it.IntegerType()
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return it.LongType()
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return it.FloatType()
    if pa.types.is_float64(t):
        return it.DoubleType()
    if pa.types.is_decimal(t):
        return it.DecimalType(t.precision, t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return it.StringType()
    if pa.types.is_fixed_size_binary(t):
        return it.FixedType(t.byte_width)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return it.BinaryType()
    if pa.types.is_date(t):
        return it.DateType()
    if pa.types.is_time64(t) and t.unit == "us":
        return it.TimeType()
    if pa.types.is_timestamp(t) and t.unit in ("us", "ms", "s"):
        return it.TimestamptzType() if t.tz is not None else it.TimestampType()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        f = t.value_field
        return it.ListType(-1, iceberg_type(f.type, column), element_required=not f.nullable)
    if pa.types.is_map(t):
        return it.MapType(
            -1,
            iceberg_type(t.key_type, column),
            -1,
            iceberg_type(t.item_type, column),
            value_required=not t.item_field.nullable,
        )
    if pa.types.is_struct(t):
        return it.StructType(*(_field(t.field(i), column) for i in range(t.num_fields)))
    raise SchemaMismatchError(
        f"column {column!r} has Arrow type {t}, which Iceberg tables cannot hold; cast it in "
        "the transformation (nanosecond timestamps to microseconds, uint64 to decimal or string)"
    )


def _field(f: pa.Field, column: str) -> Any:
    from pyiceberg.types import NestedField

    return NestedField(-1, f.name, iceberg_type(f.type, column), required=not f.nullable, doc=None)


def iceberg_schema(schema: pa.Schema) -> Schema:
    """The Iceberg schema of the decoded rows, with fresh field ids (top-level columns first,
    1..n, then the nested fields, as Iceberg assigns them). Nullable Arrow fields are optional."""
    require("pyiceberg", "Iceberg tables")
    from pyiceberg.schema import Schema, assign_fresh_schema_ids

    fields = [_field(f, f.name) for f in schema]
    return assign_fresh_schema_ids(Schema(*fields))


_TIME_TYPES = ("timestamp", "timestamptz", "date")


def partition_spec(schema: Schema, fields: Sequence[PartitionFieldSetting]) -> PartitionSpec:
    """The partition spec over `schema`: each field's column must exist at the top level and
    suit the transform (day of a timestamp or date, hour of a timestamp)."""
    require("pyiceberg", "Iceberg tables")
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import (
        BucketTransform,
        DayTransform,
        HourTransform,
        IdentityTransform,
    )
    from pyiceberg.types import PrimitiveType

    out = []
    names = [f.name for f in schema.fields]
    for i, setting in enumerate(fields):
        try:
            source = schema.find_field(setting.column)
        except ValueError as e:
            raise PartitionSpecError(
                f"partition field {setting}: no column {setting.column!r} in the table; "
                f"columns: {', '.join(names)}"
            ) from e
        kind = str(source.field_type)
        if not isinstance(source.field_type, PrimitiveType):
            raise PartitionSpecError(
                f"partition field {setting}: column {setting.column!r} is {kind}, not a "
                "primitive type"
            )
        if setting.transform == "day" and kind not in _TIME_TYPES:
            raise PartitionSpecError(
                f"partition field {setting}: day() needs a timestamp or date column, "
                f"{setting.column!r} is {kind}"
            )
        if setting.transform == "hour" and kind not in _TIME_TYPES[:2]:
            raise PartitionSpecError(
                f"partition field {setting}: hour() needs a timestamp column, "
                f"{setting.column!r} is {kind}"
            )
        transform: Any
        if setting.transform == "identity":
            transform = IdentityTransform()
        elif setting.transform == "day":
            transform = DayTransform()
        elif setting.transform == "hour":
            transform = HourTransform()
        else:
            assert setting.buckets is not None
            transform = BucketTransform(setting.buckets)
        if not transform.can_transform(source.field_type):
            raise PartitionSpecError(
                f"partition field {setting}: {setting.transform} cannot transform "
                f"{setting.column!r} of type {kind}"
            )
        out.append(
            PartitionField(
                source_id=source.field_id,
                field_id=_FIELD_ID_START + i,
                transform=transform,
                name=setting.name,
            )
        )
    return PartitionSpec(*out)


def check_compatible(table_schema: Schema, rows: pa.Schema, table: str) -> None:
    """Raise SchemaMismatchError naming the first column of `rows` that the table cannot take:
    a column the table lacks, a different type, or nulls into a required column. A column the
    table has and the rows lack is fine if it is optional (it reads as null)."""
    require("pyiceberg", "Iceberg tables")
    by_name = {f.name: f for f in table_schema.fields}
    for f in rows:
        existing = by_name.get(f.name)
        if existing is None:
            raise SchemaMismatchError(
                f"table {table}: column {f.name!r} of the rows is not in the table's schema "
                f"(columns: {', '.join(by_name)})"
            )
        want = iceberg_type(f.type, f.name)
        if not _same_type(existing.field_type, want):
            raise SchemaMismatchError(
                f"table {table}: column {f.name!r} is {existing.field_type} in the table but "
                f"{want} ({f.type}) in the rows"
            )
        if existing.required and f.nullable:
            raise SchemaMismatchError(
                f"table {table}: column {f.name!r} is required in the table but nullable in "
                "the rows"
            )
    present = {f.name for f in rows}
    for name, field in by_name.items():
        if field.required and name not in present:
            raise SchemaMismatchError(
                f"table {table}: required column {name!r} is missing from the rows"
            )


def _same_type(a: IcebergType, b: IcebergType) -> bool:
    """Equal types, ignoring field ids of nested fields (the rows' ids are placeholders)."""
    from pyiceberg.types import ListType, MapType, StructType

    if isinstance(a, StructType) and isinstance(b, StructType):
        return len(a.fields) == len(b.fields) and all(
            x.name == y.name and x.required == y.required and _same_type(x.field_type, y.field_type)
            for x, y in zip(a.fields, b.fields, strict=True)
        )
    if isinstance(a, ListType) and isinstance(b, ListType):
        return a.element_required == b.element_required and _same_type(
            a.element_type, b.element_type
        )
    if isinstance(a, MapType) and isinstance(b, MapType):
        return (
            a.value_required == b.value_required
            and _same_type(a.key_type, b.key_type)
            and _same_type(a.value_type, b.value_type)
        )
    return a == b
