"""The parts both writers by key of an Iceberg table of keys share at commit
(lakesink.formats.iceberg.keyed_writer): the tasks' reports gathered (files by path, per bucket
the paths read; a bucket two tasks wrote refused) and the check that every bucket still holds
exactly what the batch read. And the rule a table ahead of the batch takes its rows by, as the
fan-out tasks apply it in Arrow (lakesink.spark.routing)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from lakesink.errors import CommitConflictError, CommitError
from lakesink.formats.iceberg.datafiles import DataFileDescription
from lakesink.formats.iceberg.keyed_writer import (
    BUCKETS_KEY,
    check_buckets_unchanged,
    files_and_reads,
)
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.spark.routing import _after_committed, _skip_below

KEY = "test.files"


def desc(path: str) -> DataFileDescription:
    return DataFileDescription(path=path, size_bytes=10, record_count=1, spec_id=0)


def test_the_tasks_reports_give_the_files_by_path_and_each_buckets_reads() -> None:
    extras = [
        {KEY: [desc("b.parquet").to_json(), desc("a.parquet").to_json()], BUCKETS_KEY: {"1": []}},
        {KEY: [desc("a.parquet").to_json()], BUCKETS_KEY: {"0": ["x", "y"]}},
        {},  # a task with no rows reports nothing
    ]
    files, read = files_and_reads(extras, KEY)
    assert [f.path for f in files] == ["a.parquet", "b.parquet"]
    assert read == {0: frozenset({"x", "y"}), 1: frozenset()}


def test_a_bucket_two_tasks_wrote_is_refused() -> None:
    extras = [{BUCKETS_KEY: {"3": ["x"]}}, {BUCKETS_KEY: {"3": ["x"]}}]
    with pytest.raises(CommitError, match="bucket 3 was written by two tasks"):
        files_and_reads(extras, KEY)


def test_a_bucket_that_changed_since_the_batch_read_it_is_a_conflict() -> None:
    read = {0: frozenset({"x"}), 1: frozenset()}
    check_buckets_unchanged("t", read, {0: frozenset({"x"})})  # bucket 1 still empty
    with pytest.raises(CommitConflictError, match=r"bucket 0 changed .*gone: \['x'\]"):
        check_buckets_unchanged("t", read, {0: frozenset({"z"})})
    with pytest.raises(CommitConflictError, match=r"bucket 1 changed .*new: \['w'\]"):
        check_buckets_unchanged("t", read, {0: frozenset({"x"}), 1: frozenset({"w"})})


def test_a_table_ahead_of_the_batch_takes_only_the_rows_past_its_committed_offsets() -> None:
    p0, p1, p2 = (TopicPartition("t", p) for p in range(3))
    planned = [OffsetRange(p0, 0, 10), OffsetRange(p1, 0, 10), OffsetRange(p2, 0, 10)]
    assert _skip_below(planned, planned) == {}  # a table not ahead takes the batch whole
    # the table committed p0 up to 4 and all of p1 already
    skip = _skip_below([OffsetRange(p0, 4, 10), OffsetRange(p2, 0, 10)], planned)
    assert skip == {("t", 0): 4, ("t", 1): None}
    batch = pa.RecordBatch.from_pydict(
        {
            "kafka_topic": ["t"] * 6,
            "kafka_partition": [0, 0, 1, 2, 0, 2],
            "kafka_offset": [3, 4, 5, 6, 9, 0],
        }
    )
    routed = pa.array([True, True, True, True, False, True])
    taken = _after_committed(batch, routed, skip)
    assert taken.to_pylist() == [False, True, False, True, False, True]
