"""Merge-on-read writes by key into an Iceberg table of keys (iceberg.write.mode=merge-on-read):
position-delete files and one row-delta snapshot per batch, and the rewrite that applies them.

A batch's rows are shuffled by bucket as for copy-on-write (lakesink.formats.iceberg.upsert). The
key -> position index is the bucket scan of step 1: the driver plans the current snapshot once per
batch (`bucket_contents`: every bucket's live data files with the position-delete files that
apply to each); a task reads its buckets' files in file order, drops the positions already
deleted, folds the batch's versions over the live rows (`merge_over`, the same rule as
copy-on-write) and so learns, per key, the row a winning version supersedes. It writes
- the new rows as data files;
- per data file that loses rows, one Iceberg v2 position-delete file (`file_path`, `pos`, sorted
  by position as the spec asks, its `file_path` bounds equal: a file-scoped delete, which every
  reader matches to its one data file by path);
and reports both with, per bucket, the paths of the data and delete files it read
(`BUCKETS_KEY`). Equality deletes are never written: pyiceberg and DuckDB could not read them.

The coordinator commits one snapshot (`RowDelta.stage`): a DATA manifest of the new data files,
a DELETES manifest of the new delete files, every other manifest kept; operation `overwrite`
(`delete` when the batch added no rows), through a snapshot producer of lakesink's own built on
pyiceberg's (pyiceberg 0.12 writes only data manifests). It is committed on the snapshot where
each bucket still holds exactly the files the batch read (`RowDelta.check`, then the catalog's
requirement that `main` did not move): a concurrent rewrite of a referenced data file, or another
batch's deletes in the bucket, fails it with CommitConflictError and the sink writes the batch
again over the new files, so no superseded row comes back and no row is lost.

`apply_position_deletes` (lakesink iceberg rewrite-data-files) rewrites every data file that has
deletes without its deleted rows and removes it and its file-scoped delete files, in one
`replace` snapshot that requires `main` not to have moved (a batch that added deletes meanwhile
makes it plan again: its deletes are never dropped).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakesink.engine.fold import merge_over
from lakesink.errors import CorruptTableError
from lakesink.formats.iceberg.datafiles import (
    DataFileDescription,
    WriteContext,
    describe,
    to_data_file,
    write_data_files,
)
from lakesink.formats.iceberg.keyed import KeyedLayout, planned_once
from lakesink.formats.iceberg.keyed_writer import (
    BucketWrite,
    KeyedWriter,
    bucket_ids,
    check_buckets_unchanged,
    files_and_reads,
    keyed_layout,
    parsed_metadata,
)
from lakesink.formats.iceberg.on_base import commit_on_base, transaction

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table, Transaction

    from lakesink.formats.task import TaskAttempt

__all__ = [
    "DELETES_KEY",
    "BucketFile",
    "IcebergRowDeltaTarget",
    "RowDelta",
    "apply_position_deletes",
    "bucket_contents",
    "write_position_deletes",
]

DELETES_KEY = "iceberg.position-deletes"
"""`WriteStatus.extra`: the JSON forms of the position-delete files a task wrote."""
PATH_FIELD_ID = 2147483546
"""The reserved field ids of a position-delete file's columns (Iceberg spec)."""
POS_FIELD_ID = 2147483545
# the stored rows' coordinates through the fold; null on the batch's versions
_FILE = "__lakesink_file"
_POS = "__lakesink_pos"


@dataclass(frozen=True, slots=True)
class BucketFile:
    """A live data file of a bucket with the position-delete files that apply to it."""

    data: DataFileDescription
    deletes: tuple[DataFileDescription, ...] = ()

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.data.path, *(d.path for d in self.deletes))


def bucket_contents(table: Table, layout: KeyedLayout) -> Mapping[int, tuple[BucketFile, ...]]:
    """The data files of each bucket in the table's current snapshot, each with its delete files
    (pyiceberg's planning matches them by sequence number, partition and path), planned once
    per snapshot (`planned_once`). A file of another spec than the bucket spec:
    UnsupportedTableError (rewrite it first)."""
    return planned_once(table, ("with deletes", layout), lambda: _plan_contents(table, layout))


def _plan_contents(table: Table, layout: KeyedLayout) -> dict[int, tuple[BucketFile, ...]]:
    from lakesink.errors import UnsupportedTableError

    name = ".".join(table.name())
    out: dict[int, list[BucketFile]] = {}
    for task in table.scan().plan_files():
        f = task.file
        if f.spec_id != layout.spec_id:
            raise UnsupportedTableError(
                f"table {name}: data file {f.file_path} was written under partition spec "
                f"{f.spec_id}, not the table's bucket spec {layout.spec_id}; rewrite it first"
            )
        bucket = layout.bucket_of_partition(tuple(f.partition[i] for i in range(len(f.partition))))
        deletes = sorted((describe(d, d.spec_id) for d in task.delete_files), key=lambda d: d.path)
        out.setdefault(bucket, []).append(BucketFile(describe(f, f.spec_id), tuple(deletes)))
    return {b: tuple(sorted(fs, key=lambda x: x.data.path)) for b, fs in out.items()}


@dataclass(frozen=True, slots=True)
class IcebergRowDeltaTarget:
    """Where Spark tasks write by key on a merge-on-read table of keys (a
    `lakesink.formats.task.KeyedTaskTarget`): as `IcebergUpsertTarget`, with each bucket's data
    files and their delete files as of the batch's start."""

    context: WriteContext
    instant_time: str
    layout: KeyedLayout
    files: tuple[tuple[int, tuple[BucketFile, ...]], ...] = ()
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @classmethod
    def for_table(
        cls, table: Table, context: WriteContext, instant_time: str
    ) -> IcebergRowDeltaTarget:
        layout = keyed_layout(table, context)
        found = bucket_contents(table, layout)
        return cls(context, instant_time, layout, tuple(sorted(found.items())))

    def group_ids(self, batch: pa.RecordBatch) -> pa.Array:
        """The bucket of each row: a task gets whole buckets."""
        return bucket_ids(batch, self.layout, self.context)

    @property
    def fold_key(self) -> tuple[tuple[str, ...], str | None]:
        """The key and ordering the writer folds by (`merge_over`): a
        `lakesink.formats.task.FoldingTaskTarget`, the read tasks may pre-fold."""
        return self.layout.key, self.layout.ordering

    def open(self, attempt: TaskAttempt) -> IcebergRowDeltaWriter:
        return IcebergRowDeltaWriter(self, attempt)


class IcebergRowDeltaWriter(KeyedWriter[IcebergRowDeltaTarget]):
    """One task attempt's writer: buffers its rows; at `close`, per bucket, the new rows' data
    files and the position deletes of the rows they supersede (`DELETES_KEY`)."""

    files_key = DELETES_KEY

    @functools.cached_property
    def _stored_files(self) -> dict[int, tuple[BucketFile, ...]]:
        return dict(self.target.files)

    def write_bucket(self, bucket: int, incoming: pa.Table, name: str) -> BucketWrite:
        files = self._stored_files.get(bucket, ())
        new, gone = fold_bucket(self.target.context, self.target.layout, files, incoming, name)
        return BucketWrite(new, gone, [p for f in files for p in f.paths])


def fold_bucket(
    context: WriteContext,
    layout: KeyedLayout,
    files: Sequence[BucketFile],
    incoming: pa.Table,
    name: str,
) -> tuple[list[DataFileDescription], list[DataFileDescription]]:
    """One bucket's batch: the data files of its new rows and the position-delete files of the
    stored rows they supersede (or a winning delete removes)."""
    stored = live_rows(context, files)
    tagged = incoming.append_column(_FILE, pa.nulls(incoming.num_rows, pa.string()))
    tagged = tagged.append_column(_POS, pa.nulls(incoming.num_rows, pa.int64()))
    merged = merge_over(stored, tagged, layout.key, layout.ordering)
    kept = merged.filter(pc.is_valid(merged.column(_POS)))
    new = merged.filter(pc.is_null(merged.column(_POS))).drop_columns([_FILE, _POS])
    # the fold keeps a stored row as it was: what it does not keep is superseded or deleted
    survivors = set(zip(kept.column(_FILE).to_pylist(), kept.column(_POS).to_pylist(), strict=True))
    gone: dict[str, list[int]] = {}
    for path, pos in zip(
        stored.column(_FILE).to_pylist(), stored.column(_POS).to_pylist(), strict=True
    ):
        if (path, pos) not in survivors:
            gone.setdefault(path, []).append(pos)
    written: list[DataFileDescription] = []
    if new.num_rows:
        # the stored schema has the table's required columns (identifier fields among them)
        new = new.cast(pa.schema([f for f in stored.schema if f.name not in (_FILE, _POS)]))
        written = write_data_files(context, new, attempt_id=name)
    by_path = {f.data.path: f.data for f in files}
    deletes = [
        write_position_deletes(context, by_path[path], positions, f"{name}-{n}")
        for n, (path, positions) in enumerate(sorted(gone.items()))
    ]
    return written, deletes


def live_rows(context: WriteContext, files: Sequence[BucketFile]) -> pa.Table:
    """The live rows of a bucket's data files under the table's schema, each with its data
    file path and position (`_FILE`, `_POS`): every file read whole in file order, the
    positions its delete files name dropped."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.table import FileScanTask

    metadata = parsed_metadata(context.metadata_json)
    schema = metadata.schema()
    empty = schema.as_arrow().empty_table()
    empty = empty.append_column(_FILE, pa.array([], pa.string()))
    empty = empty.append_column(_POS, pa.array([], pa.int64()))
    if not files:
        return empty
    io = context.file_io(metadata.location)
    scan = ArrowScan(metadata, io, schema, AlwaysTrue())
    parts = [empty]
    for f in files:
        rows = scan.to_table([FileScanTask(to_data_file(f.data, metadata.format_version))])
        if rows.num_rows != f.data.record_count:
            raise CorruptTableError(
                f"table {context.table}: data file {f.data.path} holds {rows.num_rows} rows, "
                f"its manifest says {f.data.record_count}"
            )
        positions = np.arange(rows.num_rows, dtype=np.int64)
        deleted = deleted_positions(io, f.data.path, f.deletes)
        keep = ~np.isin(positions, deleted)
        rows = rows.append_column(_FILE, pa.array([f.data.path] * rows.num_rows, pa.string()))
        rows = rows.append_column(_POS, pa.array(positions))
        parts.append(rows.filter(pa.array(keep)).cast(empty.schema))
    return pa.concat_tables(parts)


def deleted_positions(
    io: FileIO, data_path: str, deletes: Iterable[DataFileDescription]
) -> np.ndarray[Any, Any]:
    """The positions of `data_path` that its position-delete files name."""
    import pyarrow.parquet as pq

    out = [np.empty(0, np.int64)]
    for d in deletes:
        with io.new_input(d.path).open() as stream:
            rows = pq.read_table(stream, columns=["file_path", "pos"])
        mine = rows.filter(pc.equal(rows.column("file_path"), data_path))
        out.append(mine.column("pos").to_numpy().astype(np.int64))
    return np.concatenate(out)


_DELETE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), False, {b"PARQUET:field_id": str(PATH_FIELD_ID)}),
        pa.field("pos", pa.int64(), False, {b"PARQUET:field_id": str(POS_FIELD_ID)}),
    ]
)


def write_position_deletes(
    context: WriteContext, data: DataFileDescription, positions: Sequence[int], name: str
) -> DataFileDescription:
    """One position-delete file of `data` (a file-scoped delete: its `file_path` bounds are the
    data file's path), its positions sorted, next to the data file; described as a data file
    (its partition and spec are the data file's, the driver makes it a delete file)."""
    import struct

    import pyarrow.parquet as pq

    metadata = parsed_metadata(context.metadata_json)
    io = context.file_io(metadata.location)
    pos = np.sort(np.asarray(positions, dtype=np.int64))
    rows = pa.table(
        [pa.array([data.path] * len(pos), pa.string()), pa.array(pos)], schema=_DELETE_SCHEMA
    )
    folder = data.path.rsplit("/", 1)[0]
    path = f"{folder}/{uuid.uuid5(uuid.NAMESPACE_URL, 'lakesink-deletes:' + name)}-deletes.parquet"
    output = io.new_output(path)
    with output.create(overwrite=True) as stream:
        pq.write_table(rows, stream)
    size = len(io.new_input(path))
    path_bytes = data.path.encode()
    return DataFileDescription(
        path=path,
        size_bytes=size,
        record_count=len(pos),
        spec_id=data.spec_id,
        partition=data.partition,
        value_counts={PATH_FIELD_ID: len(pos), POS_FIELD_ID: len(pos)},
        null_value_counts={PATH_FIELD_ID: 0, POS_FIELD_ID: 0},
        lower_bounds={PATH_FIELD_ID: path_bytes, POS_FIELD_ID: struct.pack("<q", int(pos[0]))},
        upper_bounds={PATH_FIELD_ID: path_bytes, POS_FIELD_ID: struct.pack("<q", int(pos[-1]))},
    )


def to_delete_file(desc: DataFileDescription, format_version: int) -> DataFile:
    """The pyiceberg DataFile (content position deletes) of a delete file's description."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    # pyiceberg writes no referenced_data_file in a v2 manifest: the equal file_path bounds
    # say which data file it names (pyiceberg's delete index and Iceberg's Java read them so)
    f = DataFile.from_args(
        _table_format_version=format_version,  # type: ignore[arg-type]
        content=DataFileContent.POSITION_DELETES,
        file_path=desc.path,
        file_format=FileFormat.PARQUET,
        partition=Record(*desc.partition),
        record_count=desc.record_count,
        file_size_in_bytes=desc.size_bytes,
        value_counts=dict(desc.value_counts),
        null_value_counts=dict(desc.null_value_counts),
        lower_bounds=dict(desc.lower_bounds),
        upper_bounds=dict(desc.upper_bounds),
    )
    f.spec_id = desc.spec_id
    return f


# -- the snapshot ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RowDelta:
    """What one merge-on-read batch adds beside its data files: its position-delete files, and
    per bucket it touched the paths of the data and delete files it read, which the bucket
    must still hold, no more, no fewer."""

    layout: KeyedLayout
    deletes: tuple[DataFileDescription, ...]
    read: Mapping[int, frozenset[str]]

    @classmethod
    def from_extras(cls, layout: KeyedLayout, extras: Sequence[Mapping[str, Any]]) -> RowDelta:
        """From the tasks' `WriteStatus.extra` maps."""
        return cls(layout, *files_and_reads(extras, DELETES_KEY))

    def check(self, table: Table) -> None:
        """CommitConflictError naming a bucket whose data or delete files in `table`'s current
        snapshot are not the ones the batch read (a rewrite, or another batch, changed it)."""
        if not self.read:
            return
        found = bucket_contents(table, self.layout)
        now = {b: frozenset(p for f in files for p in f.paths) for b, files in found.items()}
        check_buckets_unchanged(".".join(table.name()), self.read, now)

    def stage(
        self,
        tx: Transaction,
        io: FileIO,
        files: Sequence[DataFileDescription],
        properties: Mapping[str, str],
    ) -> None:
        """Stage the row-delta snapshot in `tx`: `files` as data, the deletes as delete files."""
        from pyiceberg.table.snapshots import Operation

        version = tx.table_metadata.format_version
        producer = _row_delta_type()(
            operation=Operation.OVERWRITE if files else Operation.DELETE,
            transaction=tx,
            io=io,
            snapshot_properties=dict(properties),
        )
        with producer as delta:
            for f in files:
                delta.append_data_file(to_data_file(f, version))
            for d in self.deletes:
                delta.append_data_file(to_delete_file(d, version))


def _row_delta_type() -> Any:
    """A snapshot producer adding and removing data and delete files: pyiceberg's, with a
    DELETES manifest for delete files (built on first use: pyiceberg is optional)."""
    global _ROW_DELTA_CLASS
    if _ROW_DELTA_CLASS is not None:
        return _ROW_DELTA_CLASS
    from pyiceberg.exceptions import ValidationException
    from pyiceberg.manifest import (
        DataFileContent,
        ManifestContent,
        ManifestEntry,
        ManifestEntryStatus,
        ManifestFile,
        ManifestWriterV2,
    )
    from pyiceberg.table.snapshots import Summary
    from pyiceberg.table.update.snapshot import _SnapshotProducer

    class DeleteManifestWriter(ManifestWriterV2):
        """pyiceberg's v2 manifest writer for a DELETES manifest."""

        def content(self) -> ManifestContent:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    class RowDeltaFiles(_SnapshotProducer["RowDeltaFiles"]):
        """Adds data and delete files (`append_data_file`, split by content) and removes them
        (`delete_data_file`): manifests holding a removed file are written again without it
        (its entry marked deleted), in a manifest of their own content; a removed file that is
        not live in the base fails the commit (ValidationException). `publish_as`: the
        operation written (pyiceberg's totals only know append, overwrite and delete)."""

        publish_as: Any = None

        def _writer(self, spec_id: int, content: Any) -> Any:
            if content == ManifestContent.DATA:
                return self.new_manifest_writer(self.spec(spec_id))
            return DeleteManifestWriter(
                self.spec(spec_id),
                self.schema(),
                self.new_manifest_output(),
                self._snapshot_id,
                self._compression,
            )

        def _deleted_entries(self) -> list[ManifestEntry]:
            return []

        def _existing_manifests(self) -> list[ManifestFile]:
            return []

        def _manifests(self) -> list[ManifestFile]:
            out: list[ManifestFile] = []
            removed = {f.file_path for f in self._deleted_data_files}
            found: set[str] = set()
            snapshot = self._transaction.table_metadata.snapshot_by_name(self._target_branch)
            for manifest in snapshot.manifests(self._io) if snapshot is not None else ():
                live = manifest.has_added_files() or manifest.has_existing_files()
                if not removed:  # a batch's row delta removes nothing: no manifest is read
                    if live:
                        out.append(manifest)
                    continue
                entries = manifest.fetch_manifest_entry(self._io, discard_deleted=True)
                if not any(e.data_file.file_path in removed for e in entries):
                    if live:
                        out.append(manifest)
                    continue
                with self._writer(manifest.partition_spec_id, manifest.content) as writer:
                    for e in entries:
                        if e.data_file.file_path in removed:
                            found.add(e.data_file.file_path)
                            writer.delete(e)
                        else:
                            writer.existing(e)
                out.append(writer.to_manifest_file())
            if missing := sorted(removed - found):
                raise ValidationException(f"Missing required files to delete: {', '.join(missing)}")
            for content in (ManifestContent.DATA, ManifestContent.DELETES):
                wanted = (
                    DataFileContent.DATA
                    if content == ManifestContent.DATA
                    else DataFileContent.POSITION_DELETES
                )
                by_spec: dict[int, list[Any]] = {}
                for f in self._added_data_files:
                    if f.content == wanted:  # a delete file has its data file's spec
                        by_spec.setdefault(int(f.spec_id), []).append(f)
                for spec_id, added in sorted(by_spec.items()):
                    with self._writer(spec_id, content) as writer:
                        for f in added:
                            writer.add(
                                ManifestEntry.from_args(
                                    status=ManifestEntryStatus.ADDED,
                                    snapshot_id=self._snapshot_id,
                                    data_file=f,
                                )
                            )
                    out.insert(0, writer.to_manifest_file())
            return out

        def _summary(self, snapshot_properties: Mapping[str, str] = EMPTY) -> Any:
            built = super()._summary(dict(snapshot_properties))
            if self.publish_as is None:
                return built
            return Summary(operation=self.publish_as, **built.additional_properties)

        def _validate_concurrency(self) -> None:
            # lakesink's callers require `main` not to have moved (no pyiceberg retry)
            return None

    _ROW_DELTA_CLASS = RowDeltaFiles
    return RowDeltaFiles


EMPTY: Mapping[str, str] = {}
_ROW_DELTA_CLASS: Any = None


# -- applying the deletes ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppliedDeletes:
    """What one application of position deletes rewrote."""

    removed: tuple[str, ...]
    """The data files rewritten and the delete files dropped."""
    added: tuple[str, ...]
    rows: int
    data_files: int
    delete_files: int
    snapshot_id: int | None


def apply_position_deletes(
    table: Table, summary: Mapping[str, str], target_file_bytes: int
) -> AppliedDeletes | None:
    """Rewrite every live data file that has delete files without its deleted rows, in one
    `replace` snapshot that removes those data files and their file-scoped delete files (a
    delete file naming several data files stays until none of them is live: it then applies to
    nothing). None when no data file has deletes. Raises pyiceberg's CommitFailedException
    when `main` moved meanwhile (the new files are deleted: plan again on fresh metadata)."""
    from pyiceberg.exceptions import CommitFailedException, ValidationException
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.table.snapshots import Operation

    from lakesink.formats.iceberg.rewrite import _delete_quietly, _write_rows

    current = table.current_snapshot()
    if current is None:
        return None
    if current.summary is not None and current.summary.get("total-delete-files") == "0":
        return None  # the snapshot's totals say so: no planning on a table without deletes
    tasks = [t for t in table.scan().plan_files() if t.delete_files]
    if not tasks:
        return None
    rewritten = {t.file.file_path for t in tasks}
    scoped = {d.file_path: d for t in tasks for d in t.delete_files if _path_bound(d) in rewritten}
    added: list[DataFile] = []
    rows = 0
    committing = False
    try:
        scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
        by_partition: dict[tuple[int, tuple[Any, ...]], list[Any]] = {}
        for t in tasks:
            key = (t.file.spec_id, tuple(t.file.partition[i] for i in range(len(t.file.partition))))
            by_partition.setdefault(key, []).append(t)
        for (spec_id, _), group in sorted(by_partition.items(), key=lambda kv: repr(kv[0])):
            if spec_id != table.metadata.default_spec_id:
                from lakesink.errors import UnsupportedTableError

                raise UnsupportedTableError(
                    f"table {'.'.join(table.name())}: data files of partition spec {spec_id} "
                    "have deletes; only the current spec's are rewritten"
                )
            data = scan.to_table(group)  # the deletes applied by pyiceberg's reader
            rows += data.num_rows
            if data.num_rows:
                on_disk = sum(int(t.file.file_size_in_bytes) for t in group)
                added.extend(_write_rows(table, data, on_disk, target_file_bytes))
        tx = transaction(table)
        producer = _row_delta_type()(
            operation=Operation.OVERWRITE, transaction=tx, io=table.io,
            snapshot_properties=dict(summary),
        )  # fmt: skip
        producer.publish_as = Operation.REPLACE
        with producer as delta:
            for t in tasks:
                delta.delete_data_file(t.file)
            for d in scoped.values():
                delta.delete_data_file(d)
            for f in added:
                delta.append_data_file(f)
        committing = True
        commit_on_base(tx)
    except Exception as e:
        if not committing or isinstance(e, ValidationException | CommitFailedException):
            _delete_quietly(table, [f.file_path for f in added])
        raise
    return AppliedDeletes(
        tuple(sorted([*rewritten, *scoped])),
        tuple(f.file_path for f in added),
        rows,
        len(rewritten),
        len(scoped),
        table.metadata.current_snapshot_id,
    )


def _path_bound(delete_file: DataFile) -> str | None:
    """The one data file a delete file names, from its equal `file_path` bounds."""
    lower = (delete_file.lower_bounds or {}).get(PATH_FIELD_ID)
    upper = (delete_file.upper_bounds or {}).get(PATH_FIELD_ID)
    return lower.decode() if lower is not None and lower == upper else None
