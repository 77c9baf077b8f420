"""Backfill: a Spark batch job that writes files (parquet, json, csv) into a table as one more
writer, beside the streaming ingestion (seed 003).

It is a writer like any other: its own writer id (`backfill-<id>`), its own instant begun under
the table lock with a heartbeat, tasks writing base files with markers (the streaming sink's
`TaskWriter`), reconciliation of the markers before publishing (files of failed task attempts
are deleted), the conflict check and the publish under the lock, and commit metadata naming the
writer and the backfill. Rerunning the same backfill (same files) commits nothing twice: the
commit carries `lakesink.backfill.id`, a digest of the source files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakesink.config import LakesinkConfig
from lakesink.engine.requirements import BackfillNotCommitted, NoConflicts, WriterStillLive
from lakesink.engine.transaction import TableTransaction
from lakesink.errors import ConfigError
from lakesink.formats import plugin_for
from lakesink.formats.hudi import writer_state as keys
from lakesink.formats.hudi.conflicts import file_groups_of_paths
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.services.lazy_rollback import rollback_failed_writes
from lakesink.formats.hudi.table.avro_schema import META_COLUMNS
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.view import FileSystemView
from lakesink.formats.hudi.table.writer import DEFAULT_TARGET_FILE_SIZE, HudiTaskTarget
from lakesink.protocol.conflicts import (
    ConflictStrategy,
    FileGroupOverlap,
    Operation,
    OperationKind,
    Phase,
    strategy_named,
)
from lakesink.protocol.instant import InstantTime
from lakesink.spark.task_writer import STATUS_SCHEMA, TaskWriter, parse_statuses

log = logging.getLogger(__name__)

SourceFormat = Literal["parquet", "json", "csv"]
FORMATS: tuple[SourceFormat, ...] = ("parquet", "json", "csv")
BACKFILL_ID_KEY = keys.BACKFILL_ID_KEY
BACKFILL_SOURCE_KEY = keys.BACKFILL_SOURCE_KEY
DATE_PARTITION_COLUMN = "dt"


@dataclass(frozen=True, slots=True)
class BackfillResult:
    """What one backfill did: the Hudi instant or the Iceberg snapshot it committed, neither
    when it had been committed before."""

    writer_id: str
    backfill_id: str
    instant_time: InstantTime | None
    records: int = 0
    files: int = 0
    snapshot_id: int | None = None

    @property
    def already_committed(self) -> bool:
        return self.instant_time is None and self.snapshot_id is None

    def to_json(self) -> dict[str, Any]:
        return {
            "writer_id": self.writer_id,
            "backfill_id": self.backfill_id,
            "instant_time": self.instant_time.value if self.instant_time else None,
            **({"snapshot_id": self.snapshot_id} if self.snapshot_id is not None else {}),
            "records": self.records,
            "files": self.files,
            "already_committed": self.already_committed,
        }


def source_files(source: str | Path, fmt: SourceFormat) -> list[Path]:
    """The data files of a source path (a file, or a folder searched recursively)."""
    root = Path(source)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise ConfigError(f"backfill source {root} does not exist")
    found = sorted(
        p
        for p in root.rglob(f"*.{fmt}")
        if p.is_file()
        and not any(part.startswith((".", "_")) for part in p.relative_to(root).parts)
    )
    if not found:
        raise ConfigError(f"backfill source {root} holds no .{fmt} files")
    return found


def backfill_id(files: list[Path]) -> str:
    """A digest of the source files (paths, sizes): the same files are the same backfill."""
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.absolute()}\0{f.stat().st_size}\n".encode())
    return h.hexdigest()[:16]


def _already_committed(table: HudiTable, bid: str) -> bool:
    return keys.backfill_committed(table, bid)


def _table_data_schema(table: HudiTable) -> Any | None:
    """The Spark schema of the table's data columns, from one of its base files."""
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_schema

    files = FileSystemView(table).latest_base_files()
    if not files:
        return None
    fs, root = table.storage.arrow()
    schema = pq.read_schema(f"{root}/{files[-1].path}", filesystem=fs)
    data = [f for f in schema if f.name not in META_COLUMNS]
    import pyarrow as pa

    return from_arrow_schema(pa.schema(data))


def read_source(
    spark: SparkSession, files: list[Path], fmt: SourceFormat, schema: Any | None
) -> DataFrame:
    paths = [str(f) for f in files]
    reader = spark.read
    if fmt == "csv":
        reader = reader.option("header", "true")
    if schema is not None and fmt in ("json", "csv"):
        reader = reader.schema(schema)
    df = reader.format(fmt).load(paths)
    if schema is not None:
        missing = [f.name for f in schema.fields if f.name not in df.columns]
        if missing:
            raise ConfigError(
                f"backfill rows lack the table's column(s) {', '.join(missing)}; the source has "
                f"{', '.join(df.columns)}"
            )
        have = {f.name: f.dataType.simpleString() for f in df.schema.fields}
        df = df.select(
            [
                F.col(f.name)
                if have[f.name] == f.dataType.simpleString()  # equal up to nullability
                else F.col(f.name).cast(f.dataType).alias(f.name)
                for f in schema.fields
            ]
        )
    return df


def run_backfill(
    spark: SparkSession,
    table_path: str | Path,
    source: str | Path,
    *,
    fmt: SourceFormat = "parquet",
    control: CommitControl,
    cfg: LakesinkConfig | None = None,
    writer_id: str | None = None,
    strategy: ConflictStrategy | None = None,
    target_file_size: int | None = None,
) -> BackfillResult:
    """Write the source files into the table as one commit of a backfill writer."""
    if fmt not in FORMATS:
        raise ConfigError(f"backfill format {fmt!r} is not known; valid: {', '.join(FORMATS)}")
    table = HudiTable.open(
        cfg.storage_for(str(table_path))
        if cfg is not None and isinstance(table_path, str)
        else table_path
    )
    files = source_files(source, fmt)
    bid = backfill_id(files)
    writer = writer_id or f"backfill-{bid}"
    if _already_committed(table, bid):
        log.info(
            "table %s: backfill %s was committed before; nothing to do", table.config.name, bid
        )
        return BackfillResult(writer, bid, None)
    rollback_failed_writes(table, control, writer_id=writer)
    df = read_source(spark, files, fmt, _table_data_schema(table))
    date_from = cfg["table.partition.date.from"] if cfg is not None else None
    if date_from and DATE_PARTITION_COLUMN not in df.columns:
        df = df.withColumn(DATE_PARTITION_COLUMN, F.date_format(F.col(date_from), "yyyy-MM-dd"))
    size = target_file_size or (
        cfg["table.target.file.size.bytes"] if cfg is not None else DEFAULT_TARGET_FILE_SIZE
    )
    rules = strategy or (
        strategy_named(cfg["table.services.conflict.strategy"])
        if cfg is not None
        else FileGroupOverlap()
    )
    with TableTransaction(plugin_for("hudi").table_format(table), control, writer_id=writer) as tx:
        t = tx.begin()
        log.info("table %s: backfill %s (writer %s) began %s", table.config.name, bid, writer, t)
        task = TaskWriter(HudiTaskTarget(table.storage, table.config, t.value, size))
        statuses = parse_statuses(df.mapInArrow(task, STATUS_SCHEMA).collect())
        writes = tuple(f for s in statuses for f in s.files)
        kept = tx.stage({w.path for w in writes})
        schema = next((str(s.extra["schema"]) for s in statuses if s.extra.get("schema")), "")
        metadata = CommitMetadata(
            operation_type="BULK_INSERT",
            writes=writes,
            schema=schema or (tx.format.schema() or ""),
            extra={
                keys.WRITER_ID_KEY: writer,
                keys.COMMIT_ID_KEY: str(uuid.uuid4()),
                BACKFILL_ID_KEY: bid,
                BACKFILL_SOURCE_KEY: json.dumps([os.fspath(f) for f in files][:100]),
            },
        )
        written = Operation(
            t,
            OperationKind.INGESTION,
            file_groups_of_paths(kept),
            phase=Phase.PENDING,
            writer=writer,
        )
        tx.commit(
            metadata,
            (WriterStillLive(control, t), BackfillNotCommitted(bid), NoConflicts(written, rules)),
        )
    records = sum(w.num_writes for w in writes)
    log.info(
        "table %s: backfill %s committed %s (%d records, %d files)",
        table.config.name,
        bid,
        t,
        records,
        len(writes),
    )
    return BackfillResult(writer, bid, t, records, len(writes))
