"""Reading a merge-on-read file slice, and the deltacommit metadata that lists its log files.

A slice's rows are its base file's rows (none for a slice of log files only) merged by record
key with the records of its log files' blocks, in order, under the table's merge mode: with
EVENT_TIME_ORDERING the version with the higher ordering value wins and equal values go to the
later block; with COMMIT_TIME_ORDERING the later block wins. A delete record is a version too:
when it wins, the key is gone (a later or higher version brings it back). This is lakesink's
fold (`lakesink.engine.fold.fold_by_key`) with the position of a version in the slice (base
rows first, then each block's records) as its offset.

As Hudi's readers do, the log's versions of a key are merged first and their winner then with
the base row: the two steps are one fold but for a delete without an ordering value (Hudi's
default, an `IntWrapper` of 0, what Spark SQL's DELETE writes; hudi-rs 0.5.0 orders it by commit
time alone). Among the log's versions it wins over every earlier one and loses to
every later one; as the log's winner it removes the base row, otherwise the base row is merged
with the log's winner as usual.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakesink.engine.fold import fold_by_key
from lakesink.errors import UnsupportedTableError
from lakesink.formats.hudi.table.avro_schema import META_SCHEMA
from lakesink.formats.hudi.table.config import RecordMergeMode
from lakesink.formats.hudi.table.delete_records import DeleteRecord, ordering_python_value
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.log_file import BlockType, DeltaWrite, read_log_file
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.timeline import EncodedCommit
from lakesink.protocol.instant import Action, Instant, TimelineLayout
from lakesink.protocol.mutation import RowOperation

__all__ = ["encode_delta_commit", "merge_slice", "merge_slice_with_deletes"]

_KEY = "_hoodie_record_key"
_SEQ, _PART, _OP = "__lakesink_seq", "__lakesink_part", "__lakesink_op"
_UPSERT, _DELETE = RowOperation.UPDATE.code, RowOperation.DELETE.code

# a data block's rows or a delete block's records
_Item: TypeAlias = pa.Table | tuple[DeleteRecord, ...]


def merge_slice(table: HudiTable, base: pa.Table | None, log_paths: Sequence[str]) -> pa.Table:
    """The rows of a slice: `base` (its base file's rows; None: none) merged with the blocks of
    `log_paths` (relative paths, in order). UnsupportedTableError for a block lakesink does not
    read (Avro data, command and CDC blocks)."""
    return merge_slice_with_deletes(table, base, log_paths)[0]


def merge_slice_with_deletes(
    table: HudiTable, base: pa.Table | None, log_paths: Sequence[str]
) -> tuple[pa.Table, pa.Table]:
    """(the rows of the slice, as `merge_slice`; the winning deletes of its log: a row per key
    a delete still in the log hides, in the rows' schema with the meta columns, holding the
    record key and the delete's ordering value, null for a delete without one)."""
    items: list[_Item] = []
    schema = base.schema if base is not None else None
    for rel in log_paths:
        where = f"{table.uri}/{rel}"
        for block in read_log_file(table, rel):
            if block.block_type is BlockType.PARQUET_DATA:
                rows = block.rows(where)
                schema = schema or rows.schema
                items.append(rows)
            elif block.block_type is BlockType.DELETE:
                items.append(block.deletes(where))
            else:
                raise UnsupportedTableError(
                    f"log file {where}: a {block.block_type.name} block at offset "
                    f"{block.offset}; lakesink reads Parquet data and delete blocks only"
                )
    if schema is None:  # deletes only: no row survives, and no version can rank below them
        return META_SCHEMA.empty_table(), META_SCHEMA.empty_table()
    config = table.config
    ordering = (
        config.ordering_field if config.merge_mode is RecordMergeMode.EVENT_TIME_ORDERING else None
    )
    if ordering is not None and ordering not in schema.names:
        raise UnsupportedTableError(
            f"table {table.uri} orders versions by {ordering!r}, a column its rows do not have"
        )
    parts: list[tuple[pa.Table, int]] = []
    resets: dict[str, int] = {}  # key -> position of its last delete without ordering value
    position = base.num_rows if base is not None else 0
    for content in items:
        if isinstance(content, pa.Table):
            part = _conform(content, schema)
            parts.append((part, _UPSERT))
        else:
            part = _delete_rows(content, schema, ordering)
            parts.append((part, _DELETE))
            for i, r in enumerate(content):
                if ordering is not None and r.is_unordered:
                    resets[r.record_key] = position + i
        position += part.num_rows
    folding = {"partition_column": _PART, "offset_column": _SEQ, "operation_column": _OP}
    log = _numbered(parts, base.num_rows if base is not None else 0)
    if resets:
        log = _after_resets(log, resets)
    winners = fold_by_key(log, [_KEY], ordering, **folding)
    if base is None:
        folded = winners
    else:
        stored = _numbered([(base, _UPSERT)], 0)
        if resets:  # the log's winning deletes without ordering value remove the base row
            assert ordering is not None  # only an ordered table has such deletes
            unordered = pc.and_(
                pc.equal(winners.column(_OP), _DELETE), pc.is_null(winners.column(ordering))
            )
            gone = winners.filter(unordered).column(_KEY)
            stored = stored.filter(pc.invert(pc.is_in(stored.column(_KEY), value_set=gone)))
        folded = fold_by_key(pa.concat_tables([stored, winners]), [_KEY], ordering, **folding)
    kept = folded.filter(pc.not_equal(folded.column(_OP), _DELETE))
    hidden = folded.filter(pc.equal(folded.column(_OP), _DELETE))
    return kept.drop_columns([_SEQ, _PART, _OP]), hidden.drop_columns([_SEQ, _PART, _OP])


def _conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """A block's rows in the slice's schema, by name: a missing column null, an extra dropped."""
    columns = []
    for f in schema:
        if f.name in rows.column_names:
            columns.append(rows.column(f.name).cast(f.type))
        else:
            columns.append(pa.chunked_array([pa.nulls(rows.num_rows, f.type)]))
    return pa.Table.from_arrays(columns, schema=schema)


def _delete_rows(
    records: tuple[DeleteRecord, ...], schema: pa.Schema, ordering: str | None
) -> pa.Table:
    n = len(records)
    given: dict[str, list[Any]] = {
        _KEY: [r.record_key for r in records],
        "_hoodie_partition_path": [r.partition_path for r in records],
    }
    if ordering is not None:  # a delete without ordering value: lowest (see _after_resets)
        given[ordering] = [None if r.is_unordered else ordering_python_value(r) for r in records]
    columns = [
        pa.array(given[f.name]).cast(f.type) if f.name in given else pa.nulls(n, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _numbered(parts: list[tuple[pa.Table, int]], seq: int) -> pa.Table:
    """The versions in slice order with the fold's columns: the position (from `seq`), one
    partition, and the operation."""
    out: list[pa.Table] = []
    for t, op in parts:
        n = t.num_rows
        out.append(
            t.append_column(_SEQ, pa.array(np.arange(seq, seq + n, dtype=np.int64)))
            .append_column(_PART, pa.array(np.zeros(n, dtype=np.int32)))
            .append_column(_OP, pa.array(np.full(n, op, dtype=np.int8)))
        )
        seq += n
    return pa.concat_tables(out)


def _after_resets(versions: pa.Table, resets: dict[str, int]) -> pa.Table:
    """`versions` (of the log) less, for each key with a delete without ordering value, the
    versions before its last such delete and the deletes between it and the key's next upsert:
    a delete of a key that such a delete holds changes nothing (as Hudi 1.2.0 merges them)."""
    keys = pa.array(list(resets), pa.string())
    cut = pc.take(
        pa.array(list(resets.values()), pa.int64()),
        pc.index_in(versions.column(_KEY), value_set=keys),
    )
    seq, op = versions.column(_SEQ), versions.column(_OP)
    after = pc.fill_null(pc.greater(seq, cut), False)
    upserts = versions.filter(pc.and_(after, pc.equal(op, _UPSERT)))
    first = upserts.group_by(_KEY).aggregate([(_SEQ, "min")])
    next_upsert = pc.take(
        first.column(f"{_SEQ}_min"),
        pc.index_in(versions.column(_KEY), value_set=first.column(_KEY)),
    )
    held = pc.and_(
        pc.and_(after, pc.equal(op, _DELETE)),
        pc.fill_null(pc.less(seq, next_upsert), True),
    )
    before = pc.fill_null(pc.less(seq, cut), False)
    return versions.filter(pc.invert(pc.or_(before, held)))


def encode_delta_commit(
    layout: TimelineLayout,
    instant: Instant,
    metadata: CommitMetadata,
    deltas: Sequence[DeltaWrite],
) -> EncodedCommit:
    """The completed file of deltacommit `instant`: `metadata` (whose writes are the base files
    and the `deltas`' log files) with each log file's stat as Hudi's `HoodieDeltaWriteStat`
    writes it (`baseFile`, `logFiles`; version 6's JSON also `logVersion`, `logOffset`)."""
    if instant.action is not Action.DELTA_COMMIT:
        raise ValueError(f"{instant} is not a deltacommit")
    d = metadata.to_dict(layout, Action.DELTA_COMMIT)
    by_path = {delta.write.path: delta for delta in deltas}
    for stats in d["partitionToWriteStats"].values():
        for stat in stats:
            delta = by_path.pop(stat["path"], None)
            if delta is None:
                continue
            stat.update(delta.stat_fields())
            if layout is TimelineLayout.V1:
                stat.update({"logVersion": delta.log_version, "logOffset": 0})
    if by_path:
        raise ValueError(f"log files {sorted(by_path)} are not among the deltacommit's writes")
    content = CommitMetadata.encode(d, layout, Action.DELTA_COMMIT)
    return EncodedCommit(instant, metadata, d, content)
