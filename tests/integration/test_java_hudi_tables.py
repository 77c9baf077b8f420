"""Tables two writers share: lakesink reads a version 8 copy-on-write table that Java Hudi
created and bulk-inserted into (its reader and `lakesink table show`) and appends to it; Java
Hudi appends to tables lakesink wrote and clustered; each time Java Hudi, hudi-rs and lakesink's
reader return the same rows. Tables lakesink cannot keep correct (a newer table version, a
metadata table it does not maintain, another key generator) are refused naming why."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from integration.test_multi_writer import COORDS, commit_one_batch, services_for
from integration.test_multi_writer import rows as kafka_rows
from interop.compare import assert_java_hudi_agrees, rows
from interop.java_hudi import JavaHudi

from lakesink.errors import UnsupportedTableError
from lakesink.formats.hudi.coordinator import HudiCoordinator
from lakesink.formats.hudi.services.clustering import ClusteringOptions, cluster
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.files import write_token
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.table.writer import PartitionedWriter
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import WriteStatus

pytestmark = pytest.mark.integration

WRITE = {
    "hoodie.table.name": "java_trips",
    "hoodie.datasource.write.operation": "bulk_insert",
    "hoodie.datasource.write.table.type": "COPY_ON_WRITE",
    "hoodie.datasource.write.recordkey.field": "id",
    "hoodie.datasource.write.partitionpath.field": "day",
    "hoodie.datasource.write.hive_style_partitioning": "true",
}
V8 = {"hoodie.write.table.version": "8", "hoodie.metadata.enable": "false"}


def _trips(first: int, n: int) -> pa.Table:
    ids = list(range(first, first + n))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "day": pa.array([f"2024-01-0{1 + i % 3}" for i in ids], pa.string()),
            "name": pa.array([None if i % 5 == 0 else f"n{i}" for i in ids], pa.string()),
            "amount": pa.array([i / 4 for i in ids], pa.float64()),
        }
    )


def _append_with_lakesink(path: Path, data: pa.Table, batch_id: int) -> None:
    """One batch committed through lakesink's coordinator, as a streaming writer does."""
    services = services_for(path, "filesystem", None, "lakesink-writer")
    coord = HudiCoordinator(HudiTable.open(path), "lakesink-writer", control=services)
    coord.start()
    tp = TopicPartition("trips", 0)
    start = coord.committed.get(tp) or 0
    rng = OffsetRange(tp, start, start + data.num_rows)
    t = coord.begin_batch(batch_id, [rng])
    assert t is not None
    writer = PartitionedWriter(coord.table, t, write_token(0, 0, 0))
    writer.write(data)
    files = writer.close()
    status = WriteStatus(t.value, f"b{batch_id}", rng, tuple(files), data.num_rows, data.num_rows)
    coord.complete_batch(t, batch_id, [rng], [status], schema=writer.avro_schema or "")


def test_lakesink_reads_and_appends_to_a_version_8_table_java_hudi_wrote(
    java_hudi: JavaHudi, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    path = tmp_path / "java_trips"
    java_hudi.write(_trips(0, 40), path, {**WRITE, **V8}, mode="overwrite")
    java_hudi.write(_trips(40, 20), path, {**WRITE, **V8})
    table = HudiTable.open(path)
    assert table.config.version == 8 and table.config.partition_fields == ("day",)
    ours = TableReader(table).snapshot()
    assert sorted(ours.column("id").to_pylist()) == list(range(60))
    assert rows(ours) == rows(java_hudi.read(path))
    shown = cli(["table", "show", str(path), "--json"])
    assert shown.returncode == 0, shown.stdout[-2000:]
    assert '"java_trips"' in shown.stdout

    _append_with_lakesink(path, _trips(60, 25), 0)
    after = TableReader(HudiTable.open(path)).snapshot()
    assert sorted(after.column("id").to_pylist()) == list(range(85))
    assert_java_hudi_agrees(java_hudi, path)
    # and Java Hudi goes on writing after lakesink's commit
    java_hudi.write(_trips(85, 5), path, {**WRITE, **V8})
    final = TableReader(HudiTable.open(path)).snapshot()
    assert sorted(final.column("id").to_pylist()) == list(range(90))
    assert rows(final) == rows(java_hudi.read(path))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({}, ["table version 9", "metadata table"]),
        ({"hoodie.write.table.version": "8"}, ["metadata table"]),
        (
            {
                **V8,
                "hoodie.datasource.write.keygenerator.class": (
                    "org.apache.hudi.keygen.TimestampBasedKeyGenerator"
                ),
                "hoodie.keygen.timebased.timestamp.type": "SCALAR",
                "hoodie.keygen.timebased.output.dateformat": "yyyy",
                "hoodie.datasource.write.partitionpath.field": "id",
            },
            ["key generator type 'TIMESTAMP'"],
        ),
    ],
    ids=["version-9-default", "version-8-with-metadata-table", "timestamp-key-generator"],
)
def test_java_hudi_tables_lakesink_cannot_keep_are_refused_naming_why(
    java_hudi: JavaHudi, tmp_path: Path, options: dict[str, str], named: list[str]
) -> None:
    path = tmp_path / "java_trips"
    java_hudi.write(_trips(0, 10), path, {**WRITE, **options}, mode="overwrite")
    with pytest.raises(UnsupportedTableError) as err:
        HudiTable.open(path)
    for what in named:
        assert what in str(err.value)


@pytest.mark.parametrize("version", [6, 8])
def test_java_hudi_appends_to_a_table_lakesink_wrote_and_clustered(
    java_hudi: JavaHudi, tmp_path: Path, version: int
) -> None:
    path = tmp_path / "shared"
    cfg = TableConfig("shared", tuple(COORDS), ("kafka_partition",), version=version)  # type: ignore[arg-type]
    table = HudiTable.create(path, cfg)
    services = services_for(path, "filesystem", None, "w-a")
    coord = HudiCoordinator(table, "w-a", control=services)
    coord.start()
    for b in range(4):
        commit_one_batch(coord, "topic-a", b)
    cluster(table, services, ClusteringOptions(min_files=2))
    options = {
        "hoodie.table.name": "shared",
        "hoodie.datasource.write.operation": "bulk_insert",
        "hoodie.datasource.write.recordkey.field": ",".join(COORDS),
        "hoodie.datasource.write.partitionpath.field": "kafka_partition",
        "hoodie.datasource.write.keygenerator.class": "org.apache.hudi.keygen.ComplexKeyGenerator",
        "hoodie.datasource.write.hive_style_partitioning": "true",
        "hoodie.write.table.version": str(version),
        "hoodie.metadata.enable": "false",
    }
    java_hudi.write(kafka_rows("topic-j", 5, 0, 10), path, options)
    commit_one_batch(coord, "topic-a", 4)
    ours = TableReader(HudiTable.open(path)).snapshot()
    assert ours.num_rows == 5 * 20 + 10
    assert sorted(set(ours.column("kafka_topic").to_pylist())) == ["topic-a", "topic-j"]
    assert_java_hudi_agrees(java_hudi, path)
