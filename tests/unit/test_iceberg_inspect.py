"""How `lakesink table ...` tells an Iceberg table location, an Iceberg warehouse and anything
else apart, and which metadata file of a table is the newest."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakesink.errors import ConfigError
from lakesink.formats.iceberg.inspection import (
    iceberg_kind,
    newest_metadata,
    refuse_iceberg,
    snapshot_counts,
)
from lakesink.settings import StorageAccess
from lakesink.storage import open_storage


def _table(root: Path, *names: str) -> Path:
    (root / "metadata").mkdir(parents=True)
    for n in names:
        (root / "metadata" / n).write_text("{}")
    return root


def test_newest_metadata_orders_by_version_number_not_by_name(tmp_path: Path) -> None:
    t = _table(tmp_path / "t", "00009-a.metadata.json", "00010-b.metadata.json", "snap-1.avro")
    assert newest_metadata(open_storage(t)) == "metadata/00010-b.metadata.json"
    hinted = _table(tmp_path / "h", "v2.metadata.json", "v11.metadata.json")
    assert newest_metadata(open_storage(hinted)) == "metadata/v11.metadata.json"
    assert newest_metadata(open_storage(tmp_path / "nothing")) is None


def test_iceberg_kind_tells_table_warehouse_hudi_and_object_store_apart(tmp_path: Path) -> None:
    table = _table(tmp_path / "wh" / "ns.db" / "events", "00001-x.metadata.json")
    (tmp_path / "wh" / "catalog.db").write_bytes(b"")
    hudi = tmp_path / "hudi"
    (hudi / ".hoodie").mkdir(parents=True)
    _table(hudi, "00001-x.metadata.json")
    assert iceberg_kind(str(table), StorageAccess()) == "table"
    assert iceberg_kind(f"file://{table}", StorageAccess()) == "table"
    assert iceberg_kind(str(tmp_path / "wh"), StorageAccess()) == "warehouse"
    assert iceberg_kind(str(hudi), StorageAccess()) is None
    assert iceberg_kind(str(tmp_path / "missing"), StorageAccess()) is None
    # object-store locations are read through lakesink's storage: the S3 integration tests


def test_refusal_names_the_command_and_the_iceberg_maintenance_commands() -> None:
    with pytest.raises(
        ConfigError,
        match=r"table clean: not for Iceberg tables; see lakesink "
        r"iceberg expire-snapshots\|rewrite-data-files\|remove-orphan-files",
    ):
        raise refuse_iceberg("table clean")


def test_snapshot_counts_take_the_position_deletes_off_the_rows_and_name_equality_deletes() -> None:
    summary = {
        "total-records": "10",
        "total-data-files": "3",
        "total-files-size": "900",
        "total-delete-files": "2",
        "total-position-deletes": "4",
        "total-equality-deletes": "0",
    }
    assert snapshot_counts(summary) == {
        "records": 6,
        "records_in_files": 10,
        "files": 3,
        "bytes": 900,
        "delete_files": 2,
        "position_deletes": 4,
    }
    # equality deletes (another engine's) remove rows the totals cannot count: named apart
    assert snapshot_counts({**summary, "total-equality-deletes": "1"})["equality_deletes"] == 1
    assert snapshot_counts({})["records"] == 0  # a table without a snapshot
