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

import pyarrow as pa

from lakesink.engine.fold import merge_over
from lakesink.formats.iceberg.datafiles import (
    DataFileDescription,
    WriteContext,
    to_data_file,
    write_data_files,
)
from lakesink.formats.iceberg.keyed import KeyedLayout, bucket_files, live_paths
from lakesink.formats.iceberg.keyed_writer import (
    BucketWrite,
    KeyedWriter,
    bucket_ids,
    check_buckets_unchanged,
    files_and_reads,
    keyed_layout,
    parsed_metadata,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from lakesink.formats.task import TaskAttempt

__all__ = [
    "REPLACED_KEY",
    "BucketRewrite",
    "IcebergUpsertTarget",
    "IcebergUpsertWriter",
]

REPLACED_KEY = "iceberg.replaced"
"""`WriteStatus.extra`: the JSON forms of the data files a task's new files replace."""


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
        layout = keyed_layout(table, context)
        found = bucket_files(table, layout)
        return cls(context, instant_time, layout, tuple(sorted(found.items())))

    def group_ids(self, batch: pa.RecordBatch) -> pa.Array:
        """The bucket of each row: a task gets whole buckets."""
        return bucket_ids(batch, self.layout, self.context)

    @property
    def fold_key(self) -> tuple[tuple[str, ...], str | None]:
        """The key and ordering the writer folds by (`merge_over`): a
        `lakesink.formats.task.FoldingTaskTarget`, the read tasks may pre-fold."""
        return self.layout.key, self.layout.ordering

    def open(self, attempt: TaskAttempt) -> IcebergUpsertWriter:
        return IcebergUpsertWriter(self, attempt)


class IcebergUpsertWriter(KeyedWriter[IcebergUpsertTarget]):
    """One task attempt's writer: buffers its rows, and at `close` rewrites each of their
    buckets with the merged rows; reports the files they replace (`REPLACED_KEY`)."""

    files_key = REPLACED_KEY

    @functools.cached_property
    def _stored_files(self) -> dict[int, tuple[DataFileDescription, ...]]:
        return dict(self.target.files)

    def write_bucket(self, bucket: int, incoming: pa.Table, name: str) -> BucketWrite:
        files = self._stored_files.get(bucket, ())
        written = self._rewrite(incoming, files, name)
        return BucketWrite(written, list(files), [d.path for d in files])

    def _rewrite(
        self, incoming: pa.Table, files: Sequence[DataFileDescription], name: str
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
        return write_data_files(context, merged, attempt_id=name)


def _read_rows(context: WriteContext, files: Sequence[DataFileDescription]) -> pa.Table:
    """The rows of a bucket's data files under the table's schema (empty without files)."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.table import FileScanTask

    metadata = parsed_metadata(context.metadata_json)
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
        return cls(layout, *files_and_reads(extras, REPLACED_KEY))

    def check(self, table: Table) -> None:
        """CommitConflictError naming a bucket whose files in `table`'s current snapshot are not
        the ones the batch read (another writer or a rewrite changed it since)."""
        if not self.read:
            return
        found = bucket_files(table, self.layout)
        check_buckets_unchanged(".".join(table.name()), self.read, live_paths(found, self.read))
