"""What a Spark task does for an Iceberg table: write Arrow rows as Parquet data files with
Iceberg field ids under the table's location, and describe them.

The task gets a `WriteContext` (the table's metadata as JSON and the FileIO properties: small and
picklable), writes with pyiceberg's writer (partition splitting, target file size, column
statistics), and returns `DataFileDescription`s: plain values the driver turns back into
pyiceberg `DataFile`s for the commit (`to_data_file`). Every attempt writes under names of its
own (`attempt_id`), so a failed or duplicate attempt's files are never referenced: the commit only
uses described files, and orphan cleanup removes the rest.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakesink.errors import CorruptTableError, SchemaMismatchError
from lakesink.extras import require

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.table.metadata import TableMetadata

    from lakesink.formats.task import TaskAttempt
    from lakesink.protocol.write_status import FileWrite

__all__ = [
    "FILES_KEY",
    "MAX_TS_KEY",
    "DataFileDescription",
    "IcebergTarget",
    "IcebergTaskWriter",
    "WriteContext",
    "attempt_uuid",
    "describe",
    "to_data_file",
    "write_data_files",
]

PartitionValue = int | str | float | bool | bytes | None

FILES_KEY = "iceberg.files"
"""`WriteStatus.extra`: the JSON forms of the data files a task wrote (`DataFileDescription`)."""
MAX_TS_KEY = "max_timestamp_ms"
"""`WriteStatus.extra`: the newest record timestamp (ms) a task wrote per topic partition
(`TopicPartition.key()` -> ms); partitions without records are absent."""


@dataclass(frozen=True, slots=True)
class WriteContext:
    """What a task needs to write data files for one table version: its metadata (JSON) and
    the FileIO properties. The properties may hold credentials: repr never shows them."""

    table: str
    metadata_json: str = field(repr=False)
    io_properties: tuple[tuple[str, str], ...] = field(repr=False)
    conform_to: pa.Schema | None = field(default=None, repr=False)
    """The evolved Arrow schema rows are conformed to when the batch evolves the table."""
    widen_rows: bool = False
    """`schema.evolution` add-and-widen without a change: rows narrower than the table (an int
    into a long column, a nested field left out) are conformed to its current schema."""

    def metadata(self) -> TableMetadata:
        require("pyiceberg", "Iceberg tables")
        from pyiceberg.table.metadata import TableMetadataUtil

        return TableMetadataUtil.parse_raw(self.metadata_json)

    def file_io(self, location: str) -> FileIO:
        require("pyiceberg", "Iceberg tables")
        from pyiceberg.io import load_file_io

        return load_file_io(dict(self.io_properties), location)


@dataclass(frozen=True, slots=True)
class DataFileDescription:
    """One written Parquet data file, as the commit needs it: path, size, record count,
    partition values (in spec order) and Iceberg column statistics keyed by field id."""

    path: str
    size_bytes: int
    record_count: int
    spec_id: int
    partition: tuple[PartitionValue, ...] = ()
    column_sizes: Mapping[int, int] = field(default_factory=dict)
    value_counts: Mapping[int, int] = field(default_factory=dict)
    null_value_counts: Mapping[int, int] = field(default_factory=dict)
    nan_value_counts: Mapping[int, int] = field(default_factory=dict)
    lower_bounds: Mapping[int, bytes] = field(default_factory=dict)
    upper_bounds: Mapping[int, bytes] = field(default_factory=dict)
    split_offsets: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """JSON-safe form (for the pending-commit store); bytes as base64."""

        def ints(m: Mapping[int, int]) -> dict[str, int]:
            return {str(k): int(v) for k, v in m.items()}

        def blobs(m: Mapping[int, bytes]) -> dict[str, str]:
            return {str(k): base64.b64encode(v).decode() for k, v in m.items()}

        return {
            "path": self.path,
            "size": self.size_bytes,
            "records": self.record_count,
            "spec": self.spec_id,
            "partition": [_encode_value(v) for v in self.partition],
            "column_sizes": ints(self.column_sizes),
            "value_counts": ints(self.value_counts),
            "null_value_counts": ints(self.null_value_counts),
            "nan_value_counts": ints(self.nan_value_counts),
            "lower_bounds": blobs(self.lower_bounds),
            "upper_bounds": blobs(self.upper_bounds),
            "split_offsets": list(self.split_offsets),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DataFileDescription:
        try:

            def ints(m: Mapping[str, int]) -> dict[int, int]:
                return {int(k): int(v) for k, v in m.items()}

            def blobs(m: Mapping[str, str]) -> dict[int, bytes]:
                return {int(k): base64.b64decode(v) for k, v in m.items()}

            return cls(
                path=str(d["path"]),
                size_bytes=int(d["size"]),
                record_count=int(d["records"]),
                spec_id=int(d["spec"]),
                partition=tuple(_decode_value(v) for v in d["partition"]),
                column_sizes=ints(d["column_sizes"]),
                value_counts=ints(d["value_counts"]),
                null_value_counts=ints(d["null_value_counts"]),
                nan_value_counts=ints(d["nan_value_counts"]),
                lower_bounds=blobs(d["lower_bounds"]),
                upper_bounds=blobs(d["upper_bounds"]),
                split_offsets=tuple(int(x) for x in d["split_offsets"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptTableError(f"a data file description cannot be read: {e!r}") from e


def _encode_value(v: PartitionValue) -> Any:
    if isinstance(v, bytes):
        return {"b64": base64.b64encode(v).decode()}
    return v


def _decode_value(v: Any) -> PartitionValue:
    if isinstance(v, dict):
        return base64.b64decode(v["b64"])
    if v is None or isinstance(v, int | str | float | bool):
        return v
    raise ValueError(f"partition value {v!r} is not a JSON scalar")


def attempt_uuid(attempt_id: str) -> uuid.UUID:
    """The write uuid in the file names of one task attempt: unique per attempt id, and the
    same for the same id (a task names its attempt, e.g. `<batch>-<partition>-<attempt>`)."""
    return uuid.uuid5(uuid.NAMESPACE_URL, "lakesink-iceberg-attempt:" + attempt_id)


def write_data_files(
    context: WriteContext, rows: pa.Table, *, attempt_id: str
) -> list[DataFileDescription]:
    """Write `rows` as Parquet data files of the table (split by partition, cut at the target
    file size) and describe them. No rows, no files."""
    require("pyiceberg", "Iceberg tables")
    if rows.num_rows == 0:
        return []
    # pyiceberg's writer entry point for a whole Arrow table: field ids, partition splitting,
    # bin-packing and statistics, without committing anything (Table.append would commit)
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    from lakesink.engine.evolution import conform
    from lakesink.formats.iceberg.schema import check_compatible

    metadata = context.metadata()
    if context.conform_to is not None:  # the batch evolves the table: rows of its new schema
        rows = conform(rows, context.conform_to)
    elif context.widen_rows:
        try:
            check_compatible(metadata.schema(), rows.schema, context.table)
        except SchemaMismatchError:
            # the rows change nothing (the plan found no change) yet differ: narrower types
            # or fields left out, widened and null-filled as the table's schema has them.
            # Rows that fit as they are are written untouched.
            rows = conform(rows, metadata.schema().as_arrow())
    check_compatible(metadata.schema(), rows.schema, context.table)
    io = context.file_io(metadata.location)
    files = _dataframe_to_data_files(metadata, rows, io, write_uuid=attempt_uuid(attempt_id))
    return [describe(f, metadata.default_spec_id) for f in files]


@dataclass(frozen=True, slots=True)
class IcebergTarget:
    """Where Spark tasks write on an Iceberg table (a `lakesink.formats.task.TaskTarget`): the
    table's write context (schema, spec, location, file IO) and the transaction their data files
    belong to."""

    context: WriteContext
    instant_time: str
    # Made once on the driver, so every task attempt of one transaction shares it: file names
    # stay apart across writers (and incarnations) whose transactions began in the same
    # millisecond, while a retried attempt name still writes the same names.
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def open(self, attempt: TaskAttempt) -> IcebergTaskWriter:
        return IcebergTaskWriter(self, attempt)


class IcebergTaskWriter:
    """A task attempt's rows become Parquet data files with the table's field ids (split by
    partition, cut at the target size) when it closes, named after the attempt; its status
    carries their descriptions (`FILES_KEY`) and the newest record time per partition
    (`MAX_TS_KEY`, for the snapshot's valid-through time)."""

    def __init__(self, target: IcebergTarget, attempt: TaskAttempt) -> None:
        self.target = target
        self.attempt = attempt
        self.batches: list[pa.RecordBatch] = []
        self.newest_ms: dict[str, int] = {}

    def write(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)
        for key, ms in newest_record_ms(batch).items():
            self.newest_ms[key] = max(ms, self.newest_ms.get(key, ms))

    def close(self) -> tuple[list[FileWrite], dict[str, Any]]:
        from lakesink.protocol.write_status import FileWrite

        described = (
            write_data_files(
                self.target.context,
                pa.Table.from_batches(self.batches),
                attempt_id=f"{self.target.instant_time}-{self.target.token}-{self.attempt.name}",
            )
            if self.batches
            else []
        )
        files = [FileWrite("", d.path, d.path, d.record_count, d.size_bytes) for d in described]
        return files, {FILES_KEY: [d.to_json() for d in described], MAX_TS_KEY: self.newest_ms}


def newest_record_ms(batch: pa.RecordBatch) -> dict[str, int]:
    """The newest `kafka_timestamp` (epoch ms) per topic partition (`TopicPartition.key()`);
    none when the rows lack a Kafka coordinate column (a transformation dropped it)."""
    import pyarrow.compute as pc

    from lakesink.protocol.offsets import TopicPartition

    names = batch.schema.names
    needed = ("kafka_timestamp", "kafka_topic", "kafka_partition")
    if not batch.num_rows or not all(n in names for n in needed):
        return {}
    stamps = pc.cast(pc.cast(batch.column("kafka_timestamp"), pa.timestamp("ms")), pa.int64())
    grouped = (
        pa.table(
            {
                "t": batch.column("kafka_topic"),
                "p": batch.column("kafka_partition"),
                "ms": stamps,
            }
        )
        .group_by(["t", "p"])
        .aggregate([("ms", "max")])
    )
    return {
        TopicPartition(str(t), int(p)).key(): int(ms)
        for t, p, ms in zip(
            grouped.column("t").to_pylist(),
            grouped.column("p").to_pylist(),
            grouped.column("ms_max").to_pylist(),
            strict=True,
        )
        if ms is not None
    }


def describe(data_file: DataFile, spec_id: int) -> DataFileDescription:
    """The description of a pyiceberg DataFile written under partition spec `spec_id` (a
    DataFile does not keep its spec id when it is built)."""
    partition = tuple(data_file.partition[i] for i in range(len(data_file.partition)))
    for v in partition:
        if not (v is None or isinstance(v, int | str | float | bool | bytes)):
            raise CorruptTableError(
                f"data file {data_file.file_path}: partition value {v!r} of type "
                f"{type(v).__name__} cannot be described"
            )
    return DataFileDescription(
        path=data_file.file_path,
        size_bytes=int(data_file.file_size_in_bytes),
        record_count=int(data_file.record_count),
        spec_id=spec_id,
        partition=partition,
        column_sizes=dict(data_file.column_sizes or {}),
        value_counts=dict(data_file.value_counts or {}),
        null_value_counts=dict(data_file.null_value_counts or {}),
        nan_value_counts=dict(data_file.nan_value_counts or {}),
        lower_bounds=dict(data_file.lower_bounds or {}),
        upper_bounds=dict(data_file.upper_bounds or {}),
        split_offsets=tuple(data_file.split_offsets or ()),
    )


def to_data_file(desc: DataFileDescription, format_version: int) -> DataFile:
    """The pyiceberg DataFile of a description, for the driver's commit."""
    require("pyiceberg", "Iceberg tables")
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    data_file = DataFile.from_args(
        _table_format_version=format_version,  # type: ignore[arg-type]
        content=DataFileContent.DATA,
        file_path=desc.path,
        file_format=FileFormat.PARQUET,
        partition=Record(*desc.partition),
        record_count=desc.record_count,
        file_size_in_bytes=desc.size_bytes,
        column_sizes=dict(desc.column_sizes),
        value_counts=dict(desc.value_counts),
        null_value_counts=dict(desc.null_value_counts),
        nan_value_counts=dict(desc.nan_value_counts),
        lower_bounds=dict(desc.lower_bounds),
        upper_bounds=dict(desc.upper_bounds),
        split_offsets=list(desc.split_offsets) or None,
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
    )
    data_file.spec_id = desc.spec_id
    return data_file


def descriptions_to_json(files: list[DataFileDescription]) -> str:
    """A list of descriptions as one JSON text."""
    return json.dumps([f.to_json() for f in files], separators=(",", ":"))
