"""Writing by key into an Iceberg table of keys, copy-on-write (lakesink.formats.iceberg.upsert,
keyed): batches of inserts, updates and deletes committed through the Iceberg coordinator read
back with pyiceberg as the plain dict fold of every version under the ordering rule (the
reference of the Hudi upsert tests); a replayed batch changes nothing; a batch whose bucket
another writer or a rewrite changed since it began is refused at commit and, written again,
lands over the other commit; the table's layout (identifier fields, bucket partition field) and
the settings it is created and opened with."""

from __future__ import annotations

import pickle
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hudi_upsert import CHANGES, DATA, DELETE, INSERT, SCHEMA, UPDATE, reference, versions

from lakesink.config import build_config
from lakesink.errors import CommitConflictError, ConfigError
from lakesink.formats import plugin_for
from lakesink.formats.iceberg.catalog import CatalogSettings, open_catalog
from lakesink.formats.iceberg.coordinator import IcebergCoordinator
from lakesink.formats.iceberg.format import IcebergFormat
from lakesink.formats.iceberg.keyed import (
    COPY_ON_WRITE,
    MERGE_ON_READ,
    keyed_partition_fields,
    keyed_properties,
    layout_of,
    required_keys,
)
from lakesink.formats.iceberg.rewrite import RewriteGroup, RewriteOptions, replace_files
from lakesink.formats.iceberg.schema import parse_partition_spec
from lakesink.formats.iceberg.table import IcebergTable
from lakesink.formats.iceberg.upsert import IcebergUpsertTarget
from lakesink.formats.task import KeyedTaskTarget, TaskAttempt
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.mutation import CHANGE_COLUMNS, OPERATION_COLUMN
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import WriteStatus

IDENT = ("shop", "orders")


def open_table(
    warehouse: Path,
    buckets: int,
    ordering: str | None,
    partitioned: bool = False,
    mode: str = COPY_ON_WRITE,
) -> IcebergTable:
    """A table of keys `id` written in `mode`, as lakesink creates one for
    write.operation=upsert."""
    catalog = open_catalog(CatalogSettings(warehouse=str(warehouse)))
    fields = parse_partition_spec("day") if partitioned else ()
    return IcebergTable.open(
        catalog,
        IDENT,
        required_keys(SCHEMA, ("id",)),
        keyed_partition_fields(fields, ("id",), buckets),
        properties=keyed_properties(ordering, mode),
        identifier_fields=("id",),
    )


def reopen(warehouse: Path) -> IcebergTable:
    """The table as another process opens it."""
    return IcebergTable.open(open_catalog(CatalogSettings(warehouse=str(warehouse))), IDENT)


def writer(table: IcebergTable, writer_id: str = "w1") -> IcebergCoordinator:
    coordinator = IcebergCoordinator(IcebergFormat(table), writer_id, query_id="q")
    coordinator.operation_type = "UPSERT"  # as the plugin opens a table of keys
    coordinator.start()
    return coordinator


def ranges_of(rows: pa.Table) -> list[OffsetRange]:
    """The Kafka ranges a batch's rows came from (each partition's offsets are contiguous)."""
    out = []
    for p in sorted(set(rows.column("kafka_partition").to_pylist())):
        mine = rows.filter(pc.equal(rows.column("kafka_partition"), p)).column("kafka_offset")
        lo, hi = pc.min(mine).as_py(), pc.max(mine).as_py()
        out.append(OffsetRange(TopicPartition("orders", p), lo, hi + 1))
    return out


def write(coordinator: IcebergCoordinator, t: InstantTime, rows: pa.Table) -> list[WriteStatus]:
    """The tasks of one batch as the Spark side runs them: rows split by group id over two
    tasks, each writing through the target pickled to it."""
    target = plugin_for("iceberg").task_target(coordinator, t.value, 0)
    assert isinstance(target, KeyedTaskTarget)
    target = pickle.loads(pickle.dumps(target))
    statuses = []
    for task in range(2):
        w = target.open(TaskAttempt(task, 1, 0, f"1.{task}.0"))
        for batch in rows.to_batches():
            mine = batch.filter(pc.equal(pc.bit_wise_and(target.group_ids(batch), 1), task))
            if mine.num_rows:
                w.write(mine)
        files, extra = w.close()
        statuses.append(WriteStatus(t.value, f"1.{task}.0", None, tuple(files), extra=extra))
    return statuses


def commit(coordinator: IcebergCoordinator, batch_id: int, rows: pa.Table) -> None:
    """One batch: begun, written, committed."""
    ranges = ranges_of(rows)
    t = coordinator.begin_batch(batch_id, ranges)
    assert t is not None
    statuses = write(coordinator, t, rows)
    complete(coordinator, t, batch_id, rows, statuses)


def complete(
    coordinator: IcebergCoordinator,
    t: InstantTime,
    batch_id: int,
    rows: pa.Table,
    statuses: Sequence[WriteStatus],
) -> None:
    data = pa.schema([f for f in rows.schema if f.name not in CHANGE_COLUMNS])
    schema = plugin_for("iceberg").commit_schema(data, "orders")
    coordinator.complete_batch(t, batch_id, ranges_of(rows), statuses, schema)


def table_rows(table: IcebergTable) -> list[dict[str, Any]]:
    table.refresh()
    found = table.pyiceberg.scan().to_arrow()
    return sorted(found.select(DATA).to_pylist(), key=lambda r: r["id"])


class Offsets:
    """The next Kafka offset of each partition, so that each batch's ranges are contiguous."""

    def __init__(self) -> None:
        self.next = {0: 0, 1: 0}

    def row(self, key: int, op: int, ts: int | None, partition: int = 0) -> dict[str, Any]:
        offset = self.next[partition]
        self.next[partition] += 1
        return {
            "id": key,
            "day": f"d{key % 2}",
            "ts": ts,
            "v": f"v{partition}.{offset}",
            "kafka_topic": "orders",
            "kafka_partition": partition,
            "kafka_offset": offset,
            OPERATION_COLUMN: op,
        }


def changes(rows: Sequence[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=CHANGES)


@pytest.mark.parametrize("partitioned", [False, True], ids=["unpartitioned", "by-day"])
@settings(max_examples=6, deadline=None)
@given(
    batches=st.lists(st.lists(versions, min_size=1, max_size=10), min_size=1, max_size=3),
    ordering=st.sampled_from(["ts", None]),
    buckets=st.integers(1, 4),
)
def test_batches_read_back_as_the_fold_of_every_version(
    partitioned: bool,
    batches: list[list[tuple[int, int, int | None, int]]],
    ordering: str | None,
    buckets: int,
) -> None:
    offsets = Offsets()
    rows = [[offsets.row(k, op, ts, p) for k, op, ts, p in batch] for batch in batches]
    with tempfile.TemporaryDirectory() as tmp:
        table = open_table(Path(tmp) / "wh", buckets, ordering, partitioned)
        coordinator = writer(table)
        for n, batch in enumerate(rows, start=1):
            commit(coordinator, n, changes(batch))
            assert table_rows(table) == reference(rows[:n], ordering)
        # every data file holds the keys of one bucket, named by its partition value
        layout = layout_of(table.pyiceberg.metadata, table.name)
        assert layout is not None and layout.bucket_count == buckets
        target = IcebergUpsertTarget.for_table(table.pyiceberg, table.write_context(), "0")
        for task in table.pyiceberg.scan().plan_files():
            found = file_rows(task.file.file_path)
            assert found.num_rows == task.file.record_count
            bucket = task.file.partition[layout.bucket_position]
            assert set(target.group_ids(found.to_batches()[0]).to_pylist()) == {bucket}


def file_rows(path: str) -> pa.Table:
    """The rows of one local data file (`file:` locations as pyiceberg writes them)."""
    local = "/" + path.removeprefix("file:").lstrip("/")
    return pq.read_table(local, partitioning=None)  # the file alone (no hive path fields)


def test_a_replayed_batch_changes_nothing(tmp_path: Path) -> None:
    table = open_table(tmp_path / "wh", 2, "ts")
    coordinator = writer(table)
    o = Offsets()
    first = changes([o.row(1, INSERT, 1), o.row(2, INSERT, 1), o.row(3, INSERT, 1)])
    commit(coordinator, 1, first)
    table.refresh()
    snapshot = table.pyiceberg.metadata.current_snapshot_id
    # the same batch again (a restart before the checkpoint): nothing is begun or written
    assert coordinator.begin_batch(1, ranges_of(first)) is None
    again = writer(reopen(tmp_path / "wh"))  # a restarted process
    assert again.begin_batch(1, ranges_of(first)) is None
    table.refresh()
    assert table.pyiceberg.metadata.current_snapshot_id == snapshot
    assert [r["id"] for r in table_rows(table)] == [1, 2, 3]


def _replace_bucket_files(table: IcebergTable) -> None:
    """A maintenance rewrite of every bucket's files (the rows unchanged, new files)."""
    table.refresh()
    t = table.pyiceberg
    groups = [
        RewriteGroup(
            task.file.spec_id,
            tuple(task.file.partition[i] for i in range(len(task.file.partition))),
            (task.file,),
        )
        for task in t.scan().plan_files()
    ]
    replace_files(t, groups, RewriteOptions(1 << 20, 1 << 20), {"lakesink.maintenance": "test"})


@pytest.mark.parametrize("racer", ["another writer", "a rewrite"])
def test_a_bucket_changed_since_the_batch_began_is_refused_then_written_again(
    tmp_path: Path, racer: str
) -> None:
    table = open_table(tmp_path / "wh", 1, "ts")  # one bucket: every batch rewrites it
    o = Offsets()
    ours = writer(table, "w1")
    first = changes([o.row(1, INSERT, 1), o.row(2, INSERT, 1)])
    commit(ours, 1, first)
    # our batch updates key 1 and deletes key 2, read over the first batch's file
    batch = changes([o.row(1, UPDATE, 5), o.row(2, DELETE, 5)])
    t = ours.begin_batch(2, ranges_of(batch))
    assert t is not None
    statuses = write(ours, t, batch)
    # meanwhile the bucket changes under it
    other_rows: list[dict[str, Any]] = []
    if racer == "another writer":
        other = writer(reopen(tmp_path / "wh"), "w2")
        other_rows = [o.row(3, INSERT, 1, partition=1)]
        commit(other, 1, changes(other_rows))
    else:
        _replace_bucket_files(table)
    before = table_rows(table)
    with pytest.raises(CommitConflictError, match="bucket 0 changed since the batch read it"):
        complete(ours, t, 2, batch, statuses)
    ours.abort(t)
    assert table_rows(table) == before  # nothing of ours landed, nothing lost
    # written again (the sink's conflict retry): over the other commit's files, it lands
    commit(ours, 2, batch)
    assert table_rows(table) == reference([first.to_pylist(), other_rows, batch.to_pylist()], "ts")


@pytest.mark.parametrize("mode", [COPY_ON_WRITE, MERGE_ON_READ])
def test_a_batch_plans_the_snapshot_once_while_main_does_not_move(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyiceberg.table import DataScan

    table = open_table(tmp_path / "wh", 2, "ts", mode=mode)
    coordinator = writer(table)
    o = Offsets()
    commit(coordinator, 1, changes([o.row(k, INSERT, 1) for k in range(4)]))
    planned = []
    plan_files = DataScan.plan_files

    def counted(scan: DataScan) -> Any:
        planned.append(scan.table_metadata.current_snapshot_id)
        return plan_files(scan)

    monkeypatch.setattr(DataScan, "plan_files", counted)
    # the tasks' target plans the buckets, the commit checks them on the same snapshot: once
    commit(coordinator, 2, changes([o.row(1, UPDATE, 2), o.row(2, DELETE, 2)]))
    assert len(planned) == 1
    # another commit moved main: the check plans the new snapshot (and finds the bucket changed)
    batch = changes([o.row(3, UPDATE, 3)])
    t = coordinator.begin_batch(3, ranges_of(batch))
    assert t is not None
    statuses = write(coordinator, t, batch)
    _replace_bucket_files(table)
    planned.clear()
    with pytest.raises(CommitConflictError, match="changed since the batch read it"):
        complete(coordinator, t, 3, batch, statuses)
    coordinator.abort(t)
    assert len(planned) == 1 and planned[0] == table.pyiceberg.metadata.current_snapshot_id


@pytest.mark.parametrize("mode", [COPY_ON_WRITE, MERGE_ON_READ])
def test_a_commit_builds_the_staged_metadata_once_per_change(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyiceberg.table

    table = open_table(tmp_path / "wh", 2, "ts", mode=mode)
    coordinator = writer(table)
    o = Offsets()
    commit(coordinator, 1, changes([o.row(k, INSERT, 1) for k in range(4)]))
    built = []
    update = pyiceberg.table.update_table_metadata

    def counted(*args: Any, **kwargs: Any) -> Any:
        built.append(len(args[1]))  # the updates staged so far
        return update(*args, **kwargs)

    monkeypatch.setattr(pyiceberg.table, "update_table_metadata", counted)
    commit(coordinator, 2, changes([o.row(1, UPDATE, 2), o.row(2, DELETE, 2)]))
    # pyiceberg's own transaction deep-copies the whole metadata on every read of it (some
    # twenty per commit, each growing with the snapshots kept); lakesink's once per change
    assert 0 < len(built) == len(set(built)) <= 3, built
    assert [r["id"] for r in table_rows(table)] == [0, 1, 3]


def test_a_delete_of_every_key_leaves_the_bucket_without_files(tmp_path: Path) -> None:
    table = open_table(tmp_path / "wh", 2, None)
    coordinator = writer(table)
    o = Offsets()
    commit(coordinator, 1, changes([o.row(1, INSERT, None), o.row(2, INSERT, None)]))
    commit(coordinator, 2, changes([o.row(1, DELETE, None), o.row(2, DELETE, None)]))
    assert table_rows(table) == []
    assert list(table.pyiceberg.scan().plan_files()) == []
    # deletes of keys never stored write nothing
    commit(coordinator, 3, changes([o.row(7, DELETE, None)]))
    assert list(table.pyiceberg.scan().plan_files()) == []


def _settings(tmp_path: Path, **keys: Any) -> Any:
    """The settings of an upsert writer into the table `orders` of the warehouse (the keys in
    `keys` replace those; a key given None is left out)."""
    raw = {
        "kafka.bootstrap.servers": "127.0.0.1:9092",
        "kafka.topics": "orders",
        "value.schema": "id BIGINT NOT NULL, day STRING, ts BIGINT, v STRING",
        "table.format": "iceberg",
        "table.path": str(tmp_path / "wh"),
        "table.name": "orders",
        "iceberg.partition.spec": "day",
        "write.operation": "upsert",
        "table.record.key.fields": "id",
        "table.ordering.field": "ts",
        "table.bucket.count": 4,
        **keys,
    }
    return build_config({k: v for k, v in raw.items() if v is not None}).settings


def test_the_table_of_keys_is_created_with_its_key_buckets_and_ordering(tmp_path: Path) -> None:
    plugin = plugin_for("iceberg")
    settings = _settings(tmp_path)
    table = plugin.open_table(settings, partition_fields=(), rows=lambda: SCHEMA)
    metadata = table.pyiceberg.metadata
    schema = metadata.schema()
    assert [schema.find_column_name(i) for i in schema.identifier_field_ids] == ["id"]
    assert [str(f.transform) for f in metadata.spec().fields] == ["identity", "bucket[4]"]
    layout = layout_of(metadata, table.name)
    assert layout is not None and (layout.key, layout.ordering) == (("id",), "ts")
    assert plugin.record_key_columns(settings) == ("id",)
    # opened again with the same settings: the same table
    plugin.open_table(settings, partition_fields=(), rows=lambda: SCHEMA)
    # other buckets, or an append writer: refused, naming both
    wider = _settings(tmp_path, **{"table.bucket.count": 8})
    with pytest.raises(ConfigError, match=r"bucket\[8\]\(id\).*bucket\[4\]\(id\)"):
        plugin.open_table(wider, partition_fields=(), rows=lambda: SCHEMA)
    append = _settings(
        tmp_path,
        **{
            "write.operation": "append",
            "table.record.key.fields": None,
            "table.ordering.field": None,
        },
    )
    with pytest.raises(ConfigError, match="is a table of keys"):
        plugin.open_table(append, partition_fields=(), rows=lambda: SCHEMA)
