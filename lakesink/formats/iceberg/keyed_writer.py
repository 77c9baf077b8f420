"""What the two task writers of an Iceberg table of keys share: copy-on-write
(lakesink.formats.iceberg.upsert) and merge-on-read (lakesink.formats.iceberg.rowdelta).

Both buffer a task attempt's rows, check them (Kafka coordinates, a non-null key, columns the
table has), mark a stream of upserts as updates, split the rows by bucket and hand each bucket's
rows to the mode's fold (`KeyedWriter.write_bucket`); they report the new data files
(`FILES_KEY`), the files the mode adds beside them (the replaced data files, or the
position-delete files) and, per bucket, the paths the fold read (`BUCKETS_KEY`), which the
commit checks the bucket still holds.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakesink.engine.fold import OFFSET_COLUMN, PARTITION_COLUMN
from lakesink.errors import CommitConflictError, CommitError, RecordError, UnsupportedTableError
from lakesink.formats.iceberg.datafiles import (
    FILES_KEY,
    MAX_TS_KEY,
    DataFileDescription,
    WriteContext,
    newest_record_ms,
)
from lakesink.formats.iceberg.keyed import KeyedLayout, buckets_of, layout_of, required_keys
from lakesink.formats.iceberg.schema import check_compatible
from lakesink.protocol.mutation import CHANGE_COLUMNS, OPERATION_COLUMN, RowOperation

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

    from lakesink.formats.task import TaskAttempt
    from lakesink.protocol.write_status import FileWrite

__all__ = [
    "BUCKETS_KEY",
    "BucketWrite",
    "KeyedTarget",
    "KeyedWriter",
    "bucket_ids",
    "check_buckets_unchanged",
    "check_keyed_rows",
    "files_and_reads",
    "keyed_layout",
    "parsed_metadata",
    "table_schema",
]

BUCKETS_KEY = "iceberg.buckets"
"""`WriteStatus.extra`: per bucket a task wrote (its number as text), the paths of the files it
read: the bucket must hold exactly these when the batch commits."""


@functools.lru_cache(maxsize=8)
def parsed_metadata(metadata_json: str) -> Any:
    """The table metadata of a write context's text (parsed once per text in a task process)."""
    from pyiceberg.table.metadata import TableMetadataUtil

    return TableMetadataUtil.parse_raw(metadata_json)


def table_schema(context: WriteContext) -> Schema:
    """The table's schema (parsed once per metadata text in a task process)."""
    return parsed_metadata(context.metadata_json).schema()  # type: ignore[no-any-return]


def keyed_layout(table: Table, context: WriteContext) -> KeyedLayout:
    """The layout of the table of keys a batch writes; UnsupportedTableError for a table
    created for appends."""
    layout = layout_of(table.metadata, context.table)
    if layout is None:
        raise UnsupportedTableError(
            f"table {context.table} is not a table of keys (created for write.operation=append)"
        )
    return layout


def bucket_ids(batch: pa.RecordBatch, layout: KeyedLayout, context: WriteContext) -> pa.Array:
    """The bucket of each row of `batch` (a target's `group_ids`: a task gets whole buckets)."""
    rows = pa.Table.from_batches([batch])
    return pa.array(buckets_of(rows, layout, table_schema(context)), pa.int32())


def check_keyed_rows(layout: KeyedLayout, rows: pa.Table) -> None:
    """RecordError for rows that cannot be written by key: no Kafka coordinates (the ordering
    rule's tie-breakers), no key column, or a null key value (naming the record)."""
    needed = [PARTITION_COLUMN, OFFSET_COLUMN, *layout.key]
    missing = [c for c in needed if c not in rows.column_names]
    if missing:
        raise RecordError(
            f"rows written by key need the record key and Kafka coordinate columns; missing "
            f"{', '.join(missing)} (keep them in the table's columns)"
        )
    null = np.zeros(rows.num_rows, dtype=bool)
    for k in layout.key:
        null |= pc.is_null(rows.column(k)).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(null)
    if len(bad):
        i = int(bad[0])
        topic = rows.column("kafka_topic")[i].as_py() if "kafka_topic" in rows.column_names else "?"
        raise RecordError(
            f"the row of Kafka record {topic}:{rows.column(PARTITION_COLUMN)[i].as_py()} offset "
            f"{rows.column(OFFSET_COLUMN)[i].as_py()} has a null record key "
            f"({', '.join(layout.key)}); a row written by key needs a key"
        )


class KeyedTarget(Protocol):
    """What a keyed writer reads of its target (`IcebergUpsertTarget`, `IcebergRowDeltaTarget`)."""

    @property
    def context(self) -> WriteContext: ...
    @property
    def instant_time(self) -> str: ...
    @property
    def layout(self) -> KeyedLayout: ...
    @property
    def token(self) -> str: ...


TargetT = TypeVar("TargetT", bound=KeyedTarget)


@dataclass(frozen=True, slots=True)
class BucketWrite:
    """What a mode's fold of one bucket wrote: the new data files, the files the mode reports
    beside them (`KeyedWriter.files_key`), and the paths it read."""

    written: list[DataFileDescription]
    files: list[DataFileDescription]
    read: list[str]


class KeyedWriter(ABC, Generic[TargetT]):
    """One task attempt's writer by key: buffers its rows, and at `close` hands each bucket's
    rows to the mode's `write_bucket`."""

    files_key: ClassVar[str]
    """The `WriteStatus.extra` key of `BucketWrite.files`."""

    def __init__(self, target: TargetT, attempt: TaskAttempt) -> None:
        self.target = target
        self.attempt = attempt
        self._batches: list[pa.RecordBatch] = []
        self._newest_ms: dict[str, int] = {}

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self._batches.append(batch)
            for key, ms in newest_record_ms(batch).items():
                self._newest_ms[key] = max(ms, self._newest_ms.get(key, ms))

    @abstractmethod
    def write_bucket(self, bucket: int, incoming: pa.Table, name: str) -> BucketWrite:
        """Fold `incoming` (the batch's versions of the keys of `bucket`) over the bucket's
        stored rows; `name` makes the file names of this attempt and bucket."""

    def close(self) -> tuple[list[FileWrite], dict[str, Any]]:
        from lakesink.protocol.write_status import FileWrite

        if not self._batches:
            return [], {}
        rows = pa.Table.from_batches(self._batches)
        self._batches = []
        context = self.target.context
        layout = self.target.layout
        check_keyed_rows(layout, rows)
        if OPERATION_COLUMN not in rows.column_names:  # a stream of upserts
            code = pa.array(np.full(rows.num_rows, RowOperation.UPDATE.code, np.int8))
            rows = rows.append_column(OPERATION_COLUMN, code)
        schema = table_schema(context)
        data = pa.schema([f for f in rows.schema if f.name not in CHANGE_COLUMNS])
        # a column the table lacks (or of another type) is refused, never dropped
        check_compatible(schema, required_keys(data, layout.key), context.table)
        buckets = buckets_of(rows, layout, schema)
        written: list[DataFileDescription] = []
        files: list[DataFileDescription] = []
        read: dict[str, list[str]] = {}
        for bucket in sorted({int(b) for b in buckets}):
            incoming = rows.filter(pa.array(buckets == bucket))
            name = f"{self.target.instant_time}-{self.target.token}-{self.attempt.name}-b{bucket}"
            done = self.write_bucket(bucket, incoming, name)
            written += done.written
            files += done.files
            read[str(bucket)] = done.read
        out = [FileWrite("", d.path, d.path, d.record_count, d.size_bytes) for d in written]
        return out, {
            FILES_KEY: [d.to_json() for d in written],
            self.files_key: [d.to_json() for d in files],
            BUCKETS_KEY: read,
            MAX_TS_KEY: self._newest_ms,
        }


def files_and_reads(
    extras: Sequence[Mapping[str, Any]], files_key: str
) -> tuple[tuple[DataFileDescription, ...], dict[int, frozenset[str]]]:
    """From the tasks' `WriteStatus.extra` maps: the files under `files_key` (by path, sorted)
    and, per bucket, the paths its task read (CommitError when two tasks wrote one bucket)."""
    files: dict[str, DataFileDescription] = {}
    read: dict[int, frozenset[str]] = {}
    for extra in extras:
        for d in extra.get(files_key, ()):
            desc = DataFileDescription.from_json(d)
            files[desc.path] = desc
        for bucket, paths in (extra.get(BUCKETS_KEY) or {}).items():
            if int(bucket) in read:  # the shuffle gives each bucket to one task
                raise CommitError(
                    f"bucket {bucket} was written by two tasks of one batch; the batch is "
                    "not committed (retrying it is safe)"
                )
            read[int(bucket)] = frozenset(paths)
    return tuple(files[p] for p in sorted(files)), read


def check_buckets_unchanged(
    table: str, read: Mapping[int, frozenset[str]], now: Mapping[int, frozenset[str]]
) -> None:
    """CommitConflictError naming the first bucket whose paths `now` (in the table's current
    snapshot; absent: none) are not the ones the batch `read`."""
    for bucket, paths in sorted(read.items()):
        found = now.get(bucket, frozenset())
        if found != paths:
            gone, new = sorted(paths - found), sorted(found - paths)
            raise CommitConflictError(
                f"table {table}: bucket {bucket} changed since the batch "
                f"read it (files gone: {gone[:2]}, new: {new[:2]}); another writer or a "
                "rewrite committed it; the batch is written again over its files"
            )
