"""The decoded Arrow schema as an Iceberg schema with field ids, partition fields from settings,
the compatibility check of an existing table, and data file descriptions as JSON."""

from __future__ import annotations

import pyarrow as pa
import pytest

from lakesink.errors import ConfigError, CorruptTableError, SchemaMismatchError
from lakesink.formats.iceberg.datafiles import DataFileDescription, attempt_uuid
from lakesink.formats.iceberg.errors import PartitionSpecError
from lakesink.formats.iceberg.schema import (
    PartitionFieldSetting,
    check_compatible,
    iceberg_schema,
    parse_partition_field,
    parse_partition_spec,
    partition_spec,
)
from lakesink.kafka.reader import METADATA_FIELDS

ROWS = pa.schema([*METADATA_FIELDS, pa.field("user", pa.string()), pa.field("n", pa.int64())])


def test_decoded_rows_map_to_iceberg_types_with_top_level_ids_first() -> None:
    s = iceberg_schema(ROWS)
    top = [(f.field_id, f.name, str(f.field_type), f.required) for f in s.fields]
    assert top[:4] == [
        (1, "kafka_topic", "string", True),
        (2, "kafka_partition", "int", True),
        (3, "kafka_offset", "long", True),
        (4, "kafka_timestamp", "timestamptz", False),
    ]
    assert [f.field_id for f in s.fields] == list(range(1, len(ROWS) + 1))
    headers = s.find_field("kafka_headers").field_type
    assert str(headers).startswith("list<struct<")
    nested_ids = [headers.element_id] + [f.field_id for f in headers.element_type.fields]
    assert min(nested_ids) > len(ROWS) and len(set(nested_ids)) == 3


def test_arrow_types_iceberg_has_not_are_refused_naming_the_column() -> None:
    with pytest.raises(SchemaMismatchError, match=r"column 'big' .*uint64"):
        iceberg_schema(pa.schema([pa.field("big", pa.uint64())]))
    with pytest.raises(SchemaMismatchError, match=r"column 'ts' .*timestamp\[ns\]"):
        iceberg_schema(pa.schema([pa.field("ts", pa.timestamp("ns"))]))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kafka_partition", PartitionFieldSetting("identity", "kafka_partition")),
        ("identity(user)", PartitionFieldSetting("identity", "user")),
        ("day(kafka_timestamp)", PartitionFieldSetting("day", "kafka_timestamp")),
        ("days(kafka_timestamp)", PartitionFieldSetting("day", "kafka_timestamp")),
        ("hour( kafka_timestamp )", PartitionFieldSetting("hour", "kafka_timestamp")),
        ("bucket[16](user)", PartitionFieldSetting("bucket", "user", 16)),
        ("bucket(8, user)", PartitionFieldSetting("bucket", "user", 8)),
    ],
)
def test_partition_field_forms_parse(text: str, expected: PartitionFieldSetting) -> None:
    assert parse_partition_field(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("month(ts)", "not valid"),
        ("bucket(user)", "positive count"),
        ("bucket[0](user)", "positive count"),
        ("day[3](ts)", "only bucket takes a count"),
        ("day(a, b)", "names no single column"),
        ("1col", "not valid"),
    ],
)
def test_bad_partition_fields_are_config_errors_naming_valid_forms(text: str, message: str) -> None:
    with pytest.raises(PartitionSpecError, match=message) as e:
        parse_partition_field(text)
    assert isinstance(e.value, ConfigError)


def test_partition_spec_text_splits_on_top_level_commas_and_refuses_repeats() -> None:
    fields = parse_partition_spec("kafka_partition, bucket(4, user), day(kafka_timestamp)")
    assert [str(f) for f in fields] == [
        "identity(kafka_partition)",
        "bucket[4](user)",
        "day(kafka_timestamp)",
    ]
    with pytest.raises(PartitionSpecError, match="repeat user"):
        parse_partition_spec(["user", "identity(user)"])


def test_partition_spec_binds_fields_to_source_ids_with_iceberg_names() -> None:
    schema = iceberg_schema(ROWS)
    spec = partition_spec(schema, parse_partition_spec("day(kafka_timestamp), bucket[4](user)"))
    got = [(f.source_id, f.field_id, str(f.transform), f.name) for f in spec.fields]
    user_id = schema.find_field("user").field_id
    assert got == [
        (4, 1000, "day", "kafka_timestamp_day"),
        (user_id, 1001, "bucket[4]", "user_bucket_4"),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("day(user)", r"day\(\) needs a timestamp or date column, 'user' is string"),
        ("hour(n)", r"hour\(\) needs a timestamp column, 'n' is long"),
        ("identity(nope)", r"no column 'nope' in the table; columns: kafka_topic"),
        ("kafka_headers", "not a primitive type"),
    ],
)
def test_partition_fields_that_do_not_fit_the_schema_name_the_column(
    text: str, message: str
) -> None:
    with pytest.raises(PartitionSpecError, match=message):
        partition_spec(iceberg_schema(ROWS), [parse_partition_field(text)])


def test_compatible_rows_pass_and_a_conflicting_column_is_named() -> None:
    table = iceberg_schema(ROWS)
    check_compatible(table, ROWS, "db.events")
    check_compatible(table, pa.schema(list(ROWS)[:4]), "db.events")  # optional ones may lack
    retyped = pa.schema([*METADATA_FIELDS, pa.field("user", pa.int32()), pa.field("n", pa.int64())])
    with pytest.raises(
        SchemaMismatchError, match=r"db.events: column 'user' is string in the table but int"
    ):
        check_compatible(table, retyped, "db.events")
    extra = ROWS.append(pa.field("extra", pa.string()))
    with pytest.raises(SchemaMismatchError, match=r"column 'extra' of the rows is not in"):
        check_compatible(table, extra, "db.events")
    nullable = pa.schema([f.with_nullable(True) if f.name == "kafka_offset" else f for f in ROWS])
    with pytest.raises(SchemaMismatchError, match=r"'kafka_offset' is required in the table"):
        check_compatible(table, nullable, "db.events")
    with pytest.raises(SchemaMismatchError, match=r"required column 'kafka_topic' is missing"):
        check_compatible(table, pa.schema(list(ROWS)[1:]), "db.events")


def test_data_file_description_round_trips_through_json() -> None:
    d = DataFileDescription(
        path="s3://b/t/data/p=1/00000-0-x.parquet",
        size_bytes=1234,
        record_count=10,
        spec_id=0,
        partition=(1, "x", None, b"\x00\xff", 2.5, True),
        column_sizes={1: 10},
        value_counts={1: 10},
        null_value_counts={1: 0},
        nan_value_counts={},
        lower_bounds={1: b"\x00\x01"},
        upper_bounds={1: b"\xff"},
        split_offsets=(4,),
    )
    assert DataFileDescription.from_json(d.to_json()) == d
    with pytest.raises(CorruptTableError, match="cannot be read"):
        DataFileDescription.from_json({"path": "x"})


def test_each_task_attempt_writes_under_its_own_uuid() -> None:
    assert attempt_uuid("b1-t0-a0") == attempt_uuid("b1-t0-a0")
    assert attempt_uuid("b1-t0-a0") != attempt_uuid("b1-t0-a1")
