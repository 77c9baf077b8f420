"""`transform.arrow` on the driver and in a task, without Spark or a broker: the plan (output
schema from an empty batch) and each way a function can be refused at start, with a one-line
ConfigError naming the key; a batch the function fails on, or whose result does not fit the
planned schema, is a RecordError naming the records or the column; the direct path is kept."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lakesink.config import LakesinkConfig, build_config
from lakesink.errors import ConfigError, RecordError
from lakesink.spark.arrow_transform import KEPT_COLUMNS, plan_arrow_transform
from lakesink.spark.direct import uses_direct_path

HERE = "test_arrow_transform_plan"


def _cfg(function: str, **extra: Any) -> LakesinkConfig:
    raw: dict[str, Any] = {
        "kafka.bootstrap.servers": "127.0.0.1:9",
        "kafka.topics": "t",
        "value.format": "json",
        "value.schema": "id BIGINT NOT NULL, at TIMESTAMP, name STRING, tags ARRAY<STRING>",
        "table.path": "/tmp/lakesink-unit-arrow",
        "transform.arrow": f"{HERE}:{function}",
    }
    raw.update({k.replace("__", "."): v for k, v in extra.items()})
    return build_config(raw)


def shout(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Keeps rows with a name, adds `loud` (the name upper-cased), drops `tags`."""
    kept = batch.filter(pc.is_valid(batch.column("name")))
    kept = kept.drop_columns(["tags"])
    return kept.append_column("loud", pc.utf8_upper(kept.column("name")))


def as_table(batch: pa.RecordBatch) -> pa.Table:
    return pa.Table.from_batches([batch]).append_column(
        "n", pa.array(range(batch.num_rows), pa.int16())
    )


def as_list(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    return batch.to_pylist()


def first_row(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.slice(0, 1).append_column("first", pa.array([batch.column("id")[0].as_py()]))


def without_offsets(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.drop_columns(["kafka_offset"])


def offsets_as_text(batch: pa.RecordBatch) -> pa.RecordBatch:
    at = batch.schema.get_field_index("kafka_offset")
    return batch.set_column(at, "kafka_offset", pc.cast(batch.column(at), pa.string()))


def unsigned(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("u", pa.array([1] * batch.num_rows, pa.uint64()))


def twice(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("name", batch.column("name"))


def refuse_x(batch: pa.RecordBatch) -> pa.RecordBatch:
    if "x" in batch.column("name").to_pylist():
        raise ValueError("no x here")
    return batch


def names_as_numbers(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Keeps `name` as a string for an empty batch, then returns a struct in its place."""
    if not batch.num_rows:
        return batch
    at = batch.schema.get_field_index("name")
    mangled = pa.StructArray.from_arrays([batch.column(at)], names=["v"])
    return batch.set_column(at, "name", mangled)


def adds_a_column_later(batch: pa.RecordBatch) -> pa.RecordBatch:
    if not batch.num_rows:
        return batch
    return batch.append_column("late", pa.array([1] * batch.num_rows))


NOT_A_FUNCTION = 42


def _rows(n: int, names: list[str | None]) -> pa.RecordBatch:
    """Decoded records as the reader gives them (declared types, its own list field name)."""
    return pa.RecordBatch.from_pydict(
        {
            "kafka_topic": pa.array(["t"] * n),
            "kafka_partition": pa.array([0] * n, pa.int32()),
            "kafka_offset": pa.array(range(10, 10 + n), pa.int64()),
            "kafka_timestamp": pa.array([1_000] * n, pa.timestamp("us", tz="UTC")),
            "kafka_key": pa.array([None] * n, pa.binary()),
            "kafka_headers": pa.array(
                [None] * n,
                pa.list_(
                    pa.struct(
                        [pa.field("key", pa.string(), nullable=False), ("value", pa.binary())]
                    )
                ),
            ),
            "id": pa.array(range(n), pa.int64()),
            "at": pa.array([2_000] * n, pa.timestamp("us", tz="UTC")),
            "name": pa.array(names),
            "tags": pa.array([["a"]] * n, pa.list_(pa.string())),
        }
    )


def test_plan_gives_the_functions_output_for_an_empty_batch_in_sparks_arrow_form() -> None:
    planned = plan_arrow_transform(_cfg("shout"))
    assert planned.output_schema.names[-2:] == ["name", "loud"]
    assert "tags" not in planned.output_schema.names
    assert planned.input_schema.field("tags").type == pa.list_(pa.field("element", pa.string()))
    # value columns are nullable as Spark has them; the Kafka coordinates stay required
    assert planned.input_schema.field("id").nullable
    assert not any(planned.input_schema.field(c).nullable for c in KEPT_COLUMNS)
    out = planned(_rows(3, ["a", None, "c"]))
    assert out.schema == planned.output_schema
    assert out.column("loud").to_pylist() == ["A", "C"]
    assert out.column("kafka_offset").to_pylist() == [10, 12]


def test_a_table_result_is_cast_to_the_planned_types() -> None:
    planned = plan_arrow_transform(_cfg("as_table"))
    assert planned.output_schema.field("n").type == pa.int16()
    out = planned(_rows(2, ["a", "b"]))
    assert out.schema == planned.output_schema and out.column("n").to_pylist() == [0, 1]


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("as_list", r"transform\.arrow=.*:as_list' returned a list; expected 'module:function'"),
        ("first_row", r"fails on an empty batch .*IndexError.*takes an empty batch"),
        ("without_offsets", r"drops or changes the column\(s\) kafka_offset; .*kafka_topic"),
        ("offsets_as_text", r"drops or changes the column\(s\) kafka_offset"),
        ("unsigned", r"returns column 'u' of type uint64, which Spark cannot hold"),
        ("twice", r"returns the column\(s\) name twice"),
        ("NOT_A_FUNCTION", r"is a int, not a function"),
        ("no_such_function", r"cannot be loaded: .*no_such_function.*module:function"),
    ],
)
def test_a_function_that_cannot_serve_is_refused_at_start_naming_the_key(
    function: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        plan_arrow_transform(_cfg(function))
    assert "\n" not in str(caught.value)


def test_unloadable_specs_and_a_second_transformation_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"no_such_module.*cannot be loaded"):
        plan_arrow_transform(_cfg("f").with_overrides({"transform.arrow": "no_such_module:f"}))
    with pytest.raises(ConfigError, match=r"is not 'module:function'"):
        plan_arrow_transform(_cfg("f").with_overrides({"transform.arrow": "just_a_module"}))
    with pytest.raises(ConfigError, match=r"set only one of .*\(set: transform\.sql, transform"):
        _cfg("shout", transform__sql="SELECT * FROM source")


def test_hudi_record_key_columns_must_be_kept_too() -> None:
    with pytest.raises(ConfigError, match=r"drops or changes the column\(s\) tags"):
        plan_arrow_transform(_cfg("shout", table__record__key__fields="kafka_offset,tags"))
    iceberg = _cfg("shout", table__format="iceberg", table__record__key__fields="tags")
    assert "tags" not in plan_arrow_transform(iceberg).output_schema.names


def test_a_function_failing_on_records_refuses_the_batch_naming_them() -> None:
    planned = plan_arrow_transform(_cfg("refuse_x"))
    with pytest.raises(RecordError, match=r"2 records of t:0 \(offsets 10-11\): ValueError: no x"):
        planned(_rows(2, ["a", "x"]))


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("names_as_numbers", r"column 'name' is struct<v: string>, which does not cast safely"),
        ("adds_a_column_later", r"the columns are .*late; expected .*returned for an empty batch"),
    ],
)
def test_a_result_unlike_the_planned_schema_refuses_the_batch_naming_the_column(
    function: str, message: str
) -> None:
    planned = plan_arrow_transform(_cfg(function))
    with pytest.raises(RecordError, match=message):
        planned(_rows(1, ["a"]))


def test_arrow_transform_keeps_the_direct_path_and_its_date_column_is_checked() -> None:
    assert uses_direct_path(_cfg("shout"))
    assert uses_direct_path(_cfg("shout", write__path="direct"))
    assert not uses_direct_path(_cfg("shout", write__path="dataframe"))
    assert uses_direct_path(_cfg("shout", table__partition__date__from="at"))
    # `loud` is a string the function derives: Spark parses it, so the DataFrame path
    assert not uses_direct_path(_cfg("shout", table__partition__date__from="loud"))
    with pytest.raises(ConfigError, match=r"'loud' is a string column"):
        uses_direct_path(_cfg("shout", table__partition__date__from="loud", write__path="direct"))
