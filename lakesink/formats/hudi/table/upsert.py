"""Writes by key into a copy-on-write table with a simple bucket index (`write.operation`
upsert or cdc): every task rewrites whole file groups, one per (partition, bucket).

A bucket's file group is found from the key alone (`lakesink.formats.hudi.table.bucket`), so
the Spark side shuffles the rows by `group_ids` and each task sees every version of the keys of
its buckets. For each (partition, bucket) the task folds the versions under lakesink's ordering
rule over the rows of the group's latest base file as of the batch's start (`merge_over`: a
winning delete removes its key) and writes one new base file of the group, as Hudi's merge
handle does: rows a version of this batch wrote carry the new instant, the others keep their
`_hoodie_commit_time` and `_hoodie_commit_seqno`, so an incremental reader reads only what
changed. A new group takes the bucket's fixed file id (`bucket_file_id`): two writers creating
one bucket write one file id, and the per-file-group conflict check stops the second.
"""

from __future__ import annotations

import dataclasses
import logging
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lakesink.engine.fold import OFFSET_COLUMN, PARTITION_COLUMN, merge_over
from lakesink.errors import CorruptTableError, RecordError, UnsupportedTableError
from lakesink.formats.hudi.table.avro_schema import META_COLUMNS, check_matches
from lakesink.formats.hudi.table.bucket import (
    BucketIndex,
    bucket_file_id,
    bucket_of_file_id,
    is_bucket_file_id,
)
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.file_group import FileSlice
from lakesink.formats.hudi.table.files import write_token
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.view import FileSystemView
from lakesink.formats.hudi.table.writer import BaseFileWriter, record_keys
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.mutation import OPERATION_COLUMN, UNAVAILABLE_COLUMN, RowOperation
from lakesink.protocol.write_status import FileWrite
from lakesink.storage import Storage

if TYPE_CHECKING:
    from lakesink.formats.task import TaskAttempt

__all__ = ["HudiUpsertTaskTarget", "HudiUpsertWriter"]

log = logging.getLogger(__name__)

_COMMIT_TIME, _SEQNO = "_hoodie_commit_time", "_hoodie_commit_seqno"
_NEVER_ROLL = 1 << 62  # one file per file group: its id is the bucket's address
GroupKey = tuple[str, int]  # (partition path, bucket)


@dataclass(frozen=True, slots=True)
class HudiUpsertTaskTarget:
    """Where Spark tasks write by key on a bucket-indexed Hudi table (a
    `lakesink.formats.task.KeyedTaskTarget`): the table, the instant, the Avro schema the rows
    must have (None: the table has none yet), and the latest base file of every bucket file
    group as of the batch's start, which the tasks merge over."""

    storage: Storage
    config: TableConfig
    instant_time: str
    target_file_size: int
    base_files: tuple[FileSlice, ...] = ()
    table_schema: str | None = None

    def __post_init__(self) -> None:
        if self.config.bucket_count is None:
            raise UnsupportedTableError(
                f"table {self.config.name!r} has no bucket index: rows are written by key "
                "only into a table created with one (table.bucket.count)"
            )

    @classmethod
    def for_table(
        cls, table: HudiTable, instant_time: str, target_file_size: int
    ) -> HudiUpsertTaskTarget:
        """The target of one batch: the table's latest base files and schema, read now."""
        timeline = table.timeline()
        view = FileSystemView(table, timeline=timeline)
        latest = view.latest_base_files()
        by_group: dict[GroupKey, FileSlice] = {}
        for s in latest:
            if not is_bucket_file_id(s.file_id):
                raise CorruptTableError(
                    f"table {table.uri}: file group {s.file_id} in {s.partition_path!r} has no "
                    "bucket number; a table written by key holds only bucket file groups (was "
                    "it written without the bucket index?)"
                )
            key = (s.partition_path, bucket_of_file_id(s.file_id))
            other = by_group.get(key)
            if other is not None:
                raise CorruptTableError(
                    f"table {table.uri}: bucket {key[1]} of {key[0]!r} has two file groups, "
                    f"{other.file_id} and {s.file_id}; a key could be in either"
                )
            by_group[key] = s
        return cls(
            table.storage,
            table.config,
            str(instant_time),
            target_file_size,
            tuple(latest),
            timeline.latest_schema(),
        )

    def group_ids(self, batch: pa.RecordBatch) -> pa.Array:
        """A stable int32 per row from its (partition path, bucket): crc32 of the path text
        combined with the bucket. Two groups may share an id (they then share a task); the
        writer regroups by the exact pair."""
        rows = pa.Table.from_batches([batch])
        paths, codes = _partition_paths(HudiTable(self.storage, self.config), rows)
        buckets = _buckets(self.config, rows)
        path_hash = np.array([zlib.crc32(p.encode("utf-8")) for p in paths], dtype=np.int64)
        mixed = (path_hash[codes] * 1_000_003 + buckets.astype(np.int64)) & 0x7FFFFFFF
        return pa.array(mixed.astype(np.int32), pa.int32())

    def open(self, attempt: TaskAttempt) -> HudiUpsertWriter:
        return HudiUpsertWriter(self, write_token(attempt.partition, attempt.stage, attempt.number))


def fit_stored_rows(found: pa.Table, schema: pa.Schema) -> pa.Table:
    """A slice's stored rows in the batch's write schema: each column cast to its type, a
    column the slice predates null-filled."""
    columns = []
    for f in schema:
        if f.name in found.column_names:
            columns.append(found.column(f.name).cast(f.type))
        else:
            columns.append(pa.chunked_array([pa.nulls(found.num_rows, f.type)]))
    return pa.Table.from_arrays(columns, schema=schema)


class HudiUpsertWriter:
    """One task attempt's writer: buffers its rows, and at `close` rewrites each of their
    (partition, bucket) file groups with the merged rows."""

    def __init__(self, target: HudiUpsertTaskTarget, token: str) -> None:
        self.target = target
        self.token = token
        self.table = HudiTable(target.storage, target.config)
        self.instant_time = InstantTime(target.instant_time)
        self._batches: list[pa.RecordBatch] = []
        self._new_rows = 0  # seqnos of the rows this attempt writes, across its groups

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self._batches.append(batch)

    def close(self) -> tuple[list[FileWrite], dict[str, Any]]:
        if not self._batches:
            return [], {}
        rows = pa.Table.from_batches(self._batches)
        rows = rows.drop_columns([c for c in rows.column_names if c in META_COLUMNS])
        self._batches = []
        config = self.target.config
        _check_rows(config, rows)
        if OPERATION_COLUMN not in rows.column_names:  # a stream of upserts
            code = pa.array(np.full(rows.num_rows, RowOperation.UPDATE.code, np.int8))
            rows = rows.append_column(OPERATION_COLUMN, code)
        data_schema = pa.schema(
            [f for f in rows.schema if f.name not in (OPERATION_COLUMN, UNAVAILABLE_COLUMN)]
        )
        if self.target.table_schema is not None:
            where = f"rows for instant {self.instant_time} in {self.table.uri}"
            check_matches(self.target.table_schema, data_schema, f"{config.name}_record", where)
        base = {(s.partition_path, bucket_of_file_id(s.file_id)): s for s in self.target.base_files}
        writes: list[FileWrite] = []
        avro: str | None = None
        for (path, bucket), incoming in _groups(self.table, rows):
            write, schema = self._write_group(path, bucket, incoming, base.get((path, bucket)))
            if write is not None:
                writes.append(write)
                avro = avro or schema
        return writes, ({"schema": avro} if avro else {})

    def _write_group(
        self, path: str, bucket: int, incoming: pa.Table, previous: FileSlice | None
    ) -> tuple[FileWrite | None, str | None]:
        config = self.target.config
        data_fields = [
            f for f in incoming.schema if f.name not in (OPERATION_COLUMN, UNAVAILABLE_COLUMN)
        ]
        stored = self._stored_rows(previous, pa.schema(data_fields))
        versions = incoming
        for name in (_COMMIT_TIME, _SEQNO):  # a version of this batch: the new instant's
            versions = versions.append_column(name, pa.nulls(incoming.num_rows, pa.string()))
        merged = merge_over(stored, versions, config.record_key_fields, config.ordering_field)
        if merged.num_rows == 0 and previous is None:
            return None, None  # deletes of keys never stored: no file group to write
        fresh = pc.is_null(merged.column(_COMMIT_TIME)).to_numpy(zero_copy_only=False)
        merged = self._stamp(merged, fresh)
        named = config.named_record_keys
        keys = record_keys(merged, config.record_key_fields, named=named)
        stored_keys = record_keys(stored, config.record_key_fields, named=named)
        was_stored = pc.is_in(keys, value_set=stored_keys.combine_chunks()).to_numpy(
            zero_copy_only=False
        )
        writer = BaseFileWriter(
            self.table,
            path,
            self.instant_time,
            self.token,
            target_file_size_bytes=_NEVER_ROLL,
            table_schema=self.target.table_schema,
            preserve_commit_time=True,
            file_id_factory=lambda: previous.file_id if previous else bucket_file_id(bucket),
        )
        if merged.num_rows:
            writer.write(merged)
        else:
            writer.write_empty(merged.schema)
        (done,) = writer.close()
        write = dataclasses.replace(
            done,
            prev_commit=previous.instant_time.value if previous else "null",
            num_inserts=int((fresh & ~was_stored).sum()),
            num_update_writes=int((fresh & was_stored).sum()),
            num_deletes=stored.num_rows - int(was_stored.sum()),
        )
        log.debug(
            "table %s instant %s: bucket %d of %r: %d rows (%d inserted, %d updated, %d deleted)",
            self.table.uri,
            self.instant_time,
            bucket,
            path,
            write.num_writes,
            write.num_inserts,
            write.num_update_writes,
            write.num_deletes,
        )
        return write, writer.avro_schema

    def _stored_rows(self, previous: FileSlice | None, data_schema: pa.Schema) -> pa.Table:
        """The rows of the group's latest base file in the rows' schema, with their commit time
        and seqno (empty when the group is new)."""
        schema = data_schema.append(pa.field(_COMMIT_TIME, pa.string())).append(
            pa.field(_SEQNO, pa.string())
        )
        if previous is None:
            return schema.empty_table()
        fs, root = self.table.storage.arrow()
        found = pq.read_table(f"{root}/{previous.path}", filesystem=fs, partitioning=None)
        return fit_stored_rows(found, schema)

    def _stamp(self, merged: pa.Table, fresh: np.ndarray[Any, Any]) -> pa.Table:
        """The new instant and seqnos on the rows a version of this batch wrote."""
        n = int(fresh.sum())
        if n == 0:
            return merged
        mask = pa.array(fresh)
        # Hudi's seqno `<instant>_<task partition>_<n>`, n counting this attempt's new rows
        numbers = np.cumsum(fresh, dtype=np.int64) - 1 + self._new_rows
        self._new_rows += n
        prefix = f"{self.instant_time.value}_{int(self.token.split('-')[0])}_"
        seqnos = pc.binary_join_element_wise(prefix, pc.cast(pa.array(numbers), pa.string()), "")
        columns = {
            _COMMIT_TIME: pc.if_else(
                mask, pa.scalar(self.instant_time.value), merged.column(_COMMIT_TIME)
            ),
            _SEQNO: pc.if_else(mask, seqnos, merged.column(_SEQNO)),
        }
        for name, values in columns.items():
            merged = merged.set_column(merged.schema.get_field_index(name), name, values)
        return merged


def _check_rows(config: TableConfig, rows: pa.Table) -> None:
    """RecordError for rows that cannot be written by key: no Kafka coordinates (the ordering
    rule's tie-breakers), or a key Hudi cannot hold (a null key value; every value empty)."""
    missing = [c for c in (PARTITION_COLUMN, OFFSET_COLUMN) if c not in rows.column_names]
    if missing:
        raise RecordError(
            f"table {config.name!r} is written by key, and its rows need the Kafka coordinates "
            f"as columns; missing {', '.join(missing)} (keep them in the table's columns)"
        )
    fields = config.record_key_fields
    absent = [f for f in fields if f not in rows.column_names]
    if absent:
        raise RecordError(f"the rows have no record key column {', '.join(map(repr, absent))}")
    null = np.zeros(rows.num_rows, dtype=bool)
    empty = np.ones(rows.num_rows, dtype=bool)
    for f in fields:
        column = rows.column(f)
        null |= pc.is_null(column).to_numpy(zero_copy_only=False)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            same = pc.fill_null(pc.equal(column, ""), False)
            empty &= same.to_numpy(zero_copy_only=False)
        else:
            empty[:] = False
    bad = np.flatnonzero(null | empty)
    if len(bad):
        i = int(bad[0])
        what = "null" if null[i] else "empty"
        raise RecordError(
            f"the row of Kafka record {_coordinates(rows, i)} has a {what} record key "
            f"({', '.join(fields)}); a row written by key needs a key"
        )


def _coordinates(rows: pa.Table, i: int) -> str:
    topic = rows.column("kafka_topic")[i].as_py() if "kafka_topic" in rows.column_names else "?"
    partition = rows.column(PARTITION_COLUMN)[i].as_py()
    offset = rows.column(OFFSET_COLUMN)[i].as_py()
    return f"{topic}:{partition} offset {offset}"


def _buckets(config: TableConfig, rows: pa.Table) -> np.ndarray[Any, Any]:
    index = config.bucket_index()
    assert isinstance(index, BucketIndex)  # the target checked it
    keys = record_keys(rows, config.record_key_fields, named=config.named_record_keys)
    return index.buckets_of(keys)


def _partition_paths(table: HudiTable, rows: pa.Table) -> tuple[list[str], np.ndarray[Any, Any]]:
    """The distinct partition paths of `rows` and each row's index into them."""
    fields = table.config.partition_fields
    codes = np.zeros(rows.num_rows, dtype=np.int64)
    if not fields:
        return [""], codes
    row = "__lakesink_row__"
    keyed = rows.select(list(fields)).append_column(
        row, pa.array(np.arange(rows.num_rows, dtype=np.int64))
    )
    groups = keyed.group_by(list(fields), use_threads=False).aggregate([(row, "list")])
    lists = groups.column(f"{row}_list")
    paths: list[str] = []
    index: dict[str, int] = {}
    for g in range(groups.num_rows):
        path = table.partition_path_for({f: groups.column(f)[g].as_py() for f in fields})
        at = index.setdefault(path, len(paths))
        if at == len(paths):
            paths.append(path)
        codes[lists[g].values.to_numpy()] = at
    return paths, codes


def _groups(table: HudiTable, rows: pa.Table) -> Iterator[tuple[GroupKey, pa.Table]]:
    """The rows of each (partition path, bucket), in partition and bucket order."""
    paths, codes = _partition_paths(table, rows)
    buckets = _buckets(table.config, rows)
    order = np.lexsort((buckets, codes))
    pairs = np.stack((codes[order], buckets[order].astype(np.int64)), axis=1)
    starts = np.flatnonzero(np.concatenate(([True], (pairs[1:] != pairs[:-1]).any(axis=1))))
    ends = np.append(starts[1:], len(order))
    keyed = [
        ((paths[int(pairs[a][0])], int(pairs[a][1])), order[a:b])
        for a, b in zip(starts, ends, strict=True)
    ]
    for key, at in sorted(keyed, key=lambda g: g[0]):
        yield key, rows.take(pa.array(at))  # lexsort is stable: the rows' own order
