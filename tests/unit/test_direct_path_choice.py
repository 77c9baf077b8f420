"""The direct task path's pure pieces (no Spark, no broker): when it is chosen, the `dt` column
it computes in bulk against a per-record reference, the dead-letter rows, and the task plan."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakesink.config import LakesinkConfig, build_config
from lakesink.errors import ConfigError
from lakesink.kafka.dead_letters import DEAD_LETTER_SCHEMA, FailedRecord
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import WriteStatus
from lakesink.spark.direct import (
    TaskStatuses,
    dead_letter_batch,
    dead_letter_rows,
    shape_rows,
    task_pieces,
    uses_direct_path,
)


def _cfg(**extra: Any) -> LakesinkConfig:
    raw: dict[str, Any] = {
        "kafka.bootstrap.servers": "127.0.0.1:9",
        "kafka.topics": "t",
        "value.format": "json",
        "value.schema": "id BIGINT, at TIMESTAMP, day DATE, name STRING",
        "table.path": "/tmp/lakesink-unit-direct",
    }
    raw.update({k.replace("__", "."): v for k, v in extra.items()})
    return build_config(raw)


@pytest.mark.parametrize(
    ("settings_", "direct"),
    [
        ({}, True),  # no transformation: direct
        ({"table__partition__date__from": "at"}, True),  # a timestamp column
        ({"table__partition__date__from": "day"}, True),  # a date column
        ({"table__partition__date__from": "kafka_timestamp"}, True),
        ({"table__partition__date__from": "name"}, False),  # a string: Spark parses it
        ({"transform__sql": "SELECT * FROM source"}, False),
        ({"transform__python": "os.path:join"}, False),
        ({"write__path": "dataframe"}, False),
        ({"write__path": "direct"}, True),
    ],
)
def test_write_path_auto_chooses_direct_only_without_spark_work(
    settings_: dict[str, Any], direct: bool
) -> None:
    assert uses_direct_path(_cfg(**settings_)) is direct


def test_write_path_direct_with_a_transformation_is_refused_naming_the_valid_values() -> None:
    with pytest.raises(ConfigError, match=r"write\.path=direct cannot apply transform\.sql"):
        _cfg(write__path="direct", transform__sql="SELECT * FROM source")
    with pytest.raises(ConfigError, match=r"'name' is a string column.*write\.path=auto"):
        uses_direct_path(_cfg(write__path="direct", table__partition__date__from="name"))
    with pytest.raises(ConfigError, match=r"write\.path"):
        _cfg(write__path="jvm")


ROWS = pa.schema(
    [
        pa.field("kafka_offset", pa.int64(), nullable=False),
        pa.field("at", pa.timestamp("us", tz="UTC")),
        pa.field("dt", pa.string()),
    ]
)
MICROS = st.integers(
    min_value=int(dt.datetime(1, 1, 1, tzinfo=dt.UTC).timestamp()) * 1_000_000,
    max_value=int(dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC).timestamp()) * 1_000_000,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), MICROS), max_size=40))
def test_bulk_date_column_matches_per_record_utc_dates(micros: list[int | None]) -> None:
    batch = pa.RecordBatch.from_arrays(
        [pa.array(range(len(micros)), pa.int64()), pa.array(micros, pa.timestamp("us"))],
        names=["kafka_offset", "at"],
    )
    out = shape_rows(batch, ROWS, "at")
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    expected = [
        None if m is None else (epoch + dt.timedelta(microseconds=m)).date().isoformat()
        for m in micros
    ]
    assert out.schema == ROWS
    assert out.column("dt").to_pylist() == expected


def test_date_column_of_a_dt_value_column_is_replaced_in_place() -> None:
    schema = pa.schema([pa.field("dt", pa.string()), pa.field("day", pa.date32())])
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["x"]), pa.array([dt.date(50, 3, 1)])], names=["dt", "day"]
    )
    out = shape_rows(batch, schema, "day")
    assert out.schema == schema
    assert out.column("dt").to_pylist() == ["0050-03-01"]


def test_rows_are_cast_to_the_schema_spark_hands_the_writer() -> None:
    schema = pa.schema([pa.field("n", pa.int64()), pa.field("t", pa.timestamp("us", tz="UTC"))])
    batch = pa.RecordBatch.from_arrays(
        [pa.array([1], pa.int8()), pa.array([1_000], pa.timestamp("ms", tz="UTC"))],
        names=["n", "t"],
    )
    out = shape_rows(batch, schema, None)
    assert out.schema == schema
    assert out.column("t").to_pylist()[0] == dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.UTC)


def test_dead_letter_rows_keep_every_field_of_each_failed_record() -> None:
    schema = dead_letter_rows(_cfg(errors__tolerance="all", errors__deadletter__table="/tmp/d"))
    assert schema.names == DEAD_LETTER_SCHEMA.names
    assert schema.field("error").nullable and schema.field("kafka_value").nullable
    assert not schema.field("kafka_offset").nullable
    failed = [
        FailedRecord(
            partition=TopicPartition("t", 1),
            offset=7 + i,
            timestamp_ms=1_000 * i if i else None,
            key=b"k" if i else None,
            value=None if i == 2 else b"\xff",
            headers=(("h", b"v"),) if i == 1 else (),
            error=f"bad {i}",
        )
        for i in range(3)
    ]
    rows = dead_letter_batch(failed, schema).to_pylist()
    assert [r["kafka_offset"] for r in rows] == [7, 8, 9]
    assert [r["error"] for r in rows] == ["bad 0", "bad 1", "bad 2"]
    assert [r["kafka_value"] for r in rows] == [b"\xff", b"\xff", None]
    assert rows[1]["kafka_headers"] == [{"key": "h", "value": b"v"}]
    assert rows[0]["kafka_headers"] is None and rows[0]["kafka_timestamp"] is None


def test_task_plan_splits_ranges_as_the_source_does_and_drops_empty_ones() -> None:
    tp = TopicPartition("t", 0)
    ranges = [OffsetRange(tp, 0, 25), OffsetRange(TopicPartition("t", 1), 5, 5)]
    pieces = task_pieces(ranges, 10)
    assert [(p.start, p.end) for p in pieces] == [(0, 10), (10, 20), (20, 25)]


def test_task_statuses_round_trip_through_json() -> None:
    status = WriteStatus(instant_time="20240101000000000", task_attempt="1.0.0", files=())
    for value in (TaskStatuses(status, None), TaskStatuses(None, status)):
        assert TaskStatuses.from_json(value.to_json()) == value


FAILED = st.builds(
    FailedRecord,
    partition=st.builds(TopicPartition, st.sampled_from(["a", "b.c"]), st.integers(0, 9)),
    offset=st.integers(0, 2**40),
    timestamp_ms=st.one_of(st.none(), st.integers(0, 2**41)),
    key=st.one_of(st.none(), st.binary(max_size=4)),
    value=st.one_of(st.none(), st.binary(max_size=8)),
    headers=st.lists(
        st.tuples(st.text(max_size=3), st.one_of(st.none(), st.binary(max_size=3))), max_size=2
    ).map(tuple),
    error=st.text(min_size=1, max_size=10),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(FAILED, min_size=1, max_size=10))
def test_dead_letter_rows_match_the_dataframe_paths_source_rows(failed: list[Any]) -> None:
    """The direct path builds dead letters itself; the DataFrame path's source yields them as
    rows with the value columns null, which the sink renames into the dead-letter columns."""
    from lakesink.spark.source import (
        ERROR_COLUMN,
        RAW_VALUE_COLUMN,
        _dead_letter_rows,
        source_arrow_schema,
    )

    cfg = _cfg(errors__tolerance="all", errors__deadletter__table="/tmp/d")
    source = _dead_letter_rows(source_arrow_schema(cfg), failed).to_pylist()
    renamed = {"kafka_value": RAW_VALUE_COLUMN, "error": ERROR_COLUMN}
    expected = [
        {f.name: row[renamed.get(f.name, f.name)] for f in DEAD_LETTER_SCHEMA} for row in source
    ]
    assert dead_letter_batch(failed, dead_letter_rows(cfg)).to_pylist() == expected
