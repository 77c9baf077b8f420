"""Writing by key into a bucket-indexed merge-on-read table (table.type=MERGE_ON_READ,
lakesink.formats.hudi.table.delta_upsert): deltacommits of inserts, updates and deletes read
back, through lakesink's reader and hudi-rs, as the same dict fold of every version the
copy-on-write tests use; each deltacommit adds one log file per changed group, its stats are
Hudi's delta write stats, its rollback deletes its log files; the table.type key."""

from __future__ import annotations

import io
import itertools
import json
import pickle
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from unit.test_hudi_upsert import (
    CHANGES,
    DATA,
    DELETE,
    INSERT,
    UPDATE,
    _row,
    _time,
    data_rows,
    hudi_rs_rows,
    lakesink_rows,
    rank,
    versions,
)

from lakesink.config import build_config
from lakesink.errors import ConfigError
from lakesink.formats.hudi.audit import hudi_rs_batches
from lakesink.formats.hudi.table.avro_schema import avro_schema_for, with_meta_columns
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.delta_upsert import HudiDeltaTaskTarget, delta_writes
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.log_file import (
    BlockType,
    LogFileName,
    is_log_file_name,
    read_log_file,
)
from lakesink.formats.hudi.table.markers import list_marked_files
from lakesink.formats.hudi.table.merge_on_read import encode_delta_commit
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.table.rollback import rollback
from lakesink.formats.hudi.table.view import FileSystemView
from lakesink.formats.hudi.tables import create_writer_table
from lakesink.formats.task import TaskAttempt
from lakesink.protocol.instant import Action
from lakesink.protocol.mutation import CHANGE_COLUMNS, OPERATION_COLUMN
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import FileWrite, WriteStatus


def _config(version: int, partitioned: bool, ordering: str | None, buckets: int) -> TableConfig:
    return TableConfig(
        "t",
        ("id",),
        ("day",) if partitioned else (),
        version=version,  # type: ignore[arg-type]
        table_type="MERGE_ON_READ",
        ordering_field=ordering,
        bucket_count=buckets,
    )


def write_tasks(table: HudiTable, n: int, rows: pa.Table, tasks: int = 2) -> list[FileWrite]:
    """The tasks of deltacommit `n` as the Spark side runs them: rows split by group id."""
    target = HudiDeltaTaskTarget.for_table(table, _time(n).value, 1 << 20)
    target = pickle.loads(pickle.dumps(target))  # it travels to the executors
    batch = rows.combine_chunks().to_batches()[0] if rows.num_rows else None
    writes: list[FileWrite] = []
    for task in range(tasks):
        writer = target.open(TaskAttempt(task, 1, 0, f"1.{task}.0"))
        if batch is not None:
            part = batch.filter(pc.equal(pc.bit_wise_and(target.group_ids(batch), tasks - 1), task))
            if part.num_rows:
                writer.write(part)
        writes += writer.close()[0]
    return writes


def commit(table: HudiTable, n: int, rows: pa.Table, tasks: int = 2) -> list[FileWrite]:
    """One deltacommit: begun, written by the tasks, published with its delta write stats."""
    inst = table.timeline().begin(Action.DELTA_COMMIT, _time(n))
    writes = write_tasks(table, n, rows, tasks)
    data = pa.schema([f for f in rows.schema if f.name not in CHANGE_COLUMNS])
    schema = avro_schema_for(with_meta_columns(data), "t_record")
    metadata = CommitMetadata("UPSERT", tuple(writes), schema=schema)
    encoded = encode_delta_commit(table.layout, inst, metadata, delta_writes(table, writes))
    table.timeline().publish(inst, metadata, encoded=encoded)
    return writes


def _changes(*rows: dict[str, Any]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=CHANGES)


def _is_log(w: FileWrite) -> bool:
    return is_log_file_name(w.path.rsplit("/", 1)[-1])


def reference_mor(
    batches: Sequence[list[dict[str, Any]]], ordering: str | None
) -> list[dict[str, Any]]:
    """What readers read of the deltacommits: per batch, the fold of the batch's versions over
    what readers read (the rule: `rank`) decides what the writer adds to the log (a winning
    upsert; a winning delete of a key that is there); readers fold every record written (the
    base row first, then the log's records in order) by the ordering value, ties to the later
    record, a delete without an ordering value removing every earlier record. A delete stays in
    the log: a later version ranking below it stays hidden, where copy-on-write forgets it."""
    written: dict[int, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {}
    seq = itertools.count()

    def read(key: int) -> dict[str, Any] | None:
        records = written.get(key, [])
        if not records:
            return None
        top = max(records, key=lambda r: r[0])[1]
        return None if top[OPERATION_COLUMN] == DELETE else top

    for batch in batches:
        for key in dict.fromkeys(v["id"] for v in batch):
            current = read(key)
            best = current
            for version in (v for v in batch if v["id"] == key):
                if best is None or rank(version, ordering) >= rank(best, ordering):
                    best = version
            if best is None or best is current:
                continue
            if best[OPERATION_COLUMN] == DELETE and current is None:
                continue  # a delete of a key readers do not read: nothing written
            value = best[ordering] if ordering is not None else None
            if best[OPERATION_COLUMN] == DELETE and value is None:
                written[key] = [((False, 0, next(seq)), best)]  # Hudi's default: a reset
                continue
            at = (value is not None, value or 0, next(seq))
            written.setdefault(key, []).append((at, best))
    rows = (read(k) for k in written)
    return sorted(({c: r[c] for c in DATA} for r in rows if r is not None), key=lambda r: r["id"])


@pytest.mark.parametrize(
    ("version", "partitioned"), [(6, False), (8, True)], ids=["v6-unpartitioned", "v8-partitioned"]
)
@settings(max_examples=6, deadline=None)
@given(
    batches=st.lists(st.lists(versions, min_size=1, max_size=10), min_size=1, max_size=4),
    ordering=st.sampled_from(["ts", None]),
    buckets=st.integers(1, 3),
)
# a version without an ordering value after a logged delete of value 0: not written, since
# readers differ on how a null ranks (hudi-rs returned the row, lakesink hid it)
@example(
    batches=[[(0, INSERT, None, 0)], [(0, DELETE, 0, 0)], [(0, INSERT, None, 0)]],
    ordering="ts",
    buckets=1,
)
def test_deltacommits_read_back_as_the_fold_of_every_version(
    version: int,
    partitioned: bool,
    batches: list[list[tuple[int, int, int | None, int]]],
    ordering: str | None,
    buckets: int,
) -> None:
    offsets = itertools.count()
    rows = [[_row(k, op, ts, next(offsets), p) for k, op, ts, p in batch] for batch in batches]
    with tempfile.TemporaryDirectory() as tmp:
        table = HudiTable.create(Path(tmp) / "t", _config(version, partitioned, ordering, buckets))
        for n, batch in enumerate(rows, start=1):
            commit(table, n, pa.Table.from_pylist(batch, schema=CHANGES))
            want = reference_mor(rows[:n], ordering)
            assert data_rows(lakesink_rows(table)) == want
            assert hudi_rs_rows(table) == want


@pytest.fixture(params=[6, 8], ids=["v6", "v8"])
def table(request: pytest.FixtureRequest, tmp_path: Path) -> HudiTable:
    return HudiTable.create(tmp_path / "t", _config(request.param, True, "ts", 2))


def test_a_deltacommit_adds_one_log_file_of_the_changes_to_each_touched_group(
    table: HudiTable,
) -> None:
    first = commit(table, 1, _changes(*(_row(k, INSERT, 1, k) for k in range(8))))
    assert first and not any(_is_log(w) for w in first)  # new groups: base files
    writes = commit(
        table, 2, _changes(_row(0, UPDATE, 2, 10), _row(2, DELETE, 2, 11), _row(9, INSERT, 1, 12))
    )
    logs = [w for w in writes if _is_log(w)]
    assert logs and all(w.file_id in {f.file_id for f in first} for w in logs)
    assert sum(w.num_update_writes for w in writes) == 1
    assert sum(w.num_inserts for w in writes) == 1
    assert sum(w.num_deletes for w in writes) == 1
    blocks = [b for w in logs for b in read_log_file(table, w.path)]
    data = pa.concat_tables([b.rows() for b in blocks if b.block_type is BlockType.PARQUET_DATA])
    assert sorted(data.column("id").to_pylist()) == [0, 9]  # the changed rows only
    base = next(f for f in FileSystemView(table).latest_base_files() if f.has_base_file)
    fs, root = table.storage.arrow()
    import pyarrow.parquet as pq

    assert data.schema == pq.read_schema(f"{root}/{base.path}", filesystem=fs)
    (deleted,) = [d for b in blocks if b.block_type is BlockType.DELETE for d in b.deletes()]
    assert (deleted.record_key, deleted.ordering_value) == ("2", 2)  # the delete's own value
    # an incremental read of the deltacommit sees the changed rows
    changed = lakesink_rows(table).filter(
        pc.equal(lakesink_rows(table)["_hoodie_commit_time"], _time(2).value)
    )
    assert sorted(changed.column("id").to_pylist()) == [0, 9]
    # losing versions change nothing: no log file at all
    assert commit(table, 3, _changes(_row(0, UPDATE, 1, 13))) == []


def test_delta_write_stats_name_the_slice_base_file_and_log_files(table: HudiTable) -> None:
    commit(table, 1, _changes(_row(1, INSERT, 1, 0)))
    for n in (2, 3):
        commit(table, n, _changes(_row(1, UPDATE, n, n)))
    timeline = table.timeline()
    (last,) = [i for i in timeline.completed() if i.time == _time(3)]
    assert last.action is Action.DELTA_COMMIT
    raw = table.storage.read(timeline.key_of(last))
    record = json.loads(raw) if table.config.version < 8 else next(fastavro.reader(io.BytesIO(raw)))
    (stat,) = [s for stats in record["partitionToWriteStats"].values() for s in stats]
    base = next(iter(FileSystemView(table).latest_base_files()))
    assert stat["baseFile"] == base.base_file_name
    assert stat["logFiles"] == [p.rsplit("/", 1)[-1] for p in base.log_paths]
    assert len(stat["logFiles"]) == 2 and stat["path"].endswith(stat["logFiles"][-1])
    names = [LogFileName.parse(n) for n in stat["logFiles"]]
    if table.config.version >= 8:
        assert [n.instant_time for n in names] == [_time(2), _time(3)]
    else:  # named by the base instant, the version counting up
        assert [(n.instant_time, n.version) for n in names] == [(_time(1), 1), (_time(1), 2)]
        assert stat["logVersion"] == 2
    assert [r["ts"] for r in data_rows(lakesink_rows(table))] == [3]


def test_rolling_back_a_pending_deltacommit_deletes_its_log_files(table: HudiTable) -> None:
    commit(table, 1, _changes(_row(1, INSERT, 1, 0), _row(2, INSERT, 1, 1)))
    inst = table.timeline().begin(Action.DELTA_COMMIT, _time(2))
    writes = write_tasks(table, 2, _changes(_row(1, UPDATE, 2, 2), _row(2, DELETE, 2, 3)))
    assert writes and all(_is_log(w) for w in writes)
    assert sorted(list_marked_files(table.storage, _time(2).value)) == sorted(
        w.path for w in writes
    )
    (pending,) = table.timeline().inflight_or_requested()
    assert pending.time == inst.time
    rollback(table, pending)
    assert not any(table.storage.exists(w.path) for w in writes)
    assert [r["ts"] for r in data_rows(lakesink_rows(table))] == [1, 1]
    assert [r["ts"] for r in hudi_rs_rows(table)] == [1, 1]


# --- table.type -------------------------------------------------------------------------------

BASE: dict[str, Any] = {
    "kafka.bootstrap.servers": "127.0.0.1:9092",
    "kafka.topics": "orders",
    "value.schema": "id BIGINT NOT NULL, ts BIGINT",
    "table.path": "/tmp/orders",
}


def test_table_type_is_parsed_in_any_case_and_needs_a_write_by_key() -> None:
    keyed = {**BASE, "write.operation": "upsert", "table.record.key.fields": "id"}
    assert build_config(keyed).settings.mutation.table_type == "COPY_ON_WRITE"
    mor = build_config({**keyed, "table.type": "merge_on_read"}).settings.mutation
    assert mor.table_type == "MERGE_ON_READ"
    with pytest.raises(ConfigError, match=r"table.type=MERGE_ON_READ .* write.operation=upsert"):
        build_config({**BASE, "table.type": "MERGE_ON_READ"})
    with pytest.raises(ConfigError, match="COPY_ON_WRITE, MERGE_ON_READ"):
        build_config({**keyed, "table.type": "mor"})


def test_an_existing_table_of_the_other_type_is_refused_naming_both(tmp_path: Path) -> None:
    raw = {
        **BASE,
        "write.operation": "upsert",
        "table.record.key.fields": "id",
        "table.path": str(tmp_path / "t"),
    }
    cow = build_config(raw).settings
    create_writer_table(cow, ())
    mor = build_config({**raw, "table.type": "MERGE_ON_READ"}).settings
    with pytest.raises(ConfigError, match=r"table.type=MERGE_ON_READ.* is COPY_ON_WRITE"):
        create_writer_table(mor, ())
    assert HudiTable.open(tmp_path / "t").config.table_type == "COPY_ON_WRITE"


def test_the_rows_of_a_new_group_and_its_log_agree_with_the_copy_on_write_fold() -> None:
    """The same batches into a copy-on-write and a merge-on-read table read the same rows."""
    from unit.test_hudi_upsert import _config as cow_config
    from unit.test_hudi_upsert import commit as cow_commit

    batches = [
        [_row(k, INSERT, 1, k) for k in range(6)],
        [_row(1, UPDATE, 3, 10), _row(2, DELETE, 1, 11), _row(3, UPDATE, 0, 12)],
        [_row(2, INSERT, 2, 13), _row(1, DELETE, 4, 14), _row(4, UPDATE, 1, 15, 1)],
    ]
    with tempfile.TemporaryDirectory() as tmp:
        cow = HudiTable.create(Path(tmp) / "cow", cow_config(8, True, "ts", 2))
        mor = HudiTable.create(Path(tmp) / "mor", _config(8, True, "ts", 2))
        for n, batch in enumerate(batches, start=1):
            cow_commit(cow, n, _changes(*batch))
            commit(mor, n, _changes(*batch))
            assert data_rows(lakesink_rows(mor)) == data_rows(lakesink_rows(cow))
            assert hudi_rs_rows(mor) == hudi_rs_rows(cow)
        assert [r["id"] for r in hudi_rs_rows(mor)] == [0, 2, 3, 4, 5]
        assert [n for n in lakesink_rows(mor).column_names if not n.startswith("_hoodie")] == DATA


# --- through the plugin's coordinator: deltacommits, a crash, recovery ----------------------


def _writer(tmp_path: Path) -> Any:
    return build_config(
        {
            **BASE,
            "table.path": str(tmp_path / "t"),
            "write.operation": "upsert",
            "table.record.key.fields": "id",
            "table.ordering.field": "ts",
            "table.type": "MERGE_ON_READ",
            "table.bucket.count": 2,
            "writer.id": "w",
            "lock.provider": "filesystem",
            "lock.lease.s": 5,
            "heartbeat.interval.s": 0.2,
            "heartbeat.tolerance.s": 1.5,
        }
    ).settings


def _batch(plugin: Any, coord: Any, batch_id: int, versions: list[tuple[int, int]]) -> Any:
    """Begin batch `batch_id` of (key, ts) upserts at the next offsets of partition 0 and
    write its files as a task does; (instant, ranges, statuses)."""
    tp = TopicPartition("orders", 0)
    start = coord.committed.get(tp) or 0
    rng = OffsetRange(tp, start, start + len(versions))
    t = coord.begin_batch(batch_id, [rng])
    rows = pa.table(
        {
            "id": pa.array([k for k, _ in versions], pa.int64()),
            "ts": pa.array([ts for _, ts in versions], pa.int64()),
            "kafka_topic": pa.array(["orders"] * len(versions)),
            "kafka_partition": pa.array([0] * len(versions), pa.int32()),
            "kafka_offset": pa.array(range(start, rng.end), pa.int64()),
        }
    )
    writer = plugin.task_target(coord, t.value, 1 << 20).open(TaskAttempt(0, 1, 0, "1.0.0"))
    writer.write(rows.to_batches()[0])
    files, _ = writer.close()
    status = WriteStatus(t.value, "1.0.0", rng, tuple(files), rows.num_rows, rows.num_rows)
    return t, [rng], [status], plugin.commit_schema(rows.schema, coord.table.config.name)


def _ts_by_key(table: HudiTable) -> dict[int, int]:
    return {r["id"]: r["ts"] for r in TableReader(table).snapshot().to_pylist()}


def test_a_crashed_deltacommit_is_rolled_back_at_restart_and_its_batch_written_again(
    tmp_path: Path,
) -> None:
    from lakesink.formats.hudi.plugin import PLUGIN

    settings = _writer(tmp_path)
    table = PLUGIN.open_table(settings, partition_fields=(), rows=lambda: pa.schema([]))
    coord = PLUGIN.open_coordinator(settings, table, PLUGIN.writer_control(settings), query_id="q")
    coord.start()
    t, ranges, statuses, schema = _batch(PLUGIN, coord, 0, [(k, 1) for k in range(6)])
    coord.complete_batch(t, 0, ranges, statuses, schema)
    t, ranges, statuses, schema = _batch(PLUGIN, coord, 1, [(1, 2), (2, 0), (3, 5)])
    logs = [f.path for s in statuses for f in s.files]
    assert logs and all(is_log_file_name(p.rsplit("/", 1)[-1]) for p in logs)
    coord.control.stop_heartbeat(table, t)  # the driver dies before the pre-commit
    restarted = PLUGIN.open_coordinator(
        settings, table, PLUGIN.writer_control(settings), query_id="q2"
    )
    restarted.start()  # recovery rolls the deltacommit back: its log files go
    assert not any(table.storage.exists(p) for p in logs)
    assert not table.timeline().inflight_or_requested()
    assert restarted.committed.get(TopicPartition("orders", 0)) == 6  # from the deltacommit
    assert _ts_by_key(table) == dict.fromkeys(range(6), 1)
    t, ranges, statuses, schema = _batch(PLUGIN, restarted, 1, [(1, 2), (2, 0), (3, 5)])
    restarted.complete_batch(t, 1, ranges, statuses, schema)
    done = table.timeline().completed()
    actions = [Action.DELTA_COMMIT, Action.ROLLBACK, Action.DELTA_COMMIT]
    assert [i.action for i in done] == actions
    assert _ts_by_key(table) == {**dict.fromkeys(range(6), 1), 1: 2, 3: 5}
    by_hudi_rs = pa.Table.from_batches(hudi_rs_batches(str(table.base_path))).to_pylist()
    assert {r["id"]: r["ts"] for r in by_hudi_rs} == _ts_by_key(table)
