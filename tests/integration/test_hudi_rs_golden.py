"""The golden tables built by tests/golden/build_golden.py read back in hudi-rs and in
lakesink's reader: six rows, the rolled-back row absent, the clustered partition in one file."""

from __future__ import annotations

from pathlib import Path

import hudi
import pyarrow as pa
import pytest

from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.reader import TableReader

pytestmark = pytest.mark.integration

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


@pytest.mark.parametrize("name", ["cow_v6", "cow_v8"])
def test_golden_table_reads_back_in_hudi_rs(name: str) -> None:
    path = GOLDEN / name
    rs = hudi.HudiTableBuilder.from_base_uri(str(path)).build()
    theirs = pa.Table.from_batches(rs.read()).sort_by("id")
    ours = TableReader(HudiTable.open(path)).snapshot().sort_by("id")
    assert theirs.column("id").to_pylist() == [1, 2, 3, 4, 5, 6]
    assert theirs.to_pylist() == ours.to_pylist()
    day1 = theirs.filter(pa.compute.equal(theirs.column("day"), "2024-01-01"))
    assert set(day1.column("_hoodie_file_name").to_pylist()) == {
        "00000006-aaaa-bbbb-cccc-000000000000-0_0-1-0_20240101000005000.parquet"
    }
    # clustering kept the rows' original commit times
    assert day1.column("_hoodie_commit_time").to_pylist() == [
        "20240101000001000",
        "20240101000001000",
        "20240101000002000",
    ]
    assert rs.table_name == "golden"
    first = (
        hudi.HudiReadOptions()
        .with_query_type(hudi.HudiQueryType.Incremental)
        .with_start_timestamp("20240101000000000")
        .with_end_timestamp("20240101000001500")
    )
    assert sorted(pa.Table.from_batches(rs.read(first)).column("id").to_pylist()) == [1, 2, 3]
