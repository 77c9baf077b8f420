"""Writes by key into an Iceberg table of keys on the direct task path (lakesink.spark.direct):
when it is chosen, and its two stages without Spark: the pieces' rows split by the writer task
of their group (every row of a bucket to one writer), carried as Arrow IPC streams, and the
writers' statuses, committed, read back as the plain dict fold of every version in both modes."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_direct_path_choice import _cfg
from test_hudi_upsert import CHANGES, UPDATE, reference, versions
from test_iceberg_upsert import (
    Offsets,
    changes,
    complete,
    open_table,
    ranges_of,
    table_rows,
    writer,
)

from lakesink.errors import ConfigError
from lakesink.formats import plugin_for
from lakesink.formats.iceberg.keyed import COPY_ON_WRITE, MERGE_ON_READ
from lakesink.formats.task import KeyedTaskTarget
from lakesink.protocol.mutation import UNAVAILABLE_COLUMN
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import WriteStatus
from lakesink.spark.direct import (
    PREFOLD_MAX_DISTINCT,
    DirectTask,
    KeyedReadTask,
    KeyedWriteTask,
    TaskStatuses,
    _writer_of,
    newest_of_each_partition,
    read_groups,
    single_keyed_task,
    uses_direct_path,
)
from lakesink.spark.task_writer import rows_per_topic

KEYED = {"write__operation": "upsert", "table__record__key__fields": "id"}


@pytest.mark.parametrize(
    ("settings_", "direct"),
    [
        ({**KEYED, "table__format": "iceberg"}, True),
        ({**KEYED, "table__format": "iceberg", "write__path": "direct"}, True),
        ({**KEYED, "table__format": "iceberg", "write__path": "dataframe"}, False),
        ({**KEYED, "table__format": "hudi"}, False),  # Hudi's buckets: on the DataFrame
        (
            {
                **KEYED,
                "table__format": "iceberg",
                "errors__tolerance": "all",
                "errors__deadletter__table": "dead",
            },
            False,
        ),
    ],
)
def test_writes_by_key_take_the_direct_path_on_iceberg_tables(
    settings_: dict[str, Any], direct: bool
) -> None:
    assert uses_direct_path(_cfg(**settings_)) is direct


def test_a_forced_direct_path_for_writes_by_key_is_refused_where_it_cannot_serve() -> None:
    dead = {"errors__tolerance": "all", "errors__deadletter__table": "dead"}
    cfg = _cfg(**KEYED, table__format="iceberg", write__path="direct", **dead)
    with pytest.raises(ConfigError, match=r"write\.path=direct is not possible.*deadletter"):
        uses_direct_path(cfg)
    with pytest.raises(ConfigError, match=r"write\.path=direct cannot serve.*Hudi"):
        _cfg(**KEYED, table__format="hudi", write__path="direct")


class Pieces:
    """Stands in for `DirectTask` in the read stage: the rows of a task's pieces, decoded."""

    def __init__(self, batches: Sequence[pa.RecordBatch]) -> None:
        self.batches = batches

    def rows_of(self, pieces: Any, failed: list[Any]) -> Iterator[pa.RecordBatch]:
        yield from self.batches


def run_two_stages(
    target: KeyedTaskTarget,
    reads: Sequence[Sequence[pa.RecordBatch]],
    tasks: int,
    max_distinct: float = PREFOLD_MAX_DISTINCT,
    shuffled_rows: list[int] | None = None,
) -> list[WriteStatus]:
    """The job `_run_keyed_tasks` runs, in this process: one read task per piece, the
    shuffle by `_writer_of`, one write task per writer; the writers' statuses
    (`shuffled_rows`: gets the rows each read task handed on)."""
    shuffled: dict[int, list[tuple[int, bytes]]] = {}
    for batches in reads:
        read = KeyedReadTask(Pieces(batches), target, tasks, max_distinct)  # type: ignore[arg-type]
        handed = 0
        for key, data in read([]):
            handed += pa.ipc.open_stream(data).read_all().num_rows
            shuffled.setdefault(_writer_of(key) % tasks, []).append((key, data))
        if shuffled_rows is not None:
            shuffled_rows.append(handed)
    out = []
    for writer_task in range(tasks):
        (status,) = KeyedWriteTask(target)(shuffled.get(writer_task, []))
        rows = TaskStatuses.from_json(status).rows
        assert rows is not None
        out.append(rows)
    return out


def _batches_read_back_as_the_fold(
    mode: str,
    batches: list[list[tuple[int, int, int | None, int]]],
    buckets: int,
    write: Callable[[KeyedTaskTarget, pa.Table], list[Any]],
) -> None:
    """Each batch begun, written by `write` (its tasks' write statuses) and committed: after
    every batch the table is the dict fold of every version so far."""
    offsets = Offsets()
    rows = [[offsets.row(k, op, ts, p) for k, op, ts, p in batch] for batch in batches]
    with tempfile.TemporaryDirectory() as tmp:
        table = open_table(Path(tmp) / "wh", buckets, "ts", mode=mode)
        coordinator = writer(table)
        for n, batch in enumerate(rows, start=1):
            data = changes(batch)
            t = coordinator.begin_batch(n, ranges_of(data))
            assert t is not None
            target = plugin_for("iceberg").task_target(coordinator, t.value, 0)
            assert isinstance(target, KeyedTaskTarget)
            complete(coordinator, t, n, data, write(target, data))
            assert table_rows(table) == reference(rows[:n], "ts")


@pytest.mark.parametrize("mode", [COPY_ON_WRITE, MERGE_ON_READ])
@settings(max_examples=4, deadline=None)
@given(
    batches=st.lists(st.lists(versions, min_size=1, max_size=12), min_size=1, max_size=3),
    buckets=st.integers(1, 5),
    tasks=st.integers(1, 3),
    pieces=st.integers(1, 3),
    prefold=st.booleans(),
)
def test_the_two_stages_read_back_as_the_fold_and_give_each_bucket_one_writer(
    mode: str,
    batches: list[list[tuple[int, int, int | None, int]]],
    buckets: int,
    tasks: int,
    pieces: int,
    prefold: bool,
) -> None:
    """With the read tasks' pre-fold (`prefold`: at every share of distinct keys) or without
    (0: never), the table is the fold; the records counted are the records read."""

    def two_stages(target: KeyedTaskTarget, data: pa.Table) -> list[Any]:
        # the batch's rows spread over `pieces` read tasks, a few record batches each
        reads: list[list[pa.RecordBatch]] = [[] for _ in range(pieces)]
        for i, b in enumerate(data.to_batches(max_chunksize=4)):
            reads[i % pieces].append(b)
        handed: list[int] = []
        statuses = run_two_stages(target, reads, tasks, 1.0 if prefold else 0.0, handed)
        assert sum(s.records_read for s in statuses) == data.num_rows
        topics = rows_per_topic(statuses, [])
        assert topics["orders"][0] == data.num_rows
        for read, n in zip(reads, handed, strict=True):
            # no key column has nulls here, no unavailable column: each key's winner only
            keys = {k for b in read for k in b.column("id").to_pylist()}
            assert n == (len(keys) if prefold else sum(b.num_rows for b in read))
        # no bucket reached two writers (the commit refuses that, CommitError)
        return statuses

    _batches_read_back_as_the_fold(mode, batches, buckets, two_stages)


@given(
    spans=st.lists(st.integers(1, 500), min_size=1, max_size=12),
    per_task=st.integers(1, 1000),
    slots=st.integers(1, 4),
)
def test_read_tasks_gather_small_pieces_and_keep_every_piece_once(
    spans: list[int], per_task: int, slots: int
) -> None:
    pieces = [OffsetRange(TopicPartition("t", p), 10, 10 + n) for p, n in enumerate(spans)]
    groups = read_groups(pieces, per_task, slots)
    assert sorted(p for g in groups for p in g) == sorted(pieces)
    assert all(g == sorted(g) for g in groups) and all(groups)  # in the source's order
    wanted = max(slots, -(-sum(spans) // per_task))
    assert len(groups) == min(len(pieces), wanted)
    # eight small Kafka partitions on two cores: two read tasks, not eight
    assert len(read_groups(pieces[:8], 10_000, 2)) == min(2, len(pieces))


class OneTask(DirectTask):
    """The one task of a small batch written by key (`single_keyed_task`): `DirectTask` with the
    keyed target as its rows' table, its pieces' rows given decoded."""

    def __init__(self, target: KeyedTaskTarget, batches: Sequence[pa.RecordBatch]) -> None:
        schema = pa.schema([])
        super().__init__(
            "",
            "",
            rows=target,
            dead_letters=None,
            dead_letter_table=False,
            rows_schema=schema,
            dead_letter_schema=schema,
            required=(),
        )
        self.batches = batches

    def rows_of(
        self, pieces: Any, failed: list[Any], *, keep: bool = True
    ) -> Iterator[pa.RecordBatch]:
        yield from self.batches


@pytest.mark.parametrize("mode", [COPY_ON_WRITE, MERGE_ON_READ])
@settings(max_examples=4, deadline=None)
@given(
    batches=st.lists(st.lists(versions, min_size=1, max_size=12), min_size=1, max_size=3),
    buckets=st.integers(1, 5),
)
def test_a_small_batch_in_one_task_reads_back_as_the_fold(
    mode: str, batches: list[list[tuple[int, int, int | None, int]]], buckets: int
) -> None:
    """The one-task job of a small batch writes every bucket in its one writer: committed batch
    after batch, the table is the dict fold of every version, in both modes."""

    def one_task(target: KeyedTaskTarget, data: pa.Table) -> list[Any]:
        (out,) = OneTask(target, data.to_batches(max_chunksize=4))([])
        status = TaskStatuses.from_json(out).rows
        assert status is not None and status.records_read == data.num_rows
        return [status]

    _batches_read_back_as_the_fold(mode, batches, buckets, one_task)


TOAST = pa.schema([*CHANGES, (UNAVAILABLE_COLUMN, pa.list_(pa.string()))])


@pytest.mark.parametrize("mode", [COPY_ON_WRITE, MERGE_ON_READ])
@settings(max_examples=4, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.tuples(versions, st.booleans()), min_size=1, max_size=12),
        min_size=1,
        max_size=3,
    ),
    buckets=st.integers(1, 3),
    tasks=st.integers(1, 2),
    pieces=st.integers(1, 3),
)
# a key's winner leaves `v` out; the task's earlier version of it carries `v`
@example(
    batches=[[((1, UPDATE, 1, 0), False), ((1, UPDATE, 2, 0), True)]],
    buckets=1,
    tasks=1,
    pieces=1,
)
def test_prefolded_read_tasks_with_unavailable_values_write_what_one_task_writes(
    mode: str,
    batches: list[list[tuple[tuple[int, int, int | None, int], bool]]],
    buckets: int,
    tasks: int,
    pieces: int,
) -> None:
    """A change stream whose versions leave `v` out (TOAST, `unavailable`): the two-stage job
    with every read task pre-folding writes, batch after batch, the table the one-task job
    (no pre-fold: every version in one fold) writes, in both modes."""
    offsets = Offsets()
    rows = [
        [
            {
                **offsets.row(k, op, ts, p),
                **({"v": None, UNAVAILABLE_COLUMN: ["v"]} if gone else {}),
            }
            for (k, op, ts, p), gone in batch
        ]
        for batch in batches
    ]
    with tempfile.TemporaryDirectory() as tmp:
        tables = [open_table(Path(tmp) / name, buckets, "ts", mode=mode) for name in "ab"]
        coordinators = [writer(table) for table in tables]
        for n, batch in enumerate(rows, start=1):
            data = pa.Table.from_pylist(batch, schema=TOAST)
            for coordinator, prefold in zip(coordinators, (True, False), strict=True):
                t = coordinator.begin_batch(n, ranges_of(data))
                assert t is not None
                target = plugin_for("iceberg").task_target(coordinator, t.value, 0)
                assert isinstance(target, KeyedTaskTarget)
                if prefold:
                    reads: list[list[pa.RecordBatch]] = [[] for _ in range(pieces)]
                    for i, b in enumerate(data.to_batches(max_chunksize=3)):
                        reads[i % pieces].append(b)
                    statuses = run_two_stages(target, reads, tasks, 1.0)
                else:
                    (out,) = OneTask(target, data.to_batches())([])
                    status = TaskStatuses.from_json(out).rows
                    assert status is not None
                    statuses = [status]
                assert sum(s.records_read for s in statuses) == data.num_rows
                complete(coordinator, t, n, data, statuses)
            assert table_rows(tables[0]) == table_rows(tables[1])


def test_a_batch_takes_one_task_up_to_the_limit_of_its_offsets() -> None:
    def pieces(*spans: int) -> list[OffsetRange]:
        return [OffsetRange(TopicPartition("t", p), 5, 5 + n) for p, n in enumerate(spans)]

    assert single_keyed_task(pieces(3, 4, 3), 10)  # 10 offsets over three Kafka partitions
    assert not single_keyed_task(pieces(3, 4, 4), 10)
    assert not single_keyed_task(pieces(1), 0)  # 0: always the two-stage job
    assert not single_keyed_task([], 10)  # no pieces: no job at all


def test_the_newest_record_of_each_kafka_partition_is_handed_on() -> None:
    """A pre-fold keeps each Kafka partition's newest record (the table's valid-through
    timestamp is the newest record written): one row each, a null timestamp never the newest."""
    ms = pa.timestamp("ms", tz="UTC")
    rows = pa.table(
        {
            "kafka_topic": ["a", "a", "a", "b", "a", None, None],
            "kafka_partition": pa.array([0, 0, 1, 0, 0, 0, 0], pa.int32()),
            "kafka_timestamp": pa.array([5, 9, 1, 7, None, 3, 2], ms),
        }
    )
    assert newest_of_each_partition(rows).tolist() == [False, True, True, True, False, True, False]
    assert not newest_of_each_partition(rows.drop_columns(["kafka_timestamp"])).any()
    nulls = rows.set_column(2, "kafka_timestamp", pa.nulls(7, ms))
    assert not newest_of_each_partition(nulls).any()
    integers = rows.set_column(2, "kafka_timestamp", pa.array([5, 9, 1, 7, None, 3, 2], "int64"))
    assert newest_of_each_partition(integers).tolist() == [
        False,
        True,
        True,
        True,
        False,
        True,
        False,
    ]
    text = rows.set_column(2, "kafka_timestamp", rows.column(2).cast(pa.string()))
    assert newest_of_each_partition(text) is None  # no pre-fold: the writer reads them as given
