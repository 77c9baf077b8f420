"""DuckDB reads lakesink's Iceberg tables: its iceberg extension (with the avro one it needs),
installed from PyPI and loaded from the package's file with DuckDB's signature check on, scans
exactly the rows pyiceberg's scan returns and lists the same snapshots."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from iceberg_tables import ROWS, Backend, expected, ingest

from lakesink.formats.iceberg.catalog import CatalogSettings
from lakesink.protocol.offsets import OffsetRange, TopicPartition

pytestmark = pytest.mark.integration

P0, P1 = TopicPartition("events", 0), TopicPartition("events", 1)


def _duckdb() -> Any:
    """A DuckDB connection with the iceberg extension loaded from its PyPI package (no
    network: automatic installs are off)."""
    import duckdb

    con = duckdb.connect(
        config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
    )
    for name in ("avro", "iceberg"):
        package = Path(importlib.import_module(f"duckdb_extension_{name}").__file__ or "").parent
        (binary,) = package.glob(f"extensions/v{duckdb.__version__}/{name}.duckdb_extension")
        con.execute(f"LOAD '{binary}'")
    return con


def test_duckdb_scans_the_rows_and_snapshots_pyiceberg_sees(tmp_path: Path) -> None:
    backend = Backend(CatalogSettings(warehouse=str(tmp_path / "wh")))
    table = backend.table("db.events", partition="kafka_partition, day(kafka_timestamp)")
    ingest(table, "wa", [OffsetRange(P0, 0, 6), OffsetRange(P1, 0, 3)])
    ingest(table, "wb", [OffsetRange(TopicPartition("clicks", 0), 0, 4)])
    ingest(table, "wa", [OffsetRange(P0, 6, 8), OffsetRange(P1, 3, 3)])
    metadata = table.pyiceberg.metadata_location.removeprefix("file://")
    con = _duckdb()
    names = ", ".join(f.name for f in ROWS)
    got = con.execute(
        f"SELECT {names} FROM iceberg_scan('{metadata}') "
        "ORDER BY kafka_topic, kafka_partition, kafka_offset"
    ).to_arrow_table()
    mine = table.pyiceberg.scan().to_arrow().select([f.name for f in ROWS])
    order = pa.compute.sort_indices(
        mine, [(c, "ascending") for c in ("kafka_topic", "kafka_partition", "kafka_offset")]
    )
    assert got.to_pylist() == mine.take(order).to_pylist()
    coords = [(r["kafka_topic"], r["kafka_partition"], r["kafka_offset"]) for r in got.to_pylist()]
    assert coords == expected(
        OffsetRange(P0, 0, 8), OffsetRange(P1, 0, 3), OffsetRange(TopicPartition("clicks", 0), 0, 4)
    )
    snapshots = con.execute(
        f"SELECT snapshot_id FROM iceberg_snapshots('{metadata}') ORDER BY sequence_number"
    ).fetchall()
    assert [s for (s,) in snapshots] == [s.snapshot_id for s in table.pyiceberg.snapshots()]
