"""Backfill: a Spark batch job that writes files (parquet, json, csv) into a table as one more
writer, beside the streaming ingestion (seed 003), whatever the table's format.

The job lists and reads the source files, writes them in Spark tasks with the streaming
path's `TaskWriter` through the format's task target, and hands the tasks' statuses to the
format's half of the backfill (lakesink.formats.backfill, got from the plugin), which commits
them through the engine as one commit of the backfill writer (`backfill-<id>`). Rerunning the
same backfill (same files) commits nothing twice: the backfill id is a digest of the source
files, and the commit carries it.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any, Literal

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakesink.config import LakesinkConfig, storage_access_from_env
from lakesink.errors import ConfigError
from lakesink.formats import FormatPlugin, plugin_at, plugin_of
from lakesink.formats.backfill import BackfillResult
from lakesink.spark.task_writer import (
    DATE_PARTITION_COLUMN,
    STATUS_SCHEMA,
    TaskWriter,
    parse_statuses,
)

log = logging.getLogger(__name__)

SourceFormat = Literal["parquet", "json", "csv"]
FORMATS: tuple[SourceFormat, ...] = ("parquet", "json", "csv")

__all__ = [
    "FORMATS",
    "BackfillResult",
    "SourceFormat",
    "backfill_id",
    "backfill_plugin",
    "read_source",
    "run_backfill",
    "source_files",
]


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


def read_source(
    spark: SparkSession, files: list[Path], fmt: SourceFormat, schema: Any | None
) -> DataFrame:
    """The rows of the source files; with the table's Spark `schema`, exactly its columns, in
    its order and types (ConfigError naming the columns the source lacks)."""
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


def backfill_plugin(table: str, cfg: LakesinkConfig | None) -> FormatPlugin:
    """The format of a backfill into `table`: of the table found there (whose plugin refuses a
    configuration that does not fit it), else the configured one."""
    access = storage_access_from_env()
    found = plugin_at(table, access)
    if cfg is None or found.recognizes_table(table, access):
        return found
    return plugin_of(cfg.settings)


def run_backfill(
    spark: SparkSession,
    table: str | Path,
    source: str | Path,
    *,
    fmt: SourceFormat = "parquet",
    cfg: LakesinkConfig | None = None,
    control: object = None,
    writer_id: str | None = None,
) -> BackfillResult:
    """Write the source files into the table as one commit of a backfill writer. `table`: the
    table's path (Hudi) or, with `cfg` configuring an Iceberg catalog, its warehouse;
    `control`: the commit control of the format's `backfill_control` (Hudi's lock)."""
    if fmt not in FORMATS:
        raise ConfigError(f"backfill format {fmt!r} is not known; valid: {', '.join(FORMATS)}")
    path = os.fspath(table)
    plugin = backfill_plugin(path, cfg)
    files = source_files(source, fmt)
    backfill = plugin.open_backfill(
        cfg.settings if cfg is not None else None,
        path,
        control,
        writer_id=writer_id,
        backfill_id=backfill_id(files),
        sources=[os.fspath(f) for f in files],
    )
    if backfill.already_committed():
        log.info("backfill %s was committed before; nothing to do", backfill.backfill_id)
        return BackfillResult(backfill.writer_id, backfill.backfill_id, None)
    df = _table_rows(spark, files, fmt, backfill.rows_schema(), cfg)
    target = backfill.begin()
    try:
        task = TaskWriter(target, backfill.required_columns())
        statuses = parse_statuses(df.mapInArrow(task, STATUS_SCHEMA).collect())
        return backfill.commit(statuses)
    except BaseException as e:
        backfill.abort(e)
        raise


def _table_rows(
    spark: SparkSession,
    files: list[Path],
    fmt: SourceFormat,
    schema: Any | None,
    cfg: LakesinkConfig | None,
) -> DataFrame:
    """The source rows as the table's (Arrow `schema`; None: as they are), with the date
    partition column of table.partition.date.from where the table may take it and the
    source lacks it."""
    from pyspark.sql.pandas.types import from_arrow_schema

    df = read_source(spark, files, fmt, from_arrow_schema(schema) if schema is not None else None)
    date_from = cfg["table.partition.date.from"] if cfg is not None else None
    may_take_date = schema is None or DATE_PARTITION_COLUMN in schema.names
    if date_from and may_take_date and DATE_PARTITION_COLUMN not in df.columns:
        df = df.withColumn(DATE_PARTITION_COLUMN, F.date_format(F.col(date_from), "yyyy-MM-dd"))
    return df
