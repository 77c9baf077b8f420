"""`spark.read.format("lakesink")` on a Hudi table whose schema evolved: the source's schema is
the latest base files' schemas unified (every footer: two tasks of one commit may have written
in two schemas), and each slice is read in it by column name, as lakesink's reader reads it.
Driven here without a Spark session: the source's schema and one partition's batches."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lakesink.formats import plugin_for
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.coordinator import HudiCoordinator
from lakesink.formats.hudi.table.avro_schema import with_meta_columns
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.files import base_file_name, new_file_id
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.markers import create_marker
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import FileWrite, WriteStatus
from lakesink.spark.table_source import SlicePartition, TableBatchReader

V1 = pa.schema([pa.field("x", pa.int32()), pa.field("addr", pa.struct([("city", pa.string())]))])
# two tasks of the second commit: one resolved the schema before another writer added
# `region`, one after; both widen x and add `country`
V2 = pa.schema([pa.field("x", pa.int64()), V1.field("addr"), pa.field("country", pa.string())])
V2_REGION = V2.insert(2, pa.field("region", pa.string()))


def _file(
    table: HudiTable, t: InstantTime, r: OffsetRange, schema: pa.Schema, rows: list[dict]
) -> WriteStatus:
    fid = new_file_id()
    f = FileWrite("", fid, base_file_name(fid, f"{r.partition.partition}-1-0", t), 1, 1)
    create_marker(table.base_path, t, "", f.path)
    meta = {"_hoodie_commit_time": t.value, "_hoodie_record_key": "", "_hoodie_partition_path": ""}
    data = pa.Table.from_pylist([{**meta, **row} for row in rows], with_meta_columns(schema))
    pq.write_table(data, table.base_path / f.path)
    return WriteStatus(t.value, f"0.{r.partition.partition}.0", r, (f,), len(rows), len(rows))


def _evolved_table(tmp_path: Path) -> HudiTable:
    table = HudiTable.create(tmp_path / "t", TableConfig("t", ("x",), (), version=8))
    writer = HudiCoordinator(table, "w", control=CommitControl())
    writer.start()
    hudi = plugin_for("hudi")
    first = [OffsetRange(TopicPartition("t", 0), 0, 1)]
    t0 = writer.begin_batch(0, first)
    assert t0 is not None
    old = _file(table, t0, first[0], V1, [{"x": 1, "addr": {"city": "a"}}])
    writer.complete_batch(t0, 0, first, [old], hudi.commit_schema(V1, "t"))
    second = [OffsetRange(TopicPartition("t", p), 0, 1) for p in (1, 2)]
    t1 = writer.begin_batch(1, second)
    assert t1 is not None
    statuses = [
        _file(table, t1, second[0], V2, [{"x": 2**40, "addr": None, "country": "NO"}]),
        _file(table, t1, second[1], V2_REGION, [{"x": 3, "region": "e", "country": "SE"}]),
    ]
    writer.complete_batch(t1, 1, second, statuses, hudi.commit_schema(V2_REGION, "t"))
    return table


def test_the_source_reads_every_slice_in_the_unified_schema_as_lakesinks_reader(
    tmp_path: Path,
) -> None:
    table = _evolved_table(tmp_path)
    hudi = plugin_for("hudi")
    schema = hudi.snapshot_schema(table.storage, None)
    data = [n for n in schema.names if not n.startswith("_hoodie")]
    assert data[:2] == ["x", "addr"] and set(data[2:]) == {"country", "region"}
    assert schema.field("x").type == pa.int64()
    reader = TableBatchReader({"path": str(table.base_path)}, schema)
    read = pa.Table.from_batches(
        [
            b
            for files in hudi.snapshot_slices(table.storage, None)
            for b in reader.read(SlicePartition(files))
        ]
    )
    ours = TableReader(table).snapshot()

    def rows(t: pa.Table) -> list[dict]:
        return sorted(t.select(["x", "addr", "country", "region"]).to_pylist(), key=str)

    assert rows(read) == rows(ours)
    assert {"x": 1, "addr": {"city": "a"}, "country": None, "region": None} in rows(read)
