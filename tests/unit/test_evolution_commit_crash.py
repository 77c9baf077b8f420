"""A crash between a schema change and its data commit (a run whose registry-pinned columns
evolve the table): at every commit step of the batch that evolves the schema, the table
afterwards has either the evolved schema with that batch's data and offsets, or neither (the
old schema and the offsets before); with the real coordinators and their recovery at the next
start, on a local Hudi table and an Iceberg table in a SQLite catalog."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from property.fakes import World
from property.formats import ROWS, IcebergUnderTest
from unit.test_commit_cost_paths import Died, _statuses, _table

from lakesink.engine import coordinator as coordinator_module
from lakesink.engine.schema import TableSchema
from lakesink.faults import SYNC_CRASH_POINTS
from lakesink.formats import plugin_for
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.coordinator import HudiCoordinator
from lakesink.formats.iceberg.coordinator import IcebergCoordinator
from lakesink.formats.iceberg.format import IcebergFormat
from lakesink.formats.iceberg.schema import parse_partition_spec
from lakesink.formats.iceberg.table import IcebergTable
from lakesink.formats.task import TaskAttempt
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets
from lakesink.protocol.write_status import WriteStatus

OLD = {"type": "record", "name": "r", "fields": [{"name": "x", "type": "long"}]}
NEW = {**OLD, "fields": [*OLD["fields"], {"name": "country", "type": ["null", "string"]}]}
# the points a batch's own begin and commit pass (rollback is recovery's, checked after)
POINTS = [p for p in SYNC_CRASH_POINTS if p != "during-rollback"]


@pytest.mark.parametrize("point", POINTS)
def test_the_evolved_schema_and_its_data_commit_together_or_not_at_all(
    point: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _table(tmp_path)
    old, new = (TableSchema.from_text(json.dumps(s)) for s in (OLD, NEW))
    first = [OffsetRange(TopicPartition("t", 0), 0, 10)]
    writer = HudiCoordinator(table, "w", control=CommitControl())
    writer.start()
    t0 = writer.begin_batch(0, first)
    assert t0 is not None
    writer.complete_batch(t0, 0, first, _statuses(table, t0, first), schema=old)

    second = [OffsetRange(TopicPartition("t", 0), 10, 20)]
    reached: list[str] = []

    def die_at(p: str) -> None:
        reached.append(p)
        if p == point:
            raise Died(p)

    monkeypatch.setattr(coordinator_module, "crash_point", die_at)
    with pytest.raises(Died):
        t1 = writer.begin_batch(1, second)
        assert t1 is not None
        writer.complete_batch(t1, 1, second, _statuses(table, t1, second), schema=new)
    monkeypatch.undo()
    assert point in reached  # the batch did die there

    # the next start recovers: rolls the half-done instant back, or finds it complete
    restarted = HudiCoordinator(table, "w", control=CommitControl())
    restarted.start()
    schema = table.timeline().latest_schema()
    if restarted.committed == WriterOffsets({TopicPartition("t", 0): 20}):
        assert schema == json.dumps(NEW), point  # the data came with its schema
        assert point == "after-publish"
    else:
        assert restarted.committed == WriterOffsets({TopicPartition("t", 0): 10}), point
        assert schema == json.dumps(OLD), point  # neither the schema nor the data
        # the batch is written again and commits both
        t2 = restarted.begin_batch(1, second)
        assert t2 is not None
        restarted.complete_batch(t2, 1, second, _statuses(table, t2, second), schema=new)
        assert table.timeline().latest_schema() == json.dumps(NEW)
        assert restarted.committed == WriterOffsets({TopicPartition("t", 0): 20})


WIDER = pa.schema([*ROWS, pa.field("country", pa.string())])
TP = TopicPartition("t", 0)


def _iceberg_writer(side: IcebergUnderTest, world: World, rows: pa.Schema) -> IcebergCoordinator:
    """A writer process whose run's rows are `rows` (a wider `rows`: the registry's new version
    pinned at its start), started: its recovery done."""
    table = IcebergTable.open(
        side.catalog, side.IDENT, rows, parse_partition_spec("kafka_partition"),
        evolution="add-and-widen",
    )  # fmt: skip
    coordinator = IcebergCoordinator(IcebergFormat(table, clock_ms=world.now_ms), "w", query_id="q")
    coordinator.schema_evolution = "add-and-widen"
    coordinator.start()
    return coordinator


def _iceberg_batch(
    coordinator: IcebergCoordinator, batch_id: int, r: OffsetRange, wide: bool
) -> None:
    t = coordinator.begin_batch(batch_id, [r])
    assert t is not None
    offsets = list(range(r.start, r.end))
    columns: dict[str, pa.Array] = {
        "kafka_topic": pa.array([TP.topic] * r.span, pa.string()),
        "kafka_partition": pa.array([TP.partition] * r.span, pa.int32()),
        "kafka_offset": pa.array(offsets, pa.int64()),
        "value": pa.array([f"v{o}" for o in offsets], pa.string()),
    }
    if wide:
        columns["country"] = pa.array(["NO"] * r.span, pa.string())
    rows = pa.table(columns, schema=WIDER if wide else ROWS)
    # written as a Spark task writes: through the plugin's task target of the transaction
    target = plugin_for("iceberg").task_target(coordinator, t.value, 0)
    writer = target.open(TaskAttempt(0, 0, 0, "0.0.0"))
    for batch in rows.to_batches():
        writer.write(batch)
    files, extra = writer.close()
    status = WriteStatus(t.value, "0.0.0", r, tuple(files), r.span, r.span, extra=extra)
    schema = plugin_for("iceberg").commit_schema(rows.schema, "events")
    coordinator.complete_batch(t, batch_id, [r], [status], schema)


def _iceberg_state(side: IcebergUnderTest) -> tuple[bool, WriterOffsets, list[str | None]]:
    """Whether the table's schema has the evolved column, the writer's offsets, its rows."""
    side.table.refresh()
    table = side.table.pyiceberg
    evolved = "country" in [f.name for f in table.schema().fields]
    rows = table.scan().to_arrow().sort_by("kafka_offset")
    country = rows.column("country").to_pylist() if evolved else [None] * rows.num_rows
    return evolved, side.table.committed_offsets("w"), country


@pytest.mark.parametrize("point", POINTS)
def test_an_iceberg_schema_update_and_its_append_land_together_or_not_at_all(
    point: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = World(now_s=1_700_000_000.0)
    side = IcebergUnderTest(tmp_path, world)
    _iceberg_batch(_iceberg_writer(side, world, ROWS), 0, OffsetRange(TP, 0, 3), wide=False)

    reached: list[str] = []

    def die_at(p: str) -> None:
        reached.append(p)
        if p == point:
            raise Died(p)

    evolving = _iceberg_writer(side, world, WIDER)
    monkeypatch.setattr(coordinator_module, "crash_point", die_at)
    with pytest.raises(Died):
        _iceberg_batch(evolving, 1, OffsetRange(TP, 3, 5), wide=True)
    monkeypatch.undo()
    assert point in reached

    restarted = _iceberg_writer(side, world, WIDER)
    evolved, offsets, country = _iceberg_state(side)
    if evolved:
        assert point == "after-publish"
        assert offsets == WriterOffsets({TP: 5}) and country == [None] * 3 + ["NO"] * 2
    else:
        assert (offsets, len(country)) == (WriterOffsets({TP: 3}), 3), point
        _iceberg_batch(restarted, 1, OffsetRange(TP, 3, 5), wide=True)
        assert _iceberg_state(side) == (True, WriterOffsets({TP: 5}), [None] * 3 + ["NO"] * 2)
