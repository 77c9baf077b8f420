"""Iceberg schema evolution through lakesink's format layer on a SQLite catalog: the schema
update and the batch's append land in one catalog commit, or neither does; the tasks' files
carry the new field ids the commit gives; `schema.evolution = off` refuses naming the key."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from iceberg_tables import ROWS, Backend, rows

from lakesink.errors import CommitError, SchemaMismatchError
from lakesink.formats.iceberg.catalog import CatalogSettings
from lakesink.formats.iceberg.datafiles import DataFileDescription, write_data_files
from lakesink.formats.iceberg.evolution import PlannedEvolution
from lakesink.formats.iceberg.table import CommitOutcome, IcebergTable
from lakesink.protocol.offsets import OffsetRange, TopicPartition

pytestmark = pytest.mark.integration

P0 = TopicPartition("events", 0)
WIDER = pa.schema([*ROWS, pa.field("country", pa.string())])


def _wider_rows(start: int, end: int) -> pa.Table:
    base = rows(P0, start, end)
    return base.append_column(WIDER.field("country"), pa.array(["NO"] * base.num_rows))


def _write(
    table: IcebergTable, plan: PlannedEvolution | None, t: pa.Table
) -> list[DataFileDescription]:
    return write_data_files(table.write_context(plan), t, attempt_id=uuid.uuid4().hex)


def _append(
    table: IcebergTable,
    files: list[DataFileDescription],
    r: OffsetRange,
    plan: PlannedEvolution | None,
) -> CommitOutcome:
    requirement = table.begin("w1", [r]).requirement
    schema = plan.schema if plan is not None else None
    return table.commit_append(files, requirement, None, schema=schema).outcome


@pytest.fixture
def table(tmp_path: Path) -> IcebergTable:
    backend = Backend(CatalogSettings(warehouse=str(tmp_path / "wh")))
    t = backend.table("db.events")
    assert _append(t, _write(t, None, rows(P0, 0, 3)), OffsetRange(P0, 0, 3), None) is (
        CommitOutcome.COMMITTED
    )
    return t


def test_schema_update_and_append_land_in_one_commit_with_the_planned_field_ids(
    table: IcebergTable,
) -> None:
    before = table.pyiceberg.schema()
    plan = table.plan_evolution(WIDER, "add-and-widen")
    assert plan is not None and plan.changes == ("add country (string)",)
    files = _write(table, plan, _wider_rows(3, 5))
    table.refresh()
    assert table.pyiceberg.schema() == before  # written, not committed: the table unchanged
    assert _append(table, files, OffsetRange(P0, 3, 5), plan) is CommitOutcome.COMMITTED
    meta = table.pyiceberg.metadata
    assert (
        meta.schema().find_field("country").field_id == plan.schema.find_field("country").field_id
    )
    assert meta.current_snapshot().schema_id == meta.current_schema_id != before.schema_id
    got = table.pyiceberg.scan().to_arrow().sort_by("kafka_offset")
    assert got.column("country").to_pylist() == [None, None, None, "NO", "NO"]
    # the evolved table takes the next batch of the same rows as it is
    assert table.plan_evolution(WIDER, "add-and-widen") is None


def test_a_schema_moved_by_another_writer_refuses_both_schema_and_append(
    table: IcebergTable,
) -> None:
    plan = table.plan_evolution(WIDER, "add-and-widen")
    assert plan is not None
    files = _write(table, plan, _wider_rows(3, 5))
    # another writer adds a column first: "country" would get another field id than the files'
    with table.pyiceberg.update_schema() as update:
        update.add_column("region", plan.schema.find_field("country").field_type)
    snapshots = len(table.pyiceberg.metadata.snapshots)
    with pytest.raises(CommitError, match="schema changed while the batch was written"):
        _append(table, files, OffsetRange(P0, 3, 5), plan)
    table.refresh()
    assert table.pyiceberg.schema().find_column_name(
        plan.schema.find_field("country").field_id
    ) == ("region")  # our schema did not land
    assert len(table.pyiceberg.metadata.snapshots) == snapshots  # nor our append


def test_evolution_off_refuses_wider_rows_at_open_naming_the_key(
    table: IcebergTable, tmp_path: Path
) -> None:
    catalog = Backend(CatalogSettings(warehouse=str(tmp_path / "wh"))).catalog()
    with pytest.raises(SchemaMismatchError, match=r"'country'.*schema\.evolution is off"):
        IcebergTable.open(catalog, "db.events", WIDER, evolution="off")
    opened = IcebergTable.open(catalog, "db.events", WIDER, evolution="add-and-widen")
    assert opened.rows == WIDER
    # a type change no widening makes is refused even so, naming the column
    narrowed = pa.schema([f.with_type(pa.string()) if f.name == "amount" else f for f in ROWS])
    with pytest.raises(SchemaMismatchError, match="'amount'"):
        IcebergTable.open(catalog, "db.events", narrowed, evolution="add-and-widen")
