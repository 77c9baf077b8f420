"""Writing by key into a bucket-indexed copy-on-write table (lakesink.formats.hudi.table.upsert):
batches of inserts, updates and deletes committed one after another read back, through
lakesink's reader and hudi-rs, as a plain dict fold of every version under the ordering rule;
the table properties, record keys, write stats and table services of such a table."""

from __future__ import annotations

import itertools
import pickle
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hudi
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakesink.errors import CorruptTableError, RecordError, UnsupportedTableError
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.services.archival import ArchivePolicy, archivable_prefix, archive
from lakesink.formats.hudi.services.clean import RetainPolicy, clean, plan_clean
from lakesink.formats.hudi.services.clustering import ClusteringOptions, schedule_clustering
from lakesink.formats.hudi.table.avro_schema import avro_schema_for, with_meta_columns
from lakesink.formats.hudi.table.bucket import bucket_file_id, bucket_id
from lakesink.formats.hudi.table.config import TableConfig, parse_properties, render_properties
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.table.upsert import HudiUpsertTaskTarget
from lakesink.formats.hudi.table.writer import BaseFileWriter, PartitionedWriter, record_keys
from lakesink.formats.task import KeyedTaskTarget, TaskAttempt
from lakesink.protocol.instant import Action, Instant, InstantTime, State, TimelineLayout
from lakesink.protocol.mutation import (
    CHANGE_COLUMNS,
    OPERATION_COLUMN,
    UNAVAILABLE_COLUMN,
    RowOperation,
)
from lakesink.protocol.write_status import FileWrite, WriteStatus

INSERT, UPDATE, DELETE = (op.code for op in RowOperation)
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("day", pa.string()),
        ("ts", pa.int64()),
        ("v", pa.string()),
        ("kafka_topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
    ]
)
DATA = SCHEMA.names
CHANGES = pa.schema([*SCHEMA, (OPERATION_COLUMN, pa.int8())])


def _time(n: int) -> InstantTime:
    return InstantTime(f"20240101000000{n:03d}")


def _config(version: int, partitioned: bool, ordering: str | None, buckets: int) -> TableConfig:
    return TableConfig(
        "t",
        ("id",),
        ("day",) if partitioned else (),
        version=version,  # type: ignore[arg-type]
        ordering_field=ordering,
        bucket_count=buckets,
    )


def _day(key: int) -> str:
    return f"d{key % 2}"


def _row(key: int, op: int, ts: int | None, offset: int, partition: int = 0) -> dict[str, Any]:
    return {
        "id": key,
        "day": _day(key),
        "ts": ts,
        "v": f"v{offset}",
        "kafka_topic": "orders",
        "kafka_partition": partition,
        "kafka_offset": offset,
        OPERATION_COLUMN: op,
    }


def commit(table: HudiTable, n: int, rows: pa.Table, tasks: int = 2) -> list[FileWrite]:
    """One batch as the Spark side writes it: the rows split by group id over `tasks` tasks."""
    t = _time(n)
    inst = table.timeline().begin(Action.COMMIT, t)
    target = HudiUpsertTaskTarget.for_table(table, t.value, 1 << 20)
    target = pickle.loads(pickle.dumps(target))  # it travels to the executors
    batch = rows.combine_chunks().to_batches()[0] if rows.num_rows else None
    writes: list[FileWrite] = []
    # what the engine records: the rows' schema less the change columns
    data = pa.schema([f for f in rows.schema if f.name not in CHANGE_COLUMNS])
    schema = avro_schema_for(with_meta_columns(data), "t_record")
    for task in range(tasks):
        writer = target.open(TaskAttempt(task, 1, 0, f"1.{task}.0"))
        if batch is not None:
            mine = pc.equal(pc.bit_wise_and(target.group_ids(batch), tasks - 1), task)
            part = batch.filter(mine)
            if part.num_rows:
                writer.write(part)
        files, extra = writer.close()
        writes += files
        assert extra.get("schema", schema) == schema
    table.timeline().publish(inst, CommitMetadata("UPSERT", tuple(writes), schema=schema))
    return writes


def rank(row: dict[str, Any], ordering: str | None) -> tuple[Any, ...]:
    value = row[ordering] if ordering is not None else None
    return (value is not None, value or 0, row["kafka_offset"], row["kafka_partition"])


def reference(
    batches: Sequence[list[dict[str, Any]]], ordering: str | None
) -> list[dict[str, Any]]:
    """Every version folded in Kafka order: per key the highest under the rule wins over the
    stored row; a winning delete removes the key and, at the batch's end, its rank with it."""
    state: dict[int, dict[str, Any]] = {}
    for batch in batches:
        winners: dict[int, dict[str, Any]] = {}
        for version in batch:
            key = version["id"]
            best = winners.get(key, state.get(key))
            if best is None or rank(version, ordering) >= rank(best, ordering):
                winners[key] = version
        for key, winner in winners.items():
            if winner[OPERATION_COLUMN] == DELETE:
                state.pop(key, None)
            else:
                state[key] = {c: winner[c] for c in DATA}
    return sorted(state.values(), key=lambda r: r["id"])


def hudi_rs_rows(table: HudiTable) -> list[dict[str, Any]]:
    batches = hudi.HudiTableBuilder.from_base_uri(str(table.base_path)).build().read()
    if not batches:
        return []
    return sorted(pa.Table.from_batches(batches).select(DATA).to_pylist(), key=lambda r: r["id"])


def lakesink_rows(table: HudiTable) -> pa.Table:
    return TableReader(table).snapshot()


def data_rows(rows: pa.Table) -> list[dict[str, Any]]:
    if rows.num_rows == 0:
        return []
    return sorted(rows.select(DATA).to_pylist(), key=lambda r: r["id"])


versions = st.tuples(
    st.integers(0, 5),  # key
    st.sampled_from([INSERT, UPDATE, DELETE]),
    st.one_of(st.none(), st.integers(0, 3)),  # ordering value
    st.integers(0, 1),  # Kafka partition
)


@pytest.mark.parametrize("version", [6, 8])
@pytest.mark.parametrize("partitioned", [False, True], ids=["unpartitioned", "partitioned"])
@settings(max_examples=12, deadline=None)
@given(
    batches=st.lists(st.lists(versions, min_size=1, max_size=10), min_size=1, max_size=3),
    ordering=st.sampled_from(["ts", None]),
    buckets=st.integers(1, 4),
)
def test_batches_read_back_as_the_fold_of_every_version(
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
            want = reference(rows[:n], ordering)
            ours = lakesink_rows(table)
            assert data_rows(ours) == want
            assert hudi_rs_rows(table) == want
            for row in ours.to_pylist():  # each key in its bucket's one file group
                assert row["_hoodie_record_key"] == str(row["id"])
                bucket = bucket_id(row["_hoodie_record_key"], ("id",), buckets)
                assert row["_hoodie_file_name"].startswith(bucket_file_id(bucket))
                assert row["_hoodie_partition_path"] == (f"day={row['day']}" if partitioned else "")


@pytest.fixture(params=[6, 8], ids=["v6", "v8"])
def table(request: pytest.FixtureRequest, tmp_path: Path) -> HudiTable:
    return HudiTable.create(tmp_path / "t", _config(request.param, True, "ts", 2))


def _changes(*rows: dict[str, Any]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=CHANGES)


def test_unchanged_rows_keep_their_commit_and_an_incremental_read_sees_only_changes(
    table: HudiTable,
) -> None:
    commit(table, 1, _changes(*(_row(k, INSERT, 1, k) for k in range(6))))
    before = {r["id"]: r for r in lakesink_rows(table).to_pylist()}
    writes = commit(table, 2, _changes(_row(0, UPDATE, 2, 10), _row(2, DELETE, 2, 11)))
    after = {r["id"]: r for r in lakesink_rows(table).to_pylist()}
    assert sorted(after) == [0, 1, 3, 4, 5]
    for key in (1, 3, 4, 5):
        meta = ("_hoodie_commit_time", "_hoodie_commit_seqno")
        assert [after[key][m] for m in meta] == [before[key][m] for m in meta]
    assert after[0]["_hoodie_commit_time"] == _time(2).value
    assert after[0]["_hoodie_commit_seqno"].startswith(f"{_time(2).value}_")
    changed = TableReader(table).incremental(_time(1), _time(2), by="requested")
    assert changed.column("id").to_pylist() == [0]
    # the stats of the rewritten groups: one update, one delete, the rest carried over
    assert sum(w.num_update_writes for w in writes) == 1
    assert sum(w.num_deletes for w in writes) == 1
    assert sum(w.num_inserts for w in writes) == 0
    assert all(w.prev_commit == _time(1).value for w in writes)


def test_a_lower_ordering_value_never_overwrites_the_stored_row(table: HudiTable) -> None:
    commit(table, 1, _changes(_row(1, INSERT, 5, 0)))
    commit(table, 2, _changes(_row(1, UPDATE, 4, 1), _row(1, DELETE, None, 2)))
    assert data_rows(lakesink_rows(table)) == [{c: _row(1, INSERT, 5, 0)[c] for c in DATA}]


def test_a_group_whose_rows_are_all_deleted_keeps_an_empty_slice(table: HudiTable) -> None:
    commit(table, 1, _changes(_row(1, INSERT, 1, 0)))
    (write,) = commit(table, 2, _changes(_row(1, DELETE, 2, 1)))
    assert (write.num_writes, write.num_deletes, write.prev_commit) == (0, 1, _time(1).value)
    assert lakesink_rows(table).num_rows == 0
    assert hudi_rs_rows(table) == []
    fs, root = table.storage.arrow()
    import pyarrow.parquet as pq

    assert pq.read_table(f"{root}/{write.path}", filesystem=fs, partitioning=None).num_rows == 0
    # the next insert into the bucket goes into the same file group
    (again,) = commit(table, 3, _changes(_row(1, INSERT, 3, 2)))
    assert again.file_id == write.file_id and again.prev_commit == _time(2).value
    assert data_rows(lakesink_rows(table))[0]["ts"] == 3


def test_deletes_of_keys_never_stored_write_nothing(table: HudiTable) -> None:
    assert commit(table, 1, _changes(_row(1, DELETE, 1, 0))) == []


def test_unavailable_values_keep_the_stored_value(table: HudiTable) -> None:
    commit(table, 1, _changes(_row(1, INSERT, 1, 0)))
    change = {**_row(1, UPDATE, 2, 1), "v": None, UNAVAILABLE_COLUMN: ["v"]}
    schema = CHANGES.append(pa.field(UNAVAILABLE_COLUMN, pa.list_(pa.string())))
    commit(table, 2, pa.Table.from_pylist([change], schema=schema))
    (row,) = lakesink_rows(table).to_pylist()
    assert (row["ts"], row["v"]) == (2, "v0")
    assert UNAVAILABLE_COLUMN not in row and OPERATION_COLUMN not in row


def test_rows_without_an_operation_column_are_upserts(table: HudiTable) -> None:
    commit(table, 1, _changes(_row(1, INSERT, 1, 0)).drop_columns([OPERATION_COLUMN]))
    commit(table, 2, _changes(_row(1, INSERT, 2, 1)).drop_columns([OPERATION_COLUMN]))
    assert [r["ts"] for r in data_rows(lakesink_rows(table))] == [2]


def test_a_null_key_or_missing_kafka_coordinates_name_the_record(table: HudiTable) -> None:
    target = HudiUpsertTaskTarget.for_table(table, _time(1).value, 1 << 20)
    writer = target.open(TaskAttempt(0, 1, 0, "1.0.0"))
    bad = {**_row(1, INSERT, 1, 7), "id": None}
    writer.write(pa.Table.from_pylist([_row(2, INSERT, 1, 6), bad], schema=CHANGES).to_batches()[0])
    with pytest.raises(RecordError, match="orders:0 offset 7 has a null record key"):
        writer.close()
    writer = target.open(TaskAttempt(0, 1, 0, "1.0.0"))
    writer.write(_changes(_row(1, INSERT, 1, 0)).drop_columns(["kafka_offset"]).to_batches()[0])
    with pytest.raises(RecordError, match="kafka_offset"):
        writer.close()


def test_group_ids_are_stable_and_keep_a_bucket_together(table: HudiTable) -> None:
    target = HudiUpsertTaskTarget.for_table(table, _time(1).value, 1 << 20)
    assert isinstance(target, KeyedTaskTarget)
    rows = _changes(*(_row(k, INSERT, 1, k) for k in range(40))).to_batches()[0]
    ids = target.group_ids(rows)
    assert ids.type == pa.int32()
    assert ids == pickle.loads(pickle.dumps(target)).group_ids(rows)
    groups: dict[tuple[str, int], set[int]] = {}
    for key, gid in zip(rows.column("id").to_pylist(), ids.to_pylist(), strict=True):
        groups.setdefault((_day(key), bucket_id(str(key), ("id",), 2)), set()).add(gid)
    assert len(groups) == 4 and all(len(g) == 1 for g in groups.values())
    assert len({next(iter(g)) for g in groups.values()}) == 4


def test_two_writers_creating_one_bucket_write_one_file_id(table: HudiTable) -> None:
    """The per-file-group conflict check then stops the second writer's commit."""
    targets = [HudiUpsertTaskTarget.for_table(table, _time(n).value, 1 << 20) for n in (1, 2)]
    written = []
    for n, target in enumerate(targets):
        writer = target.open(TaskAttempt(0, 1, 0, "1.0.0"))
        writer.write(_changes(_row(1, INSERT, n, n)).to_batches()[0])
        (write,), _ = writer.close()
        written.append(write)
    bucket = bucket_id("1", ("id",), 2)
    assert {w.file_id for w in written} == {bucket_file_id(bucket)}


def test_a_file_group_without_a_bucket_number_is_refused(
    table: HudiTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an append writer's random file id: one starting with 8 digits (2% of them) would read as
    # a bucket's, so this one starts with letters
    from lakesink.formats.hudi.table import files

    monkeypatch.setattr(
        files.uuid, "uuid4", lambda: uuid.UUID("abcdef12-3456-4789-8abc-def012345678")
    )
    t = _time(1)
    inst = table.timeline().begin(Action.COMMIT, t)
    writer = PartitionedWriter(table, t, "0-1-0")
    writer.write(_changes(_row(1, INSERT, 1, 0)).drop_columns([OPERATION_COLUMN]))
    table.timeline().publish(inst, CommitMetadata("INSERT", tuple(writer.close())))
    with pytest.raises(CorruptTableError, match="no bucket number"):
        HudiUpsertTaskTarget.for_table(table, _time(2).value, 1 << 20)


# --- table properties and record keys --------------------------------------------------------


@pytest.mark.parametrize("version", [6, 8])
def test_properties_declare_the_ordering_merge_rule_and_bucket_index(version: int) -> None:
    cfg = _config(version, True, "ts", 16)
    props = cfg.to_properties()
    assert props["hoodie.table.precombine.field"] == "ts"
    assert props["hoodie.compaction.payload.class"] == (
        "org.apache.hudi.common.model.DefaultHoodieRecordPayload"
    )
    assert props["hoodie.index.type"] == "BUCKET"
    assert props["hoodie.bucket.index.num.buckets"] == "16"
    assert props["hoodie.bucket.index.hash.field"] == "id"
    if version == 8:
        assert props["hoodie.record.merge.mode"] == "EVENT_TIME_ORDERING"
        assert props["hoodie.record.merge.strategy.id"] == "eeb8d96f-b1e4-49fd-bbf8-28ac514178e5"
    else:
        assert "hoodie.record.merge.mode" not in props
    assert TableConfig.from_properties(parse_properties(render_properties(props))) == cfg
    # without an ordering field the later write wins
    kafka_order = _config(version, True, None, 16).to_properties()
    assert "hoodie.table.precombine.field" not in kafka_order
    assert kafka_order["hoodie.compaction.payload.class"].endswith("OverwriteWithLatestAvroPayload")
    if version == 8:
        assert kafka_order["hoodie.record.merge.mode"] == "COMMIT_TIME_ORDERING"


def test_an_append_table_keeps_its_properties_and_reads_other_writers_ordering() -> None:
    plain = TableConfig("t", ("id",), ("day",))
    assert not {"hoodie.index.type", "hoodie.record.merge.mode"} & set(plain.to_properties())
    props = plain.to_properties()
    props["hoodie.table.ordering.fields"] = "ts"  # a version-9 name some writers use
    read = TableConfig.from_properties(props)
    assert (read.ordering_field, read.bucket_count) == ("ts", None)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("hoodie.index.bucket.engine", "CONSISTENT_HASHING", "SIMPLE"),
        ("hoodie.bucket.index.hash.field", "day", "not record key fields"),
        ("hoodie.bucket.index.num.buckets", "many", "not a bucket count"),
    ],
)
def test_bucket_indexes_lakesink_cannot_keep_are_refused(
    key: str, value: str, message: str
) -> None:
    props = _config(8, True, "ts", 4).to_properties()
    props[key] = value
    with pytest.raises(UnsupportedTableError, match=message):
        TableConfig.from_properties(props)


def test_record_keys_follow_the_declared_key_generator(tmp_path: Path) -> None:
    """Hudi 1.2.0's ComplexKeyGenerator names the field even for one key field (table versions
    up to 8): lakesink declares it for one key field with two partition fields."""
    rows = pa.table({"id": [1, None], "day": ["a", "b"], "hour": [1, 2]})
    assert record_keys(rows, ("id",)).to_pylist() == ["1", "__null__"]
    assert record_keys(rows, ("id",), named=True).to_pylist() == ["id:1", "id:__null__"]
    cases = {(): False, ("day",): False, ("day", "hour"): True}
    for partitions, named in cases.items():
        cfg = TableConfig("t", ("id",), partitions)
        assert cfg.named_record_keys is named
    table = HudiTable.create(tmp_path / "t", TableConfig("t", ("id",), ("day", "hour")))
    writer = BaseFileWriter(table, "day=a/hour=1", _time(1), "0-1-0")
    writer.write(rows.slice(0, 1))
    (write,) = writer.close()
    fs, root = table.storage.arrow()
    import pyarrow.parquet as pq

    written = pq.read_table(f"{root}/{write.path}", filesystem=fs, partitioning=None)
    assert written.column("_hoodie_record_key").to_pylist() == ["id:1"]


def test_write_counts_travel_in_statuses_and_commit_metadata() -> None:
    write = FileWrite("p", "f", "p/f_0-1-0_20240101000000001.parquet", 5, 100, "x", 1, 100, 3, 2)
    status = WriteStatus("20240101000000001", "a", files=(write,))
    assert WriteStatus.from_json(status.to_json()) == status
    old = status.to_json()
    for f in old["files"]:  # a status of an older release
        del f["num_update_writes"], f["num_deletes"]
    assert WriteStatus.from_json(old).files[0].num_deletes == 0
    md = CommitMetadata("UPSERT", (write,))
    for layout in TimelineLayout:
        stat = md.to_dict(layout)["partitionToWriteStats"]["p"][0]
        assert (stat["numUpdateWrites"], stat["numDeletes"]) == (3, 2)
        back = CommitMetadata.from_bytes(md.to_bytes(layout), layout)
        assert back.writes == (write,) and back.operation_type == "UPSERT"


# --- table services ---------------------------------------------------------------------------


def test_clustering_never_plans_a_bucket_table(table: HudiTable) -> None:
    for n in range(1, 4):
        commit(table, n, _changes(*(_row(k + 10 * n, INSERT, 1, k + 10 * n) for k in range(4))))
    assert schedule_clustering(table, CommitControl(), ClusteringOptions(min_files=1)) is None


def test_clean_deletes_superseded_slices_and_archival_waits_for_it(table: HudiTable) -> None:
    for n in range(1, 7):  # every commit rewrites the file groups of both keys
        commit(table, n, _changes(_row(1, UPDATE, n, 2 * n), _row(2, UPDATE, n, 2 * n + 1)))
    want = data_rows(lakesink_rows(table))
    slices = {
        w.path
        for i in table.timeline().completed_data_instants()
        for w in table.timeline().commit_metadata(i).writes
    }
    control = CommitControl()
    policy = ArchivePolicy(min_instants=2, max_instants=3)
    # superseded slices on storage: archival keeps every instant that superseded one active
    assert [i.time for i in archive(table, control, policy).archived] == [_time(1)]
    result = clean(table, control, RetainPolicy(commits=2))
    deleted = set(result.deleted)
    assert deleted and deleted < slices
    assert all(not table.storage.exists(p) for p in deleted)
    assert archive(table, control, policy).archived
    assert data_rows(lakesink_rows(table)) == want == hudi_rs_rows(table)
    commit(table, 7, _changes(_row(1, DELETE, 9, 20)))
    assert [r["id"] for r in data_rows(lakesink_rows(table))] == [2]
    assert [r["id"] for r in hudi_rs_rows(table)] == [2]


def _slice_commit(n: int, *groups: str) -> tuple[Instant, CommitMetadata]:
    t = _time(n)
    writes = tuple(
        FileWrite("p", g, f"p/{g}_0-1-0_{t.value}.parquet", 1, 10, "null", 1, 10) for g in groups
    )
    return Instant(t, Action.COMMIT, State.COMPLETED, t), CommitMetadata("UPSERT", writes)


def test_clean_plans_the_slices_no_retained_view_reads() -> None:
    a, b = bucket_file_id(0), bucket_file_id(1)
    commits = [_slice_commit(1, a, b), _slice_commit(2, a), _slice_commit(3, a, b)]
    instants = [i for i, _ in commits]
    files = [w.path for _, md in commits for w in md.writes]
    plan = plan_clean(commits, instants, files, RetainPolicy(commits=1), 0)
    # as of 3 only the slices of 3 are read; 1's and 2's are superseded
    assert plan.replaced == tuple(sorted(files[:3]))
    plan = plan_clean(commits, instants, files, RetainPolicy(commits=2), 0)
    assert plan.replaced == (files[0],)  # the view as of 2 reads a@2 and b@1


def test_archival_of_several_slices_per_group_leaves_the_latest_live() -> None:
    a = bucket_file_id(0)
    commits = [_slice_commit(n, a) for n in range(1, 6)]
    on_storage = {w.path: i.time for i, md in commits for w in md.writes}
    policy = ArchivePolicy(min_instants=1, max_instants=2)
    # the superseded slices of 2..4 on storage: only 1 may go (its slice stays live)
    choice = archivable_prefix(commits, (), (), on_storage, policy)
    assert choice.count == 1 and "superseded" in choice.held_back_by
    latest = commits[-1][1].writes[0].path
    cleaned = {p: t for p, t in on_storage.items() if p >= commits[3][1].writes[0].path}
    choice = archivable_prefix(commits, (), (), cleaned, policy)
    assert choice.count == 4
    assert [s.path for s in choice.live] == [commits[3][1].writes[0].path]
    assert latest not in [s.path for s in choice.live]
