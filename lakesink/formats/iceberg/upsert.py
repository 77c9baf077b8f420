"""Writes by key into an Iceberg table of keys, copy-on-write (`write.operation` upsert or cdc):
every task rewrites whole buckets (lakesink.formats.iceberg.keyed).

The driver plans the table's current snapshot once per batch: the data files of every bucket
(`IcebergUpsertTarget.for_table`). The Spark side shuffles the rows by bucket (`group_ids`), so a
task sees every version of the keys of its buckets. For each bucket the task reads the bucket's
files, folds the batch's versions over their rows under lakesink's ordering rule (`merge_over`:
a winning delete removes its key, a delete of a key never stored changes nothing) and writes the
result as new data files (split by the other partition fields as pyiceberg splits any write).
It reports the new files (`FILES_KEY`), the files they replace (`REPLACED_KEY`) and, per bucket
it rewrote, the paths it read (`BUCKETS_KEY`). The coordinator commits one overwrite snapshot
that removes the replaced files and adds the new ones, on a snapshot where each of those buckets
still holds exactly the files read (`BucketRewrite.check`): else another writer or a maintenance
rewrite changed the bucket, and the batch is written again over the new files
(CommitConflictError), so no row is lost or brought back.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakesink.engine.fold import OFFSET_COLUMN, PARTITION_COLUMN, merge_over
from lakesink.errors import CommitConflictError, CommitError, RecordError, UnsupportedTableError
from lakesink.formats.iceberg.datafiles import (
    FILES_KEY,
    MAX_TS_KEY,
    DataFileDescription,
    WriteContext,
    newest_record_ms,
    to_data_file,
    write_data_files,
)
from lakesink.formats.iceberg.keyed import (
    KeyedLayout,
    bucket_files,
    buckets_of,
    layout_of,
    required_keys,
)
from lakesink.formats.iceberg.schema import check_compatible
from lakesink.protocol.mutation import CHANGE_COLUMNS, OPERATION_COLUMN, RowOperation

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

    from lakesink.formats.task import TaskAttempt
    from lakesink.protocol.write_status import FileWrite

__all__ = [
    "BUCKETS_KEY",
    "REPLACED_KEY",
    "BucketRewrite",
    "IcebergUpsertTarget",
    "IcebergUpsertWriter",
]

REPLACED_KEY = "iceberg.replaced"
"""`WriteStatus.extra`: the JSON forms of the data files a task's new files replace."""
BUCKETS_KEY = "iceberg.buckets"
"""`WriteStatus.extra`: per bucket a task rewrote (its number as text), the paths of the files it
read: the bucket must hold exactly these when the batch commits."""


@dataclass(frozen=True, slots=True)
class IcebergUpsertTarget:
    """Where Spark tasks write by key on an Iceberg table of keys (a
    `lakesink.formats.task.KeyedTaskTarget`): the table's write context, its layout, and the
    data files of every bucket as of the batch's start, which the tasks fold over."""

    context: WriteContext
    instant_time: str
    layout: KeyedLayout
    files: tuple[tuple[int, tuple[DataFileDescription, ...]], ...] = ()
    # one per transaction, as IcebergTarget's: file names apart across writers
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @classmethod
    def for_table(
        cls, table: Table, context: WriteContext, instant_time: str
    ) -> IcebergUpsertTarget:
        """The target of one batch: the layout and bucket files of `table` (loaded fresh by the
        caller) and its write context (`IcebergTable.write_context`)."""
        layout = layout_of(table.metadata, context.table)
        if layout is None:
            raise UnsupportedTableError(
                f"table {context.table} is not a table of keys (created for write.operation=append)"
            )
        found = bucket_files(table, layout)
        return cls(context, instant_time, layout, tuple(sorted(found.items())))

    def group_ids(self, batch: pa.RecordBatch) -> pa.Array:
        """The bucket of each row: a task gets whole buckets."""
        rows = pa.Table.from_batches([batch])
        return pa.array(buckets_of(rows, self.layout, _schema(self.context)), pa.int32())

    def open(self, attempt: TaskAttempt) -> IcebergUpsertWriter:
        return IcebergUpsertWriter(self, attempt)


@functools.lru_cache(maxsize=8)
def _parsed(metadata_json: str) -> Any:
    from pyiceberg.table.metadata import TableMetadataUtil

    return TableMetadataUtil.parse_raw(metadata_json)


def _schema(context: WriteContext) -> Schema:
    """The table's schema (parsed once per metadata text in a task process)."""
    return _parsed(context.metadata_json).schema()  # type: ignore[no-any-return]


class IcebergUpsertWriter:
    """One task attempt's writer: buffers its rows, and at `close` rewrites each of their
    buckets with the merged rows."""

    def __init__(self, target: IcebergUpsertTarget, attempt: TaskAttempt) -> None:
        self.target = target
        self.attempt = attempt
        self._batches: list[pa.RecordBatch] = []
        self._newest_ms: dict[str, int] = {}

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self._batches.append(batch)
            for key, ms in newest_record_ms(batch).items():
                self._newest_ms[key] = max(ms, self._newest_ms.get(key, ms))

    def close(self) -> tuple[list[FileWrite], dict[str, Any]]:
        from lakesink.protocol.write_status import FileWrite

        if not self._batches:
            return [], {}
        rows = pa.Table.from_batches(self._batches)
        self._batches = []
        layout = self.target.layout
        _check_rows(layout, rows)
        if OPERATION_COLUMN not in rows.column_names:  # a stream of upserts
            code = pa.array(np.full(rows.num_rows, RowOperation.UPDATE.code, np.int8))
            rows = rows.append_column(OPERATION_COLUMN, code)
        schema = _schema(self.target.context)
        data = pa.schema([f for f in rows.schema if f.name not in CHANGE_COLUMNS])
        # a column the table lacks (or of another type) is refused, never dropped
        check_compatible(schema, required_keys(data, layout.key), self.target.context.table)
        buckets = buckets_of(rows, layout, schema)
        stored_files = dict(self.target.files)
        written: list[DataFileDescription] = []
        replaced: list[DataFileDescription] = []
        read: dict[str, list[str]] = {}
        for bucket in sorted({int(b) for b in buckets}):
            incoming = rows.filter(pa.array(buckets == bucket))
            files = stored_files.get(bucket, ())
            written += self._rewrite(bucket, incoming, files)
            replaced += files
            read[str(bucket)] = [d.path for d in files]
        out = [FileWrite("", d.path, d.path, d.record_count, d.size_bytes) for d in written]
        return out, {
            FILES_KEY: [d.to_json() for d in written],
            REPLACED_KEY: [d.to_json() for d in replaced],
            BUCKETS_KEY: read,
            MAX_TS_KEY: self._newest_ms,
        }

    def _rewrite(
        self, bucket: int, incoming: pa.Table, files: Sequence[DataFileDescription]
    ) -> list[DataFileDescription]:
        """The bucket's new data files: its stored rows with the batch's versions folded over
        them (none when every key is gone)."""
        context = self.target.context
        layout = self.target.layout
        stored = _read_rows(context, files)
        merged = merge_over(stored, incoming, layout.key, layout.ordering)
        if merged.num_rows == 0:
            return []
        # the stored rows' schema is the table's, with its required columns (the identifier
        # fields among them): the fold leaves no null there, but its result says nullable
        merged = merged.cast(stored.schema)
        name = f"{self.target.instant_time}-{self.target.token}-{self.attempt.name}-b{bucket}"
        return write_data_files(context, merged, attempt_id=name)


def _read_rows(context: WriteContext, files: Sequence[DataFileDescription]) -> pa.Table:
    """The rows of a bucket's data files under the table's schema (empty without files)."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.table import FileScanTask

    metadata = _parsed(context.metadata_json)
    schema = metadata.schema()
    if not files:
        return schema.as_arrow().empty_table()
    io = context.file_io(metadata.location)
    version = metadata.format_version
    scan = ArrowScan(metadata, io, schema, AlwaysTrue())
    rows = scan.to_table([FileScanTask(to_data_file(d, version)) for d in files])
    expected = sum(d.record_count for d in files)
    if rows.num_rows != expected:
        from lakesink.errors import CorruptTableError

        raise CorruptTableError(
            f"table {context.table}: data files {[d.path for d in files][:3]} hold "
            f"{rows.num_rows} rows, their manifests say {expected}"
        )
    return rows


def _check_rows(layout: KeyedLayout, rows: pa.Table) -> None:
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


@dataclass(frozen=True, slots=True)
class BucketRewrite:
    """What one batch's overwrite replaces: the data files it removes, and per bucket it
    rewrote the paths it read, which the bucket must still hold, no more, no fewer."""

    layout: KeyedLayout
    removed: tuple[DataFileDescription, ...]
    read: Mapping[int, frozenset[str]]

    @classmethod
    def from_extras(cls, layout: KeyedLayout, extras: Sequence[Mapping[str, Any]]) -> BucketRewrite:
        """From the tasks' `WriteStatus.extra` maps."""
        removed: dict[str, DataFileDescription] = {}
        read: dict[int, frozenset[str]] = {}
        for extra in extras:
            for d in extra.get(REPLACED_KEY, ()):
                desc = DataFileDescription.from_json(d)
                removed[desc.path] = desc
            for bucket, paths in (extra.get(BUCKETS_KEY) or {}).items():
                if int(bucket) in read:  # the shuffle gives each bucket to one task
                    raise CommitError(
                        f"bucket {bucket} was rewritten by two tasks of one batch; the batch is "
                        "not committed (retrying it is safe)"
                    )
                read[int(bucket)] = frozenset(paths)
        return cls(layout, tuple(removed[p] for p in sorted(removed)), read)

    def check(self, table: Table) -> None:
        """CommitConflictError naming a bucket whose files in `table`'s current snapshot are not
        the ones the batch read (another writer or a rewrite changed it since)."""
        if not self.read:
            return
        found = bucket_files(table, self.layout)
        for bucket, paths in sorted(self.read.items()):
            now = frozenset(d.path for d in found.get(bucket, ()))
            if now != paths:
                gone, new = sorted(paths - now), sorted(now - paths)
                raise CommitConflictError(
                    f"table {'.'.join(table.name())}: bucket {bucket} changed since the batch "
                    f"read it (files gone: {gone[:2]}, new: {new[:2]}); another writer or a "
                    "rewrite committed it; the batch is written again over its files"
                )
