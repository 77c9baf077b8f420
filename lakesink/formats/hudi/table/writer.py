"""Base-file writers: Arrow rows in, Parquet base files with Hudi's meta columns out.

`BaseFileWriter` writes one partition, rolling to a new file group at the target size;
`PartitionedWriter` splits rows by partition and keeps one `BaseFileWriter` per partition.
Both are cheap to construct and picklable (paths and configs only): files are opened on the
first write, so they can be built on a Spark driver and used in an executor.
A marker is created before every data file, so rollback can always find it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lakesink.errors import CommitError, RecordError, SchemaMismatchError
from lakesink.formats.hudi.table.avro_schema import (
    META_COLUMNS,
    avro_schema_for,
    with_meta_columns,
)
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.evolution import SchemaFit
from lakesink.formats.hudi.table.files import base_file_name, new_file_id, write_token
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.markers import create_marker
from lakesink.formats.hudi.table.rollback import is_rolled_back
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.write_status import FileWrite
from lakesink.settings import SchemaEvolutionMode
from lakesink.storage import Storage
from lakesink.storage.base import StorageError

if TYPE_CHECKING:
    from lakesink.formats.task import TaskAttempt

__all__ = [
    "BaseFileWriter",
    "HudiTaskTarget",
    "HudiTaskWriter",
    "PartitionedWriter",
    "avro_schema_for",
    "record_keys",
]

log = logging.getLogger(__name__)

DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024
MAX_ROW_GROUP_ROWS = 1024 * 1024
NULL_KEY = "__null__"
EMPTY_KEY = "__empty__"
Compression = Literal["zstd", "snappy", "none"]


def _as_table(rows: pa.RecordBatch | pa.Table) -> pa.Table:
    return pa.Table.from_batches([rows]) if isinstance(rows, pa.RecordBatch) else rows


def _key_strings(col: pa.ChunkedArray, name: str) -> pa.ChunkedArray:
    try:
        s = pc.cast(col, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise SchemaMismatchError(
            f"record key column {name!r} has type {col.type}, which cannot form a record key; "
            "use a string, number, date or timestamp column"
        ) from e
    t = col.type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)):
        # numbers, dates, timestamps never render as "": only nulls need replacing
        return pc.fill_null(s, NULL_KEY) if s.null_count else s
    s = pc.if_else(pc.equal(s, ""), EMPTY_KEY, s)
    return pc.fill_null(s, NULL_KEY)


_STRING_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
COORDINATE_COLUMNS = ("kafka_topic", "kafka_partition", "kafka_offset")


def _has_strings(t: pa.DataType) -> bool:
    if any(is_type(t) for is_type in _STRING_TYPES):
        return True
    return any(_has_strings(t.field(i).type) for i in range(t.num_fields))


def _invalid_utf8_path(arr: pa.Array, path: str) -> str | None:
    """The path of the first string column (at any depth) in `arr` holding bytes that are not
    valid UTF-8, else None. Full validation of each string array, about 7 ms per million
    short strings."""
    t = arr.type
    if any(is_type(t) for is_type in _STRING_TYPES):
        try:
            arr.validate(full=True)
        except pa.ArrowInvalid:
            return path
        return None
    if pa.types.is_struct(t):
        for i, child in enumerate(arr.flatten()):  # flatten() honours the slice offset
            found = _invalid_utf8_path(child, f"{path}.{t.field(i).name}")
            if found:
                return found
        return None
    if pa.types.is_map(t):  # keys and items are whole children: cut them to the slice
        first, end = (arr.offsets[0].as_py(), arr.offsets[-1].as_py()) if len(arr) else (0, 0)
        return _invalid_utf8_path(
            arr.keys.slice(first, end - first), f"{path}.key"
        ) or _invalid_utf8_path(arr.items.slice(first, end - first), f"{path}.value")
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _invalid_utf8_path(arr.flatten(), f"{path}[]")
    return None


def _first_invalid_row(col: pa.ChunkedArray) -> int:
    """The index of the first row of `col` holding invalid UTF-8 (bisecting: O(log n) checks)."""
    arr = col.combine_chunks()
    lo, hi = 0, len(arr)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _invalid_utf8_path(arr.slice(lo, mid - lo), "") is not None:
            hi = mid
        else:
            lo = mid
    return lo


def check_utf8(data: pa.Table, where: str) -> None:
    """Refuses rows whose string columns (at any nesting depth) hold bytes that are not valid
    UTF-8, whatever produced them (a deserializer, a SQL cast from binary, a Python function):
    Parquet strings must be UTF-8, and one such value makes hudi-rs refuse the whole table."""
    for name in data.column_names:
        col = data.column(name)
        if not _has_strings(col.type):
            continue
        found = next(
            (p for chunk in col.chunks if (p := _invalid_utf8_path(chunk, name)) is not None),
            None,
        )
        if found is None:
            continue
        row = _first_invalid_row(col)
        at = ""
        if all(c in data.column_names for c in COORDINATE_COLUMNS):
            topic, partition, offset = (data.column(c)[row].as_py() for c in COORDINATE_COLUMNS)
            at = f" (first in the row of Kafka record {topic}:{partition} offset {offset})"
        raise RecordError(
            f"string column {found!r} holds bytes that are not valid UTF-8{at}; {where} is "
            "refused and nothing of it is published. Decode such values as BINARY, or fix the "
            "transformation that made them (e.g. a CAST of binary data AS STRING)"
        )


def record_keys(
    table: pa.Table, key_fields: tuple[str, ...], *, named: bool = False
) -> pa.ChunkedArray:
    """`_hoodie_record_key`: the value for one key field, Hudi's complex key
    `f1:v1,f2:v2` for several (null → `__null__`, empty → `__empty__`). `named`: the complex
    form `f1:v1` for one key field too, as the table's key generator makes it
    (`TableConfig.named_record_keys`)."""
    for f in key_fields:
        if f not in table.column_names:
            raise SchemaMismatchError(
                f"record key column {f!r} is missing; rows have {', '.join(table.column_names)}"
            )
    if len(key_fields) == 1 and not named:
        return _key_strings(table.column(key_fields[0]), key_fields[0])
    # A field with one value over all the rows (the topic and partition of a Kafka range, in
    # the default key) is rendered once, into the text between the fields that vary.
    parts: list[str | pa.ChunkedArray] = []
    text = ""
    for i, f in enumerate(key_fields):
        text += f"{',' if i else ''}{f}:"
        column = table.column(f)
        constant = _constant_key(column, f)
        if constant is not None:
            text += constant
            continue
        if text:
            parts.append(text)
        parts.append(_key_strings(column, f))
        text = ""
    if not any(isinstance(part, pa.ChunkedArray) for part in parts):
        return pa.chunked_array([pa.repeat(text, table.num_rows)], pa.string())
    if text:
        parts.append(text)
    return pc.binary_join_element_wise(*parts, "")


def _constant_key(column: pa.ChunkedArray, name: str) -> str | None:
    """The key text of `column` when every row holds the same (non-null) value, else None.
    Only integer and string columns are looked at: min and max are cheap there."""
    t = column.type
    if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
        return None
    if len(column) == 0 or column.null_count:
        return None
    bounds = pc.min_max(column)
    if bounds["min"] != bounds["max"]:
        return None
    one: str = _key_strings(column.slice(0, 1), name)[0].as_py()
    return one


class BaseFileWriter:
    """Writes rows of one partition of one instant into Parquet base files, each a new file
    group. Input rows hold the data columns (any `_hoodie_*` columns are recomputed, except
    that `preserve_commit_time=True` keeps incoming `_hoodie_commit_time`/`_hoodie_commit_seqno`,
    as clustering must)."""

    def __init__(
        self,
        table: HudiTable,
        partition_path: str,
        instant_time: InstantTime | str,
        write_token: str,
        *,
        target_file_size_bytes: int = DEFAULT_TARGET_FILE_SIZE,
        compression: Compression = "zstd",
        row_group_bytes: int | None = None,
        table_schema: str | None = None,
        preserve_commit_time: bool = False,
        file_id_factory: Callable[[], str] = new_file_id,
        evolution: SchemaEvolutionMode | None = None,
        partition_exists: bool = False,
    ) -> None:
        """`partition_exists`: the partition's `.hoodie_partition_metadata` is known to exist
        (a completed commit wrote into the partition): not asked for again."""
        if target_file_size_bytes <= 0:
            raise ValueError(
                f"target_file_size_bytes must be positive, got {target_file_size_bytes}"
            )
        self.table = table
        self.partition_path = partition_path
        self.instant_time = InstantTime(str(instant_time))
        self.write_token = write_token
        self.task_partition_id = int(write_token.split("-")[0])
        self.target_file_size_bytes = target_file_size_bytes
        self.compression = compression
        self.row_group_bytes = row_group_bytes or max(
            1, min(64 * 1024 * 1024, target_file_size_bytes // 4)
        )
        self.table_schema = table_schema
        self._fit = (
            SchemaFit(table_schema, f"{table.config.name}_record", evolution)
            if table_schema is not None
            else None
        )
        self.preserve_commit_time = preserve_commit_time
        self.file_id_factory = file_id_factory
        self.partition_exists = partition_exists
        self.records_written = 0
        self._schema: pa.Schema | None = None  # full schema (meta + data) of the files
        self._done: list[FileWrite] = []
        self._closed = False
        # open-file state
        self._file: IO[bytes] | None = None
        self._writer: pq.ParquetWriter | None = None
        self._file_id = ""
        self._file_name = ""
        self._file_rows = 0
        self._buffer: list[pa.Table] = []
        self._buffer_bytes = 0

    # -- public ------------------------------------------------------------------------------

    @property
    def arrow_schema(self) -> pa.Schema | None:
        """The schema of the files written (meta columns first), once rows arrived."""
        return self._schema

    @property
    def avro_schema(self) -> str | None:
        """The Avro schema JSON of the rows (meta columns included) for the commit metadata."""
        if self._schema is None:
            return None
        return avro_schema_for(self._schema, f"{self.table.config.name}_record")

    def write(self, rows: pa.RecordBatch | pa.Table) -> None:
        """Append rows; they are buffered into row groups and rolled into files by size."""
        if self._closed:
            raise ValueError("writer is closed")
        tbl = _as_table(rows)
        if tbl.num_rows == 0:
            return
        data = self._fit_rows(tbl.drop_columns([c for c in tbl.column_names if c in META_COLUMNS]))
        check_utf8(data, f"the batch of instant {self.instant_time} for {self.table.uri}")
        if self._schema is None:
            self._schema = with_meta_columns(data.schema)
        elif data.schema != pa.schema(list(self._schema)[len(META_COLUMNS) :]):
            try:
                data = data.cast(pa.schema(list(self._schema)[len(META_COLUMNS) :]))
            except (pa.ArrowInvalid, ValueError) as e:
                raise SchemaMismatchError(
                    f"rows for {self.partition_path or '(unpartitioned)'} changed schema within "
                    f"instant {self.instant_time}: {e}"
                ) from e
        kept = tbl if self.preserve_commit_time else None
        self._buffer.append(self._with_meta_placeholder(data, kept))
        self._buffer_bytes += data.nbytes
        if (
            self._buffer_bytes >= self.row_group_bytes
            or sum(b.num_rows for b in self._buffer) >= MAX_ROW_GROUP_ROWS
        ):
            self._flush()

    def write_empty(self, data_schema: pa.Schema) -> None:
        """Write a file of no rows when nothing was written yet: a file group whose rows were
        all deleted keeps a slice, so that readers stop reading its previous one."""
        if self._closed:
            raise ValueError("writer is closed")
        if self._done or self._writer is not None or self._buffer:
            return
        data = self._fit_rows(
            pa.schema([f for f in data_schema if f.name not in META_COLUMNS]).empty_table()
        ).schema
        if self._schema is None:
            self._schema = with_meta_columns(data)
        self._open_file()

    def close(self) -> list[FileWrite]:
        """Flush and close; the write stats of every file written (in order)."""
        if not self._closed:
            self._flush()
            self._close_file()
            self._closed = True
        return list(self._done)

    def abort(self) -> list[str]:
        """Close and delete every file written; returns their relative paths. Markers stay
        (rollback reads them)."""
        paths = [w.path for w in self.close()]
        if self._file_name:
            paths.append(self._rel_path(self._file_name))
        for rel in paths:
            self.table.storage.delete(rel)
        self._done.clear()
        return sorted(set(paths))

    # -- internals ---------------------------------------------------------------------------

    def _fit_rows(self, data: pa.Table) -> pa.Table:
        """The rows as the table takes them (evolving its schema when allowed: SchemaFit)."""
        if self._fit is None:
            return data
        return self._fit.fit(data, f"rows for instant {self.instant_time} in {self.table.uri}")

    def _with_meta_placeholder(self, data: pa.Table, kept: pa.Table | None) -> pa.Table:
        n = data.num_rows
        config = self.table.config
        keys = record_keys(data, config.record_key_fields, named=config.named_record_keys)
        if kept is not None and "_hoodie_commit_time" in kept.column_names:
            commit_time = kept.column("_hoodie_commit_time").cast(pa.string())
            seqno = (
                kept.column("_hoodie_commit_seqno").cast(pa.string())
                if "_hoodie_commit_seqno" in kept.column_names
                else self._seqnos(n)
            )
        else:
            commit_time = pa.chunked_array([pa.repeat(self.instant_time.value, n)], pa.string())
            seqno = self._seqnos(n)
        cols = [commit_time, seqno, keys, pa.chunked_array([pa.nulls(n, pa.string())])]
        cols.append(pa.chunked_array([pa.nulls(n, pa.string())]))  # file name: set on flush
        meta = pa.table(dict(zip(META_COLUMNS, cols, strict=True)))
        return pa.Table.from_arrays(
            meta.columns + data.columns, names=list(META_COLUMNS) + data.column_names
        )

    def _seqnos(self, n: int) -> pa.ChunkedArray:
        start = self.records_written
        self.records_written += n
        prefix = f"{self.instant_time.value}_{self.task_partition_id}_"
        # start, start + 1, ...: a cumulative sum of ones (a Python range is 30x slower)
        nums = pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), n), start=start - 1)
        seqnos = pc.binary_join_element_wise(prefix, pc.cast(nums, pa.string()), "")
        return pa.chunked_array([seqnos])

    def _rel_path(self, file_name: str) -> str:
        return f"{self.partition_path}/{file_name}" if self.partition_path else file_name

    def _open_file(self) -> None:
        assert self._schema is not None
        if not self.partition_exists:
            self.table.ensure_partition(self.partition_path, self.instant_time)
            self.partition_exists = True
        self._file_id = self.file_id_factory()
        self._file_name = base_file_name(self._file_id, self.write_token, self.instant_time)
        create_marker(self.table.storage, self.instant_time, self.partition_path, self._file_name)
        self._file = self.table.storage.open_output(self._rel_path(self._file_name))
        self._writer = pq.ParquetWriter(
            self._file,
            self._schema,
            compression=self.compression,
            write_statistics=True,
            use_dictionary=True,
        )
        self._file_rows = 0

    def _flush(self) -> None:
        if not self._buffer:
            return
        assert self._schema is not None
        chunk = pa.concat_tables(self._buffer)
        self._buffer, self._buffer_bytes = [], 0
        offset = 0
        while offset < chunk.num_rows:
            if self._writer is None:
                self._open_file()
            assert self._writer is not None and self._file is not None
            piece = chunk.slice(offset, MAX_ROW_GROUP_ROWS)
            offset += piece.num_rows
            n = piece.num_rows
            piece = piece.set_column(
                META_COLUMNS.index("_hoodie_partition_path"),
                pa.field("_hoodie_partition_path", pa.string()),
                pa.repeat(self.partition_path, n),
            ).set_column(
                META_COLUMNS.index("_hoodie_file_name"),
                pa.field("_hoodie_file_name", pa.string()),
                pa.repeat(self._file_name, n),
            )
            self._writer.write_table(piece.cast(self._schema), row_group_size=MAX_ROW_GROUP_ROWS)
            self._file_rows += n
            if self._file.tell() >= self.target_file_size_bytes:
                self._close_file()

    def _close_file(self) -> None:
        if self._writer is None or self._file is None:
            return
        self._writer.close()
        self._file.flush()
        size = self._file.tell()
        if self.table.is_local:
            os.fsync(self._file.fileno())
        rel = self._rel_path(self._file_name)
        try:
            self._file.close()  # on an object store the object appears whole here
        except OSError as e:  # an upload opened lazily reports the store's refusal here
            raise StorageError(
                f"cannot write {rel} of {self.table.uri}: {str(e).splitlines()[0]}"
            ) from None
        if is_rolled_back(self.table, self.instant_time):
            # hudi-rs would read this file of an instant that is no longer on the timeline
            self.table.storage.delete(rel)
            self._writer, self._file, self._file_name, self._file_rows = None, None, "", 0
            raise CommitError(
                f"instant {self.instant_time} was rolled back while this task wrote {rel} "
                "(a fenced or stalled writer?); the file is deleted, nothing of it is visible"
            )
        self._done.append(
            FileWrite(
                partition_path=self.partition_path,
                file_id=self._file_id,
                path=rel,
                num_writes=self._file_rows,
                file_size_bytes=size,
                prev_commit="null",
                num_inserts=self._file_rows,
                total_write_bytes=size,
            )
        )
        log.debug(
            "table %s instant %s: wrote %s (%d rows)",
            self.table.uri,
            self.instant_time,
            rel,
            self._file_rows,
        )
        self._writer, self._file, self._file_name, self._file_rows = None, None, "", 0


class PartitionedWriter:
    """Splits rows by the table's partition columns and writes each partition through its own
    `BaseFileWriter`. Construct with a table (or a base path and config) and the instant."""

    def __init__(
        self,
        table: HudiTable | str | Path | Storage,
        instant_time: InstantTime | str,
        write_token: str,
        *,
        target_file_size_bytes: int = DEFAULT_TARGET_FILE_SIZE,
        compression: Compression = "zstd",
        table_schema: str | None = None,
        check_schema: bool = True,
        preserve_commit_time: bool = False,
        config: TableConfig | None = None,
        evolution: SchemaEvolutionMode | None = None,
        table_schema_known: bool = False,
        known_partitions: frozenset[str] = frozenset(),
    ) -> None:
        """`table_schema_known`: `table_schema` is the table's latest schema (None: it has
        none yet), read by the caller; else the writer reads it from the timeline.
        `known_partitions`: partitions whose `.hoodie_partition_metadata` exists (written into
        by a completed commit): their writers do not ask for it."""
        if isinstance(table, HudiTable):
            self.table = table
        elif config is not None:
            self.table = HudiTable(table, config)
        else:
            self.table = HudiTable.open(table)
        self.instant_time = InstantTime(str(instant_time))
        self.write_token = write_token
        self.target_file_size_bytes = target_file_size_bytes
        self.compression: Compression = compression
        self.table_schema = table_schema
        self.check_schema = check_schema
        self.preserve_commit_time = preserve_commit_time
        self.evolution = evolution
        self._schema_resolved = table_schema_known or table_schema is not None or not check_schema
        self.known_partitions = known_partitions
        self._writers: dict[str, BaseFileWriter] = {}

    def __getstate__(self) -> dict[str, object]:
        if self._writers:
            raise TypeError("a PartitionedWriter with open files cannot be pickled")
        return self.__dict__.copy()

    def _resolve_schema(self) -> None:
        if not self._schema_resolved:
            self.table_schema = self.table.timeline().latest_schema()
            self._schema_resolved = True

    def writer_for(self, partition_path: str) -> BaseFileWriter:
        w = self._writers.get(partition_path)
        if w is None:
            self._resolve_schema()
            w = BaseFileWriter(
                self.table,
                partition_path,
                self.instant_time,
                self.write_token,
                target_file_size_bytes=self.target_file_size_bytes,
                compression=self.compression,
                table_schema=self.table_schema if self.check_schema else None,
                preserve_commit_time=self.preserve_commit_time,
                evolution=self.evolution,
                partition_exists=partition_path in self.known_partitions,
            )
            self._writers[partition_path] = w
        return w

    def write(self, rows: pa.RecordBatch | pa.Table) -> None:
        tbl = _as_table(rows)
        if tbl.num_rows == 0:
            return
        fields = self.table.config.partition_fields
        if not fields:
            self.writer_for("").write(tbl)
            return
        for f in fields:
            if f not in tbl.column_names:
                raise SchemaMismatchError(
                    f"partition column {f!r} is missing; rows have {', '.join(tbl.column_names)}"
                )
        for path, part in self._split(tbl, fields):
            self.writer_for(path).write(part)

    def _split(self, tbl: pa.Table, fields: tuple[str, ...]) -> Iterable[tuple[str, pa.Table]]:
        idx_name = "__lakesink_row__"
        keyed = tbl.select(list(fields)).append_column(
            idx_name, pa.array(range(tbl.num_rows), pa.int64())
        )
        groups = keyed.group_by(list(fields), use_threads=False).aggregate([(idx_name, "list")])
        lists = groups.column(f"{idx_name}_list")
        for g in range(groups.num_rows):
            values = {f: groups.column(f)[g].as_py() for f in fields}
            path = self.table.partition_path_for(values)
            indices = lists[g].values
            yield path, tbl.take(indices)

    @property
    def avro_schema(self) -> str | None:
        for w in self._writers.values():
            if w.avro_schema is not None:
                return w.avro_schema
        return None

    @property
    def records_written(self) -> int:
        return sum(w.records_written for w in self._writers.values())

    def close(self) -> list[FileWrite]:
        out: list[FileWrite] = []
        for path in sorted(self._writers):
            out.extend(self._writers[path].close())
        return out

    def abort(self) -> list[str]:
        out: list[str] = []
        for w in self._writers.values():
            out.extend(w.abort())
        return sorted(out)


@dataclass(frozen=True, slots=True)
class HudiTaskTarget:
    """Where Spark tasks write on a Hudi table (a `lakesink.formats.task.TaskTarget`): the table
    and the instant their base files belong to."""

    storage: Storage
    config: TableConfig
    instant_time: str
    target_file_size: int
    evolution: SchemaEvolutionMode | None = None  # schema.evolution of the writer's table
    # the table's latest schema as the driver read it when the instant began (None: none yet),
    # when `schema_known`: no task lists the timeline and reads a commit for it
    table_schema: str | None = None
    schema_known: bool = False
    # the partitions the latest completed commit of that timeline wrote into: their partition
    # metadata exists (written before any of the commit's files; never deleted)
    known_partitions: frozenset[str] = frozenset()

    def open(self, attempt: TaskAttempt) -> HudiTaskWriter:
        return HudiTaskWriter(
            PartitionedWriter(
                self.storage,
                InstantTime(self.instant_time),
                write_token(attempt.partition, attempt.stage, attempt.number),
                target_file_size_bytes=self.target_file_size,
                config=self.config,
                evolution=self.evolution,
                table_schema=self.table_schema,
                table_schema_known=self.schema_known,
                known_partitions=self.known_partitions,
            )
        )


class HudiTaskWriter:
    """A task attempt's `PartitionedWriter`; its status carries the Avro schema of the rows
    written (`schema`), which the commit records."""

    def __init__(self, writer: PartitionedWriter) -> None:
        self.writer = writer

    def write(self, batch: pa.RecordBatch) -> None:
        self.writer.write(batch)

    def close(self) -> tuple[list[FileWrite], dict[str, Any]]:
        schema = self.writer.avro_schema
        return self.writer.close(), ({"schema": schema} if schema else {})
