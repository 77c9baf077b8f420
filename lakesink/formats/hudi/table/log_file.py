"""Log files of a merge-on-read table: the blocks a deltacommit appends to a file group.

A log file is named `.<fileId>_<instant>.log.<version>_<writeToken>`; the instant is the file
slice's base instant in table version 6 and the deltacommit's own instant in version 8. lakesink
writes one new log file per file group and deltacommit (never appends to one), so that rolling
the deltacommit back is deleting its files, found through their markers (`.marker.APPEND` in
version 6, `.marker.CREATE` in version 8, as Hudi 1.2.0 names a log file's marker).

A file is a sequence of blocks, each (big-endian, log format version 1):

    "#HUDI#"  int64 size (every byte after this field)  int32 format version (1)
    int32 block type  header  int64 content length  content  footer
    int64 block length (every byte of the block before this field, magic included)

a header or footer being an int32 count of (int32 key, int32 length, UTF-8 value) entries.
Data blocks are Parquet (block type 5): the content is a whole Parquet file of rows with the
meta columns, in the base file's schema, the header carrying the schema and the instant.
Parquet blocks rather than Avro ones: Hudi 1.2.0 and hudi-rs read both in either table version,
and Parquet keeps lakesink's Arrow types without an Avro round trip. A delete block (type 1)
holds format version 3, an int32 length and one Avro datum of `HoodieDeleteRecordList`: each
deleted key with its partition path and ordering value, in Hudi 1.2.0's union of wrapper
records (`lakesink.formats.hudi.table.delete_records`; hudi-rs refuses a null one and a block
mixing two types).
"""

from __future__ import annotations

import enum
import io
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lakesink.errors import CommitError, CorruptTableError, UnsupportedTableError
from lakesink.formats.hudi.table.avro_schema import META_COLUMNS, with_meta_columns
from lakesink.formats.hudi.table.delete_records import (
    DeleteRecord,
    OrderingBranch,
    decode_deletes,
    encode_deletes,
    ordering_python_value,
    ordering_values,
)
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.markers import MarkerType, create_marker
from lakesink.formats.hudi.table.writer import record_keys
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.write_status import FileWrite
from lakesink.storage import ObjectExistsError, ObjectNotFoundError

__all__ = [
    "BlockType",
    "DeleteRecord",
    "DeltaWrite",
    "HeaderKey",
    "LogBlock",
    "LogFileName",
    "OrderingBranch",
    "data_block",
    "delete_block",
    "is_log_file_name",
    "log_file_name_for",
    "log_rows",
    "ordering_python_value",
    "ordering_values",
    "read_log_blocks",
    "read_log_file",
    "write_log_file",
]

MAGIC = b"#HUDI#"
LOG_FORMAT_VERSION = 1
DELETE_CONTENT_VERSION = 3
LOG_EXTENSION = "log"
_LOG_NAME_RE = re.compile(r"^\.([A-Za-z0-9-]+)_(\d{17})\.log\.(\d+)_(\d+-\d+-\d+)$")


class BlockType(enum.IntEnum):
    """A block's type, Hudi's `HoodieLogBlockType` ordinal."""

    COMMAND = 0
    DELETE = 1
    CORRUPTED = 2
    AVRO_DATA = 3
    HFILE_DATA = 4
    PARQUET_DATA = 5
    CDC_DATA = 6


class HeaderKey(enum.IntEnum):
    """A header entry's key, Hudi's `HeaderMetadataType` ordinal."""

    INSTANT_TIME = 0
    TARGET_INSTANT_TIME = 1
    SCHEMA = 2
    COMMAND_BLOCK_TYPE = 3
    COMPACTED_BLOCK_TIMES = 4
    RECORD_POSITIONS = 5
    BLOCK_IDENTIFIER = 6


# -- names ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class LogFileName:
    """The parts of a log file name; ordered as readers order a slice's log files."""

    instant_time: InstantTime
    """The base instant (table version 6) or the deltacommit's instant (version 8)."""
    version: int
    write_token: str
    file_id: str

    def __post_init__(self) -> None:
        if self.version < 1:
            raise ValueError(f"log version {self.version} must be 1 or more")

    @property
    def name(self) -> str:
        return (
            f".{self.file_id}_{self.instant_time}.{LOG_EXTENSION}.{self.version}_{self.write_token}"
        )

    @classmethod
    def parse(cls, name: str) -> LogFileName:
        """CorruptTableError naming `name` if it is not a log file name."""
        m = _LOG_NAME_RE.match(name)
        if m is None:
            raise CorruptTableError(
                f"{name!r} is not a log file name; expected "
                ".<fileId>_<instantTime>.log.<version>_<p-s-a>"
            )
        return cls(InstantTime(m.group(2)), int(m.group(3)), m.group(4), m.group(1))


def is_log_file_name(name: str) -> bool:
    return _LOG_NAME_RE.match(name) is not None


# -- blocks -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogBlock:
    """One block: its type, header entries (in file order) and content bytes. `offset`: where
    the block starts in its file (read blocks only)."""

    block_type: BlockType
    header: tuple[tuple[HeaderKey, str], ...]
    content: bytes
    footer: tuple[tuple[HeaderKey, str], ...] = ()
    offset: int = field(default=0, compare=False)

    def get(self, key: HeaderKey) -> str | None:
        return next((v for k, v in self.header if k is key), None)

    @property
    def instant_time(self) -> InstantTime:
        value = self.get(HeaderKey.INSTANT_TIME)
        if value is None:
            raise CorruptTableError(f"the log block at offset {self.offset} names no instant")
        return InstantTime(value)

    def encode(self) -> bytes:
        header, footer = _metadata_bytes(self.header), _metadata_bytes(self.footer)
        size = 4 + 4 + len(header) + 8 + len(self.content) + len(footer) + 8
        body = b"".join(
            (
                MAGIC,
                struct.pack(">qii", size, LOG_FORMAT_VERSION, int(self.block_type)),
                header,
                struct.pack(">q", len(self.content)),
                self.content,
                footer,
            )
        )
        return body + struct.pack(">q", len(body))

    def rows(self, where: str = "log block") -> pa.Table:
        """The rows of a Parquet data block."""
        if self.block_type is not BlockType.PARQUET_DATA:
            raise UnsupportedTableError(
                f"{where}: a {self.block_type.name} block at offset {self.offset} holds no "
                "Parquet rows; lakesink reads Parquet data blocks and delete blocks"
            )
        try:
            return pq.read_table(io.BytesIO(self.content))
        except (pa.ArrowInvalid, OSError) as e:
            raise CorruptTableError(
                f"{where}: the Parquet data block at offset {self.offset} cannot be read: {e}"
            ) from e

    def deletes(self, where: str = "log block") -> tuple[DeleteRecord, ...]:
        """The records of a delete block."""
        if self.block_type is not BlockType.DELETE:
            raise ValueError(f"a {self.block_type.name} block holds no delete records")
        at = f"{where}: the delete block at offset {self.offset}"
        if len(self.content) < 8:
            raise CorruptTableError(f"{at} is too short ({len(self.content)} bytes)")
        version, length = struct.unpack(">ii", self.content[:8])
        if version != DELETE_CONTENT_VERSION:
            raise UnsupportedTableError(
                f"{at} has content version {version}; lakesink reads version "
                f"{DELETE_CONTENT_VERSION}"
            )
        if length != len(self.content) - 8:
            raise CorruptTableError(
                f"{at} says {length} bytes of records, holds {len(self.content) - 8}"
            )
        return decode_deletes(self.content[8:], at)


def _metadata_bytes(entries: Sequence[tuple[HeaderKey, str]]) -> bytes:
    out = [struct.pack(">i", len(entries))]
    for key, value in entries:
        raw = value.encode("utf-8")
        out.append(struct.pack(">ii", int(key), len(raw)) + raw)
    return b"".join(out)


def data_block(rows: pa.Table, instant_time: InstantTime, avro_schema: str) -> LogBlock:
    """A Parquet data block of `rows` (meta columns included) written by `instant_time`."""
    buf = io.BytesIO()
    pq.write_table(rows, buf, compression="zstd", write_statistics=True)
    # The header order Hudi 1.2.0 writes (its header map iterates the schema first)
    header = ((HeaderKey.SCHEMA, avro_schema), (HeaderKey.INSTANT_TIME, instant_time.value))
    return LogBlock(BlockType.PARQUET_DATA, header, buf.getvalue())


def delete_block(
    records: Sequence[DeleteRecord], instant_time: InstantTime, avro_schema: str
) -> LogBlock:
    """A delete block of `records` written by `instant_time`."""
    datum = encode_deletes(records)
    content = struct.pack(">ii", DELETE_CONTENT_VERSION, len(datum)) + datum
    header = ((HeaderKey.SCHEMA, avro_schema), (HeaderKey.INSTANT_TIME, instant_time.value))
    return LogBlock(BlockType.DELETE, header, content)


def read_log_blocks(data: bytes, where: str) -> list[LogBlock]:
    """Every block of a log file's bytes; CorruptTableError naming `where` and the offset of a
    block that is corrupt or cut short (a log file lakesink lists is whole: it never appends)."""
    blocks: list[LogBlock] = []
    pos = 0
    while pos < len(data):
        blocks.append(_read_block(data, pos, where))
        pos += len(MAGIC) + 8 + struct.unpack_from(">q", data, pos + len(MAGIC))[0]
    return blocks


def _read_block(data: bytes, start: int, where: str) -> LogBlock:
    def corrupt(why: str) -> CorruptTableError:
        return CorruptTableError(f"log file {where}: the block at offset {start} {why}")

    if data[start : start + len(MAGIC)] != MAGIC:
        return _raise(corrupt("does not start with #HUDI#"))
    if start + len(MAGIC) + 8 > len(data):
        return _raise(corrupt("is cut short before its size"))
    (size,) = struct.unpack_from(">q", data, start + len(MAGIC))
    end = start + len(MAGIC) + 8 + size
    if size < 4 + 4 + 4 + 8 + 4 + 8 or end > len(data):
        return _raise(corrupt(f"says {size} bytes follow, the file holds {len(data) - start - 14}"))
    (total,) = struct.unpack_from(">q", data, end - 8)
    if total != end - start - 8:
        return _raise(corrupt(f"ends with block length {total}, expected {end - start - 8}"))
    pos = start + len(MAGIC) + 8
    version, raw_type = struct.unpack_from(">ii", data, pos)
    pos += 8
    if version != LOG_FORMAT_VERSION:
        return _raise(corrupt(f"has log format version {version}; lakesink reads version 1"))
    try:
        block_type = BlockType(raw_type)
    except ValueError:
        return _raise(corrupt(f"has unknown block type {raw_type}"))
    try:
        header, pos = _read_metadata(data, pos, end - 8)
        (length,) = struct.unpack_from(">q", data, pos)
        pos += 8
        if length < 0 or pos + length > end - 8:
            return _raise(corrupt(f"says its content is {length} bytes, past the block's end"))
        content = data[pos : pos + length]
        footer, pos = _read_metadata(data, pos + length, end - 8)
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise corrupt(f"cannot be parsed: {e}") from e
    if pos != end - 8:
        return _raise(corrupt(f"has {end - 8 - pos} bytes after its footer"))
    return LogBlock(block_type, header, content, footer, start)


def _raise(error: CorruptTableError) -> LogBlock:
    raise error


def _read_metadata(
    data: bytes, pos: int, limit: int
) -> tuple[tuple[tuple[HeaderKey, str], ...], int]:
    (count,) = struct.unpack_from(">i", data, pos)
    pos += 4
    if count < 0 or count > 64:
        raise ValueError(f"{count} header entries")
    entries: list[tuple[HeaderKey, str]] = []
    for _ in range(count):
        key, length = struct.unpack_from(">ii", data, pos)
        pos += 8
        if length < 0 or pos + length > limit:
            raise ValueError(f"a header value of {length} bytes runs past the block")
        entries.append((HeaderKey(key), data[pos : pos + length].decode("utf-8")))
        pos += length
    return tuple(entries), pos


# -- writing one log file ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeltaWrite:
    """One log file a deltacommit wrote (Hudi's `HoodieDeltaWriteStat`): the write stat, the
    slice's base file name ("" when the group has none yet), the slice's log file names this one
    included, and the log version."""

    write: FileWrite
    base_file: str
    log_files: tuple[str, ...]
    log_version: int

    def stat_fields(self) -> dict[str, Any]:
        """The fields a deltacommit's write stat carries beyond a commit's."""
        return {"baseFile": self.base_file, "logFiles": list(self.log_files)}


def log_file_name_for(
    table: HudiTable,
    file_id: str,
    instant_time: InstantTime,
    write_token: str,
    *,
    base_instant: InstantTime | None,
    previous_logs: Iterable[str] = (),
) -> LogFileName:
    """The name of the one log file `instant_time` writes for a file group: version 6 names it
    by the slice's base instant (the deltacommit's own for a group without a base file) and the
    next version after the slice's logs; version 8 by the deltacommit, version 1."""
    if table.config.version >= 8:
        return LogFileName(instant_time, 1, write_token, file_id)
    named = base_instant or instant_time
    versions = [
        p.version
        for n in previous_logs
        if (p := LogFileName.parse(n.rsplit("/", 1)[-1])).instant_time == named
    ]
    return LogFileName(named, max(versions, default=0) + 1, write_token, file_id)


def log_rows(
    table: HudiTable,
    rows: pa.Table,
    partition_path: str,
    file_id: str,
    instant_time: InstantTime,
    task_partition: int,
    schema: pa.Schema | None = None,
) -> pa.Table:
    """`rows` (data columns) with Hudi's meta columns as a log block holds them (the file name
    column holds the file id, as Hudi writes it in log records), cast to `schema` (the base
    file's schema; default: the rows' own with the meta columns)."""
    data = rows.drop_columns([c for c in rows.column_names if c in META_COLUMNS])
    n = data.num_rows
    config = table.config
    keys = record_keys(data, config.record_key_fields, named=config.named_record_keys)
    seqnos = [f"{instant_time.value}_{task_partition}_{i}" for i in range(n)]
    meta = [
        pa.array([instant_time.value] * n, pa.string()),
        pa.array(seqnos, pa.string()),
        keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys,
        pa.array([partition_path] * n, pa.string()),
        pa.array([file_id] * n, pa.string()),
    ]
    full = pa.Table.from_arrays([*meta, *data.columns], names=[*META_COLUMNS, *data.column_names])
    target = schema if schema is not None else with_meta_columns(data.schema)
    try:
        return full.select(target.names).cast(target)
    except (KeyError, pa.ArrowInvalid, ValueError) as e:
        raise UnsupportedTableError(
            f"rows of instant {instant_time} for file group {file_id} do not fit the base "
            f"file's schema: {e}"
        ) from e


def write_log_file(
    table: HudiTable,
    partition_path: str,
    file_id: str,
    instant_time: InstantTime,
    write_token: str,
    avro_schema: str,
    *,
    rows: pa.Table | None = None,
    deletes: Sequence[DeleteRecord] = (),
    base_file: str = "",
    base_instant: InstantTime | None = None,
    previous_logs: Sequence[str] = (),
) -> DeltaWrite:
    """Write one new log file of a file group for deltacommit `instant_time`: a Parquet data
    block of `rows` (meta columns included: see `log_rows`), when there are rows, then the
    `deletes` (of keys not among the rows), one delete block per ordering value type. The
    marker comes first. CommitError if the file exists already (one log file per file group and
    deltacommit)."""
    if (rows is None or rows.num_rows == 0) and not deletes:
        raise ValueError("a log file needs rows or deletes")
    name = log_file_name_for(
        table,
        file_id,
        instant_time,
        write_token,
        base_instant=base_instant,
        previous_logs=previous_logs,
    )
    blocks: list[LogBlock] = []
    if rows is not None and rows.num_rows:
        blocks.append(data_block(rows, instant_time, avro_schema))
    by_branch: dict[OrderingBranch, list[DeleteRecord]] = {}
    for d in deletes:  # hudi-rs refuses a delete block mixing ordering value types
        by_branch.setdefault(d.branch, []).append(d)
    for same in by_branch.values():
        blocks.append(delete_block(same, instant_time, avro_schema))
    content = b"".join(b.encode() for b in blocks)
    marker: MarkerType = "CREATE" if table.config.version >= 8 else "APPEND"
    table.ensure_partition(partition_path, instant_time)
    create_marker(table.storage, instant_time, partition_path, name.name, marker)
    rel = f"{partition_path}/{name.name}" if partition_path else name.name
    try:
        table.storage.create(rel, content)
    except ObjectExistsError:
        raise CommitError(
            f"log file {table.uri}/{rel} exists already; deltacommit {instant_time} writes one "
            f"log file per file group"
        ) from None
    n_rows = rows.num_rows if rows is not None else 0
    write = FileWrite(
        partition_path=partition_path,
        file_id=file_id,
        path=rel,
        num_writes=n_rows,
        file_size_bytes=len(content),
        prev_commit=(base_instant or instant_time).value,
        total_write_bytes=len(content),
        num_update_writes=n_rows,
        num_deletes=len(deletes),
    )
    logs = (*(n.rsplit("/", 1)[-1] for n in previous_logs), name.name)
    return DeltaWrite(write, base_file, logs, name.version)


def read_log_file(table: HudiTable, rel: str) -> list[LogBlock]:
    """The blocks of a log file (relative path); CorruptTableError if it is missing."""
    try:
        data = table.storage.read(rel)
    except ObjectNotFoundError:
        raise CorruptTableError(
            f"log file {table.uri}/{rel} is missing; the table references a file that is gone"
        ) from None
    return read_log_blocks(data, f"{table.uri}/{rel}")
