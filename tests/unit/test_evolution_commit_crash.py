"""A crash between a schema change and its data commit (a run whose registry-pinned columns
evolve the table): at every commit step of the batch that evolves the schema, the table
afterwards has either the evolved schema with that batch's data and offsets, or neither (the
old schema and the offsets before); with the real coordinators and their recovery at the next
start, on a local Hudi table and an Iceberg table in a SQLite catalog. And a crash after a run
noted a new writer schema id in its checkpoint, before the restart's evolving commit: the next
process reads the batch again and evolves the table once."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
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
from lakesink.formats.hudi.table.avro_schema import with_meta_columns
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.files import base_file_name, new_file_id
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.markers import create_marker
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.iceberg.catalog import CatalogSettings, open_catalog
from lakesink.formats.iceberg.coordinator import IcebergCoordinator
from lakesink.formats.iceberg.format import IcebergFormat
from lakesink.formats.iceberg.schema import parse_partition_spec
from lakesink.formats.iceberg.table import IcebergTable
from lakesink.formats.task import TaskAttempt
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets
from lakesink.protocol.write_status import FileWrite, WriteStatus

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


# --- a crash between noting a new writer schema id and the commit that evolves the table -------

REGISTRY_V1 = {
    "type": "record",
    "name": "Customer",
    "fields": [{"name": "id", "type": "long"}, {"name": "visits", "type": "int"}],
}
REGISTRY_V2 = {
    **REGISTRY_V1,
    "fields": [
        *REGISTRY_V1["fields"],
        {"name": "country", "type": ["null", "string"], "default": None},
    ],
}
KAFKA_COLUMNS = [
    pa.field("kafka_topic", pa.string()),
    pa.field("kafka_partition", pa.int32()),
    pa.field("kafka_offset", pa.int64()),
]


class _Side:
    """A table of one format, as the writer processes of the test see it."""

    def __init__(self, fmt: str, tmp_path: Path) -> None:
        self.fmt = fmt
        self.world = World(now_s=1_700_000_000.0)
        if fmt == "hudi":
            self.hudi = HudiTable.create(tmp_path / "t", TableConfig("t", ("id",), (), version=8))
        else:
            self.catalog = open_catalog(CatalogSettings(warehouse=str(tmp_path / "warehouse")))

    def writer(self, rows: pa.Schema) -> Any:
        """A writer process's coordinator over a run's rows, started (its recovery done)."""
        if self.fmt == "hudi":
            hudi = HudiCoordinator(self.hudi, "w", control=CommitControl())
            hudi.schema_evolution = "add-and-widen"
            hudi.start()
            return hudi
        table = IcebergTable.open(
            self.catalog, ("reg", "customers"), rows, parse_partition_spec("kafka_partition"),
            evolution="add-and-widen",
        )  # fmt: skip
        iceberg = IcebergCoordinator(
            IcebergFormat(table, clock_ms=self.world.now_ms), "w", query_id="q"
        )
        iceberg.schema_evolution = "add-and-widen"
        iceberg.start()
        return iceberg

    def write(self, coordinator: Any, t: Any, r: OffsetRange, rows: pa.Table) -> WriteStatus:
        """The batch's one task: `rows` in a data file of the batch's instant."""
        if self.fmt == "hudi":
            fid = new_file_id()
            f = FileWrite("", fid, base_file_name(fid, "0-1-0", t), rows.num_rows, 1)
            create_marker(self.hudi.base_path, t, "", f.path)
            meta = pa.table(
                {
                    "_hoodie_commit_time": [t.value] * rows.num_rows,
                    "_hoodie_record_key": [str(i) for i in rows.column("id").to_pylist()],
                    "_hoodie_partition_path": [""] * rows.num_rows,
                }
            )
            data = pa.Table.from_pylist(
                [{**m, **row} for m, row in zip(meta.to_pylist(), rows.to_pylist(), strict=True)],
                with_meta_columns(rows.schema),
            )
            pq.write_table(data, self.hudi.base_path / f.path)
            return WriteStatus(t.value, "0.0.0", r, (f,), rows.num_rows, rows.num_rows)
        writer = plugin_for("iceberg").task_target(coordinator, t.value, 0)
        attempt = writer.open(TaskAttempt(0, 0, 0, "0.0.0"))
        for batch in rows.to_batches():
            attempt.write(batch)
        files, extra = attempt.close()
        return WriteStatus(t.value, "0.0.0", r, tuple(files), r.span, r.span, extra=extra)

    def commit(
        self, coordinator: Any, t: Any, batch_id: int, r: OffsetRange, rows: pa.Table
    ) -> None:
        status = self.write(coordinator, t, r, rows)
        schema = plugin_for(self.fmt).commit_schema(rows.schema, "customers")
        coordinator.complete_batch(t, batch_id, [r], [status], schema)

    def schemas(self) -> list[list[str]]:
        """The columns of each schema the table has had, oldest first."""
        if self.fmt == "hudi":
            timeline = HudiTable.open(self.hudi.base_path).timeline()
            seen: list[list[str]] = []
            for inst in timeline.in_completion_order(timeline.completed_data_instants()):
                schema = timeline.commit_metadata(inst).schema
                names = [f["name"] for f in json.loads(schema.encode())["fields"]] if schema else []
                names = [n for n in names if not n.startswith("_hoodie_")]
                if not seen or seen[-1] != names:
                    seen.append(names)
            return seen
        table = self.catalog.load_table(("reg", "customers"))
        return [[f.name for f in s.fields] for s in table.metadata.schemas]

    def rows(self) -> list[tuple[Any, ...]]:
        if self.fmt == "hudi":
            read = TableReader(HudiTable.open(self.hudi.base_path)).snapshot()
        else:
            read = self.catalog.load_table(("reg", "customers")).scan().to_arrow()
        names = [n for n in ("kafka_offset", "id", "visits", "country") if n in read.column_names]
        return sorted(zip(*(read.column(n).to_pylist() for n in names), strict=True))


def _rows(values: pa.Table, r: OffsetRange) -> pa.Table:
    """A batch's decoded values with the Kafka columns the source adds."""
    kafka = [
        pa.array([r.partition.topic] * r.span, pa.string()),
        pa.array([r.partition.partition] * r.span, pa.int32()),
        pa.array(range(r.start, r.end), pa.int64()),
    ]
    return pa.table([*kafka, *values.columns], schema=pa.schema([*KAFKA_COLUMNS, *values.schema]))


@pytest.mark.parametrize("fmt", ["hudi", "iceberg"])
def test_a_crash_after_noting_a_new_writer_schema_reads_the_batch_again_and_evolves_once(
    fmt: str, tmp_path: Path
) -> None:
    """A batch whose values carry a writer schema the run's columns lack fails; the ingestion
    notes the id in the checkpoint (lakesink-registry-writer-ids.json) and the process dies
    before the restart's evolving commit (its instant begun, nothing committed). The next
    process pins the columns again with the noted id, reads the batch again from the same
    offsets and commits it with the evolved schema, once: a third start changes nothing."""
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from lakesink.config import build_config
    from lakesink.errors import SchemaEvolutionError
    from lakesink.kafka.ddl import ddl_to_arrow
    from lakesink.kafka.registry import RegistrySettings, registry_client
    from lakesink.spark.registry_columns import (
        note_writer_schema,
        noted_writer_ids,
        pin_registry_columns,
    )
    from lakesink.spark.source import value_deserializer

    url = f"mock://{uuid.uuid4().hex}"
    client = registry_client(RegistrySettings(url=url, retry_s=1))

    def serialize(schema: dict[str, Any], value: dict[str, Any]) -> bytes:
        out = AvroSerializer(client, json.dumps(schema))(
            value, SerializationContext("customers", MessageField.VALUE)
        )
        assert out is not None
        return out

    # a producer on a version the subject's latest dropped a field of: only its id, noted in
    # the checkpoint, can evolve a run's columns (the latest version never will)
    older = [serialize(REGISTRY_V2, {"id": i, "visits": i, "country": "SE"}) for i in (3, 4)]
    client.register_schema("customers-value", Schema(json.dumps(REGISTRY_V1), "AVRO"))
    current = [serialize(REGISTRY_V1, {"id": i, "visits": i}) for i in range(3)]
    log = [*current, *older, serialize(REGISTRY_V1, {"id": 5, "visits": 5})]  # offsets 0..5
    cfg = build_config(
        {
            "kafka.bootstrap.servers": "localhost:9092",
            "kafka.topics": "customers",
            "table.path": str(tmp_path / "t"),
            "value.format": "avro",
            "schema.registry.url": url,
            "schema.registry.retry.s": 1,
            "checkpoint.location": str(tmp_path / "checkpoint"),
        }
    )
    tp = TopicPartition("customers", 0)
    first, second, third = OffsetRange(tp, 0, 3), OffsetRange(tp, 3, 5), OffsetRange(tp, 5, 6)

    def batch(pinned: Any, r: OffsetRange) -> pa.Table:
        decoded = value_deserializer(pinned).decode(log[r.start : r.end])
        assert decoded.failures == {}
        return _rows(decoded.table, r)

    side = _Side(fmt, tmp_path)
    # process 1: the run's columns from the latest version; batch 0 commits; batch 1 fails
    pinned = pin_registry_columns(cfg, ["customers"])
    assert ddl_to_arrow(pinned["value.schema"]).names == ["id", "visits"]
    rows0 = batch(pinned, first)
    writer = side.writer(rows0.schema)
    t0 = writer.begin_batch(0, [first])
    side.commit(writer, t0, 0, first, rows0)
    t1 = writer.begin_batch(1, [second])
    assert t1 is not None
    with pytest.raises(SchemaEvolutionError, match="field 'country'") as failed:
        batch(pinned, second)
    schema_id = note_writer_schema(cfg, failed.value)
    assert schema_id is not None and noted_writer_ids(cfg) == [schema_id]
    # ... and the process dies here: no restart in it, batch 1's instant left begun
    del writer
    assert side.schemas() == [["kafka_topic", "kafka_partition", "kafka_offset", "id", "visits"]]

    # process 2: the noted id evolves the columns; recovery drops the half-begun batch, which
    # is read again from its offsets and committed with the evolved schema
    again = pin_registry_columns(cfg, ["customers"])
    assert ddl_to_arrow(again["value.schema"]).names == ["id", "visits", "country"]
    rows1 = batch(again, second)
    writer = side.writer(rows1.schema)
    assert writer.committed == WriterOffsets({tp: 3})
    t1 = writer.begin_batch(1, [second])
    assert t1 is not None
    side.commit(writer, t1, 1, second, rows1)
    assert writer.committed == WriterOffsets({tp: 5})
    evolved = ["kafka_topic", "kafka_partition", "kafka_offset", "id", "visits", "country"]
    assert side.schemas() == [evolved[:-1], evolved]
    del writer

    # process 3: the same columns (the id is noted once, not again); its batch changes nothing
    assert note_writer_schema(cfg, failed.value) is None
    assert noted_writer_ids(cfg) == [schema_id]
    last = pin_registry_columns(cfg, ["customers"])
    assert last["value.schema"] == again["value.schema"]
    rows2 = batch(last, third)
    writer = side.writer(rows2.schema)
    t2 = writer.begin_batch(2, [third])
    assert t2 is not None
    side.commit(writer, t2, 2, third, rows2)
    assert side.schemas() == [evolved[:-1], evolved]  # evolved once
    assert side.rows() == [
        (0, 0, 0, None),
        (1, 1, 1, None),
        (2, 2, 2, None),
        (3, 3, 3, "SE"),
        (4, 4, 4, "SE"),
        (5, 5, 5, None),
    ]
