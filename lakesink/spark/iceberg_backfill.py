"""Backfill into an Iceberg table: a Spark batch job that appends files (parquet, json, csv) as
one snapshot of a backfill writer, beside the streaming ingestion (seed 003).

The same writer model as the streaming path, without Kafka ranges: the writer id is
`backfill-<id>` (or the one given) and the snapshot's commit id is the backfill id, a digest of
the source files, so the append's requirement (checked inside the SQL catalog's commit, or on
a pinned base through REST) finds an earlier landing of the same backfill and appends nothing
twice; the summary also carries `lakesink.backfill-id`, which a rerun looks for first. Tasks
write data files with the table's field ids (`TaskWriter`, as the DataFrame path does);
files of failed task attempts are in no status and stay unreferenced until
`remove-orphan-files`; the files of an append that did not land are deleted.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from lakesink.config import LakesinkConfig
from lakesink.errors import CommitStateUnknownError
from lakesink.formats.iceberg.snapshots import KEY_BACKFILL_ID, KEY_BACKFILL_SOURCE
from lakesink.spark.backfill import (
    BackfillResult,
    SourceFormat,
    backfill_id,
    read_source,
    source_files,
)

log = logging.getLogger(__name__)


class _AsTableRows:
    """A `mapInArrow` function: the rows cast to the table's Arrow schema, then written by
    `writer`. Spark reads the source files with every nested field nullable; the cast restores
    the table's required fields (and fails naming the field when one holds a null)."""

    def __init__(self, writer: Any, schema: pa.Schema) -> None:
        self.writer = writer
        self.schema = schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = (b if b.schema == self.schema else b.cast(self.schema) for b in batches)
        yield from self.writer(rows)


def run_iceberg_backfill(
    spark: SparkSession,
    cfg: LakesinkConfig,
    source: str | Path,
    *,
    fmt: SourceFormat = "parquet",
    writer_id: str | None = None,
) -> BackfillResult:
    """Append the source files to the Iceberg table of `cfg` as one snapshot of a backfill
    writer; a rerun with the same files appends nothing."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from lakesink.formats.iceberg.coordinator import FILES_KEY
    from lakesink.formats.iceberg.datafiles import DataFileDescription, IcebergTarget
    from lakesink.formats.iceberg.format import open_iceberg_table
    from lakesink.formats.iceberg.snapshots import AppendRequirement
    from lakesink.formats.iceberg.table import CommitOutcome
    from lakesink.spark.task_writer import STATUS_SCHEMA, TaskWriter, parse_statuses

    files = source_files(source, fmt)
    bid = backfill_id(files)
    writer = writer_id or f"backfill-{bid}"
    table = open_iceberg_table(cfg, create=False)
    earlier = table.backfill_snapshot(bid)
    if earlier is not None:
        log.info(
            "table %s: backfill %s was committed before (snapshot %s)", table.name, bid, earlier
        )
        return BackfillResult(writer, bid, None)
    schema = table.schema()
    df = read_source(spark, files, fmt, from_arrow_schema(schema))
    required = tuple(f.name for f in schema if not f.nullable)
    target = IcebergTarget(table.write_context(), f"backfill-{bid}")
    statuses = parse_statuses(
        df.mapInArrow(_AsTableRows(TaskWriter(target, required), schema), STATUS_SCHEMA).collect()
    )
    written = [
        DataFileDescription.from_json(d) for s in statuses for d in s.extra.get(FILES_KEY, ())
    ]
    extra = {
        KEY_BACKFILL_ID: bid,
        KEY_BACKFILL_SOURCE: json.dumps([os.fspath(f) for f in files][:100]),
    }
    try:
        result = table.commit_append(
            written, AppendRequirement(writer, bid, ()), extra_summary=extra
        )
    except CommitStateUnknownError:
        raise  # it may have landed: its files must stay
    except BaseException:
        table.abort(written)
        raise
    if result.outcome is not CommitOutcome.COMMITTED:  # a concurrent run of it landed first
        table.abort(written)
        log.info("table %s: backfill %s landed earlier; nothing appended", table.name, bid)
        return BackfillResult(writer, bid, None)
    records = sum(d.record_count for d in written)
    log.info(
        "table %s: backfill %s committed snapshot %s (%d records, %d files)",
        table.name, bid, result.snapshot_id, records, len(written),
    )  # fmt: skip
    return BackfillResult(writer, bid, None, records, len(written), result.snapshot_id)
