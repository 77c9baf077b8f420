"""Writes by key into a merge-on-read table with a simple bucket index (`table.type` =
MERGE_ON_READ): each batch is a deltacommit that adds one new log file to each file group whose
rows it changes.

The task works as the copy-on-write writer does (`lakesink.formats.hudi.table.upsert`): it folds
the batch's versions of each bucket over the rows the bucket's latest slice reads as (its base
file merged with its log files, `merge_slice`), under lakesink's ordering rule. It then writes
only the difference: a Parquet data block of the rows a version of this batch won (in the base
file's schema: the data columns with the meta columns before them) and a delete block of the
keys a delete of this batch removed, each carrying the winning delete's ordering value. As the
log file is the newest block of its slice, every reader (Hudi 1.2.0, hudi-rs, lakesink's
reader) merges it as the fold: a row of it won over the slice's row by the rule, so it wins by
the merge mode too (a higher ordering value, or an equal one and a later block). One exception:
a version ranking below a delete still in the slice's log stays hidden, where the fold (which
forgot the applied delete) would insert it again (docs/cdc.md, until compaction); it is not
written, so no reader compares it with the delete under its own rule for nulls. Writing
the fold's winners only, rather than every version, also keeps the rule's tie-breaker (the
later Kafka offset) where the merge mode knows only block order.

A bucket without a file group gets a base file (the copy-on-write writer's), as Hudi's writers
do with an index that cannot find keys in log files: every reader reads a deltacommit's base
files, and the group's first slice then has a base file for compaction to rewrite.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lakesink.engine.fold import fold_by_key, merge_over
from lakesink.errors import CorruptTableError
from lakesink.formats.hudi.table.avro_schema import (
    META_COLUMNS,
    avro_schema_for,
    with_meta_columns,
)
from lakesink.formats.hudi.table.delete_records import DeleteRecord, ordering_values
from lakesink.formats.hudi.table.file_group import FileSlice
from lakesink.formats.hudi.table.files import write_token
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.log_file import (
    DeltaWrite,
    LogFileName,
    is_log_file_name,
    write_log_file,
)
from lakesink.formats.hudi.table.merge_on_read import merge_slice_with_deletes
from lakesink.formats.hudi.table.upsert import (
    HudiUpsertTaskTarget,
    HudiUpsertWriter,
    fit_stored_rows,
)
from lakesink.formats.hudi.table.view import FileSystemView
from lakesink.formats.hudi.table.writer import record_keys
from lakesink.protocol.mutation import OPERATION_COLUMN, UNAVAILABLE_COLUMN, RowOperation
from lakesink.protocol.write_status import FileWrite

if TYPE_CHECKING:
    from lakesink.formats.task import TaskAttempt

__all__ = ["HudiDeltaTaskTarget", "HudiDeltaWriter", "delta_writes"]

_COMMIT_TIME, _SEQNO = "_hoodie_commit_time", "_hoodie_commit_seqno"
_DELETE = RowOperation.DELETE.code


@dataclass(frozen=True, slots=True)
class HudiDeltaTaskTarget(HudiUpsertTaskTarget):
    """Where Spark tasks write by key on a merge-on-read table: as `HudiUpsertTaskTarget`,
    its `base_files` being each bucket's latest slice with its log files."""

    def open(self, attempt: TaskAttempt) -> HudiDeltaWriter:
        return HudiDeltaWriter(self, write_token(attempt.partition, attempt.stage, attempt.number))


class HudiDeltaWriter(HudiUpsertWriter):
    """One task attempt's writer of a deltacommit: at `close`, one log file per changed file
    group (a base file for a new one)."""

    def _write_group(
        self, path: str, bucket: int, incoming: pa.Table, previous: FileSlice | None
    ) -> tuple[FileWrite | None, str | None]:
        if previous is None:  # a new file group: a base file, as copy-on-write writes it
            return super()._write_group(path, bucket, incoming, previous)
        config = self.target.config
        data_schema = pa.schema(
            [f for f in incoming.schema if f.name not in (OPERATION_COLUMN, UNAVAILABLE_COLUMN)]
        )
        stored, hidden = self._stored_slice(previous, data_schema)
        versions = incoming
        for name in (_COMMIT_TIME, _SEQNO):  # a version of this batch: the new instant's
            versions = versions.append_column(name, pa.nulls(incoming.num_rows, pa.string()))
        merged = merge_over(stored, versions, config.record_key_fields, config.ordering_field)
        fresh = pc.is_null(merged.column(_COMMIT_TIME)).to_numpy(zero_copy_only=False)
        named = config.named_record_keys
        keys = record_keys(merged, config.record_key_fields, named=named).combine_chunks()
        fresh &= ~_below_logged_deletes(merged, keys, hidden, config.ordering_field)
        stored_keys = record_keys(stored, config.record_key_fields, named=named).combine_chunks()
        was_stored = pc.is_in(keys, value_set=stored_keys).to_numpy(zero_copy_only=False)
        removed = pc.invert(pc.is_in(stored_keys, value_set=keys)).to_numpy(zero_copy_only=False)
        if not fresh.any() and not removed.any():
            return None, None  # every version lost to the stored rows: nothing changes
        deletes = self._deletes(path, incoming, stored_keys.filter(pa.array(removed)))
        merged = self._stamp(merged, fresh)
        changed = merged.filter(pa.array(fresh))
        rows = self._log_block_rows(changed, data_schema, path, previous.file_id)
        avro = avro_schema_for(with_meta_columns(data_schema), f"{config.name}_record")
        delta = write_log_file(
            self.table,
            path,
            previous.file_id,
            self.instant_time,
            self.token,
            avro,
            rows=rows if rows.num_rows else None,
            deletes=deletes,
            base_file=previous.base_file_name,
            base_instant=previous.instant_time,
            previous_logs=previous.log_paths,
        )
        write = dataclasses.replace(
            delta.write,
            num_inserts=int((fresh & ~was_stored).sum()),
            num_update_writes=int((fresh & was_stored).sum()),
        )
        return write, avro

    def _stored_slice(
        self, previous: FileSlice, data_schema: pa.Schema
    ) -> tuple[pa.Table, pa.Table | None]:
        """(the rows the group's latest slice reads as, its base file merged with its log
        files, in the rows' schema with their commit time and seqno; the keys a delete in its
        log hides, with the delete's ordering value: `merge_slice_with_deletes`)."""
        schema = data_schema.append(pa.field(_COMMIT_TIME, pa.string())).append(
            pa.field(_SEQNO, pa.string())
        )
        base: pa.Table | None = None
        if previous.has_base_file:
            fs, root = self.table.storage.arrow()
            base = pq.read_table(f"{root}/{previous.path}", filesystem=fs, partitioning=None)
        if not previous.log_paths:
            return (schema.empty_table() if base is None else fit_stored_rows(base, schema)), None
        found, hidden = merge_slice_with_deletes(self.table, base, previous.log_paths)
        return fit_stored_rows(found, schema), hidden

    def _deletes(self, path: str, incoming: pa.Table, removed: pa.Array) -> list[DeleteRecord]:
        """A delete record of each removed key with the ordering value of the delete that won
        (none, Hudi's default, without an ordering field or when the delete has no value: such
        a delete only wins over versions without one either, and Hudi's default wins over
        every earlier version)."""
        if len(removed) == 0:
            return []
        config = self.target.config
        ordering = config.ordering_field
        if ordering is None:
            return [DeleteRecord(str(k), path) for k in removed.to_pylist()]
        winners = fold_by_key(incoming, config.record_key_fields, ordering)
        keys = record_keys(winners, config.record_key_fields, named=config.named_record_keys)
        winners = winners.filter(pc.is_in(keys, value_set=removed))
        if pc.any(pc.not_equal(winners.column(OPERATION_COLUMN), _DELETE)).as_py():
            raise CorruptTableError(  # merge_over removed a key only for a winning delete
                f"table {self.table.uri}: a key removed by instant {self.instant_time} has no "
                "winning delete"
            )
        keys = record_keys(winners, config.record_key_fields, named=config.named_record_keys)
        values = winners.column(ordering).combine_chunks()
        out: list[DeleteRecord] = []
        valued = pc.is_valid(values).to_numpy(zero_copy_only=False)
        branch, stored = (
            ordering_values(values.filter(pa.array(valued))) if valued.any() else (None, [])
        )
        it = iter(stored)
        for key, has_value in zip(keys.to_pylist(), valued, strict=True):
            if has_value and branch is not None:
                out.append(DeleteRecord(str(key), path, next(it), branch))
            else:
                out.append(DeleteRecord(str(key), path))
        return out

    def _log_block_rows(
        self, changed: pa.Table, data_schema: pa.Schema, path: str, file_id: str
    ) -> pa.Table:
        """The changed rows as a data block holds them: the meta columns (the file name column
        holding the file id, as Hudi writes log records) then the data columns, the base file's
        schema."""
        config = self.target.config
        n = changed.num_rows
        keys = record_keys(changed, config.record_key_fields, named=config.named_record_keys)
        meta = [
            changed.column(_COMMIT_TIME),
            changed.column(_SEQNO),
            keys,
            pa.chunked_array([pa.array([path] * n, pa.string())]),
            pa.chunked_array([pa.array([file_id] * n, pa.string())]),
        ]
        data = [changed.column(f.name) for f in data_schema]
        full = pa.Table.from_arrays([*meta, *data], names=[*META_COLUMNS, *data_schema.names])
        return full.cast(with_meta_columns(data_schema))


def delta_writes(table: HudiTable, writes: Sequence[FileWrite]) -> list[DeltaWrite]:
    """The `DeltaWrite` of each log file among a deltacommit's `writes`: its slice's base file
    and log files (those before it, from the table's completed timeline, and itself), for the
    write stats Hudi's `HoodieDeltaWriteStat` carries."""
    logs = [w for w in writes if is_log_file_name(w.path.rsplit("/", 1)[-1])]
    if not logs:
        return []
    groups = {(s.partition_path, s.file_id): s for s in FileSystemView(table).latest_base_files()}
    out: list[DeltaWrite] = []
    for w in logs:
        name = w.path.rsplit("/", 1)[-1]
        parsed = LogFileName.parse(name)
        before = groups.get((w.partition_path, w.file_id))
        earlier: tuple[str, ...] = ()
        base_file = ""
        if before is not None:
            base_file = before.base_file_name
            earlier = tuple(p.rsplit("/", 1)[-1] for p in before.log_paths if p != w.path)
        out.append(DeltaWrite(w, base_file, (*earlier, name), parsed.version))
    return out


def _below_logged_deletes(
    merged: pa.Table, keys: pa.Array, hidden: pa.Table | None, ordering: str | None
) -> np.ndarray:
    """Per row of `merged`: whether it ranks below a delete of its key still in the slice's
    log (a null ordering value below every value; a delete without one below nothing). Such a
    version stays hidden in every reader, so it is not written: written, Hudi's readers would
    compare it with the delete under their own rules for a null ordering value (Hudi's writers
    refuse one), where hudi-rs, Hudi 1.2.0 and lakesink differ."""
    below = np.zeros(merged.num_rows, dtype=bool)
    if hidden is None or ordering is None or hidden.num_rows == 0:
        return below
    at = pc.index_in(keys, value_set=hidden.column("_hoodie_record_key").combine_chunks())
    if at.null_count == len(at):
        return below
    value = merged.column(ordering).combine_chunks()
    delete_value = pc.take(hidden.column(ordering).combine_chunks().cast(value.type), at)
    ranks_below = pc.or_kleene(  # Kleene: a null comparison does not hide a true one
        pc.and_(pc.is_null(value), pc.is_valid(delete_value)), pc.less(value, delete_value)
    )
    return np.asarray(pc.fill_null(ranks_below, False).to_numpy(zero_copy_only=False))
