"""What the writing tasks refuse: strings that are not valid UTF-8 at any nesting depth (no
file of such rows survives; valid rows and slices around a bad row pass), and nulls in columns
declared NOT NULL (the declared nullability is restored otherwise); and a partition known to
exist is not asked for its metadata again."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from lakesink.errors import RecordError
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.writer import PartitionedWriter, check_utf8

BAD = b"\xc3\x28"  # a two-byte lead followed by '(' : what CAST(unhex('C328') AS STRING) gives


def strings(values: list[bytes]) -> pa.Array:
    return pa.array(values, pa.binary()).view(pa.string())


def with_coordinates(**columns: pa.Array) -> pa.Table:
    n = len(next(iter(columns.values())))
    return pa.table(
        {
            "kafka_topic": ["events"] * n,
            "kafka_partition": pa.array([3] * n, pa.int32()),
            "kafka_offset": pa.array(range(100, 100 + n), pa.int64()),
            **columns,
        }
    )


NESTED = {
    "top": (strings([b"a", BAD, b"c"]), "name"),
    "struct": (pa.StructArray.from_arrays([strings([b"a", BAD, b"c"])], ["inner"]), "name.inner"),
    "list": (
        pa.ListArray.from_arrays(pa.array([0, 2, 3, 3], pa.int32()), strings([b"a", b"b", BAD])),
        "name[]",
    ),
    "map value": (
        pa.MapArray.from_arrays(
            pa.array([0, 1, 2, 3], pa.int32()),
            pa.array(["k", "k", "k"]),
            strings([b"a", BAD, b"c"]),
        ),
        "name.value",
    ),
    "map key": (
        pa.MapArray.from_arrays(
            pa.array([0, 1, 2, 3], pa.int32()), strings([b"a", BAD, b"c"]), pa.array(["v"] * 3)
        ),
        "name.key",
    ),
}


@pytest.mark.parametrize("case", sorted(NESTED))
def test_invalid_utf8_at_any_depth_is_refused_naming_column_and_record(case: str) -> None:
    column, path = NESTED[case]
    rows = with_coordinates(name=column)
    with pytest.raises(RecordError) as caught:
        check_utf8(rows, "the batch")
    message = str(caught.value)
    assert f"string column {path!r}" in message
    assert "events:3 offset 101" in message  # every case has its bad value in row 1


@pytest.mark.parametrize("case", sorted(NESTED))
def test_a_slice_without_the_bad_row_passes(case: str) -> None:
    column, _ = NESTED[case]
    rows = with_coordinates(name=column)
    check_utf8(rows.slice(0, 1), "the batch")
    check_utf8(rows.slice(2), "the batch")


def test_writer_refuses_the_rows_and_its_abort_leaves_no_base_file(tmp_path: Path) -> None:
    table = HudiTable.create(tmp_path / "t", TableConfig("t", ("kafka_offset",), ()))
    writer = PartitionedWriter(table, "20240101000000001", "0-1-0")
    writer.write(with_coordinates(name=strings([b"fine", b"also fine"])))
    with pytest.raises(RecordError, match="not valid UTF-8"):
        writer.write(with_coordinates(name=strings([b"ok", BAD])))
    writer.abort()  # what a failed task does: its files go, the instant is rolled back
    assert not list((tmp_path / "t").rglob("*.parquet"))


def test_valid_non_ascii_strings_pass() -> None:
    check_utf8(with_coordinates(name=pa.array(["é", "日本", "😀", ""])), "the batch")


def test_required_columns_become_non_nullable_when_they_hold_no_null() -> None:
    from lakesink.spark.task_writer import with_required

    rows = with_coordinates(id=pa.array([1, 2, 3], pa.int64()), note=pa.array(["a", None, "c"]))
    batch = with_required(rows.to_batches()[0], ("id",))
    assert not batch.schema.field("id").nullable
    assert batch.schema.field("note").nullable
    assert batch.column(batch.schema.get_field_index("id")).to_pylist() == [1, 2, 3]


def test_a_null_in_a_required_column_is_refused_naming_column_and_record() -> None:
    from lakesink.spark.task_writer import with_required

    rows = with_coordinates(id=pa.array([1, None, 3], pa.int64()))
    with pytest.raises(RecordError, match=r"column 'id' is declared NOT NULL.*events:3 offset 101"):
        with_required(rows.to_batches()[0], ("id",))


@pytest.mark.parametrize("known", [False, True])
def test_a_partition_known_to_exist_is_not_asked_for_its_metadata_again(
    tmp_path: Path, known: bool
) -> None:
    table = HudiTable.create(tmp_path / "t", TableConfig("t", ("kafka_offset",), ()))
    writer = PartitionedWriter(
        table,
        "20240101000000001",
        "0-1-0",
        known_partitions=frozenset({""}) if known else frozenset(),
    )
    writer.write(with_coordinates(name=strings([b"a", b"b"])))
    assert [f.num_writes for f in writer.close()] == [2]
    # known: a completed commit wrote into it, so its file exists and is not looked for
    assert (tmp_path / "t" / ".hoodie_partition_metadata").exists() is not known
