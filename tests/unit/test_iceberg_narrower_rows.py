"""Rows narrower than an Iceberg table (an int into a long column, a nested field left out)
under `schema.evolution = add-and-widen`: the plan finds no change, and the task widens and
null-fills the rows as it writes them; without it they are refused, naming the column."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakesink.engine.evolution import evolve
from lakesink.errors import SchemaMismatchError
from lakesink.formats.iceberg.datafiles import WriteContext, write_data_files
from lakesink.formats.iceberg.schema import iceberg_schema

TABLE = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("addr", pa.struct([pa.field("city", pa.string()), pa.field("zip", pa.string())])),
    ]
)
NARROW = pa.schema(
    [
        pa.field("id", pa.int32(), nullable=False),
        pa.field("addr", pa.struct([pa.field("city", pa.string())])),
    ]
)


def _context(tmp_path: Path, *, widen_rows: bool) -> WriteContext:
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

    metadata = new_table_metadata(
        iceberg_schema(TABLE),
        UNPARTITIONED_PARTITION_SPEC,
        UNSORTED_SORT_ORDER,
        f"file://{tmp_path}/t",
    )
    return WriteContext("db.t", metadata.model_dump_json(), (), widen_rows=widen_rows)


def _narrow_rows() -> pa.Table:
    return pa.Table.from_pylist([{"id": 1, "addr": {"city": "a"}}, {"id": 2, "addr": None}], NARROW)


def test_narrower_rows_change_nothing_in_the_plan() -> None:
    assert not evolve(TABLE, NARROW, "add-and-widen").changed


def test_add_and_widen_writes_narrower_rows_widened_and_null_filled(tmp_path: Path) -> None:
    files = write_data_files(_context(tmp_path, widen_rows=True), _narrow_rows(), attempt_id="a")
    assert sum(f.record_count for f in files) == 2
    got = pa.concat_tables([pq.read_table(f.path.removeprefix("file://")) for f in files])
    assert got.schema.field("id").type == pa.int64()
    assert got.schema.field("addr").type.get_field_index("zip") >= 0
    assert sorted(got.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "addr": {"city": "a", "zip": None}},
        {"id": 2, "addr": None},
    ]


def test_without_add_and_widen_narrower_rows_are_refused_naming_the_column(
    tmp_path: Path,
) -> None:
    with pytest.raises(SchemaMismatchError, match="'id'"):
        write_data_files(_context(tmp_path, widen_rows=False), _narrow_rows(), attempt_id="a")
