"""The audit of an Iceberg table of keys (write.operation upsert or cdc): does the table equal the
fold by key of every record in the writer's committed Kafka ranges, under the ordering rule?

A table of keys cannot tell its ranges by its rows (a later version of a key replaces the row
that held an earlier record), so each of the writer's commits records the ranges it ingested in
its snapshot summary (`lakesink.ranges`, and `lakesink.skipped` for spans Kafka had deleted
before they were read; lakesink/formats/iceberg/format.py). Walking the current snapshot's
lineage oldest first, the ranges of each partition must follow one another and end where the
newest commit's `lakesink.offsets` say; snapshots expired from the lineage's start leave ranges
unknown, which the audit says rather than folding part of the stream.

The rows are read by readers lakesink did not write: pyiceberg's scan and DuckDB's iceberg
extension (every column; they must read the same rows), and with `spark` Spark with Iceberg's
Java runtime (the Kafka coordinates of the rows: the same winning versions). pyiceberg's rows are
compared with the fold (`lakesink.formats.audit.compare_with_fold`, the Hudi fold audit's
comparison): wrong, missing and extra keys are reported as for Hudi.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from lakesink.errors import ReaderError
from lakesink.formats.audit import FoldAudit, compare_with_fold, coordinates_in, follow_ranges
from lakesink.formats.iceberg.audit import (
    IcebergAuditReport,
    distinct_coordinates,
    offsets_moved_back,
    read_with_duckdb,
    read_with_extra_readers,
)
from lakesink.formats.iceberg.snapshots import (
    KEY_RANGES,
    KEY_SKIPPED,
    SnapshotInfo,
    WriterCommit,
    lineage,
)
from lakesink.formats.iceberg.table import IcebergTable, snapshot_infos
from lakesink.protocol.offsets import TopicPartition

__all__ = ["audit_iceberg_fold", "committed_spans"]

Spans = dict[TopicPartition, tuple[int, int]]


def committed_spans(
    snapshots: list[SnapshotInfo], writer_id: str, report: IcebergAuditReport
) -> Spans:
    """[first start, committed end) per partition of the writer's commits in `snapshots` (the
    lineage, oldest first), each commit's ranges checked to start where the previous one ended;
    every failure goes into `report.problems`. Counts the writer's commits."""
    spans: Spans = {}
    last: dict[str, int] = {}
    if snapshots and snapshots[0].sequence_number > 1:
        report.problems.append(
            f"the lineage starts at snapshot {snapshots[0].snapshot_id} (sequence number "
            f"{snapshots[0].sequence_number}): earlier snapshots were expired, and the ranges "
            "they committed cannot be folded"
        )
    for s in snapshots:
        commit = WriterCommit.from_summary(s.summary, s.snapshot_id)
        if commit is None or commit.writer_id != writer_id:
            continue
        report.commits += 1
        if KEY_RANGES not in s.summary:
            report.problems.append(
                f"snapshot {s.snapshot_id}: the writer's commit records no ranges "
                f"({KEY_RANGES}); the fold audit needs every range it committed"
            )
            continue
        skipped = json.loads(s.summary.get(KEY_SKIPPED, "[]"))
        ranges = json.loads(s.summary[KEY_RANGES])
        follow_ranges(spans, skipped, ranges, f"snapshot {s.snapshot_id}", report.problems)
        last = offsets_moved_back(last, commit, f"snapshot {s.snapshot_id}", report.problems)
    for key, pos in last.items():
        tp = TopicPartition.parse(key)
        if tp in spans and spans[tp][1] != pos:
            report.problems.append(
                f"{tp}: the ranges end at {spans[tp][1]} but the newest commit records {pos}"
            )
    report.committed = dict(sorted(last.items()))
    return spans


def audit_iceberg_fold(
    table: IcebergTable,
    writer_id: str,
    fold: FoldAudit,
    *,
    bootstrap: str | None,
    isolation_level: str = "read_committed",
    consumer_config: Mapping[str, str] | None = None,
    extra_readers: Mapping[str, Callable[[IcebergTable], pa.Table] | str] | None = None,
) -> IcebergAuditReport:
    """Run the fold audit. With `bootstrap=None` the Kafka comparison is skipped; the ranges and
    the readers' agreement are always checked. `extra_readers`: as `audit_iceberg`'s (each
    returns the coordinate columns), compared by the coordinates of the rows."""
    table.refresh()
    report = IcebergAuditReport(writer_id, table.name)
    report.snapshots = len(table.pyiceberg.metadata.snapshots)
    snaps, current = snapshot_infos(table.pyiceberg.metadata)
    spans = committed_spans(list(reversed(lineage(snaps, current))), writer_id, report)
    topics = {tp.topic for tp in spans}

    try:
        rows = table.pyiceberg.scan().to_arrow()
    except Exception as e:  # pyiceberg and pyarrow raise their own error types
        raise ReaderError(f"pyiceberg cannot read {table.name}: {e}") from e
    report.readers["pyiceberg"] = rows.num_rows
    base = distinct_coordinates("pyiceberg", coordinates_in(rows, topics), report)
    got = read_with_duckdb(table, None, report.not_run)
    if got is not None:
        report.readers["duckdb"] = got.num_rows
        distinct_coordinates("duckdb", coordinates_in(got, topics), report)
        differ = _rows_differ(rows, got, fold.key)
        if differ:
            report.problems.append(f"readers disagree: pyiceberg and DuckDB read {differ}")
    for name, got in read_with_extra_readers(table, extra_readers, report.not_run):
        report.readers[name] = got.num_rows
        other = distinct_coordinates(name, coordinates_in(got, topics), report)
        if other != base:
            report.problems.append(
                f"readers disagree: {len(base - other)} rows only in pyiceberg, "
                f"{len(other - base)} only in {name}"
            )
    if bootstrap is not None and spans:
        found = compare_with_fold(
            rows,
            spans,
            fold,
            bootstrap=bootstrap,
            isolation_level=isolation_level,
            consumer_config=consumer_config or {},
            problems=report.problems,
            null_list_is_empty=True,  # pyiceberg writes a null list as an empty one
        )
        report.kafka_records = found.kafka_records
        report.dead_letters = found.dead_letters
        report.keys, report.wrong_keys = found.keys, found.wrong_keys
    elif bootstrap is not None:
        report.keys = 0
        if rows.num_rows:
            report.problems.append(
                f"the writer committed no ranges, yet the table holds {rows.num_rows} rows"
            )
    return report


def _rows_differ(first: pa.Table, second: pa.Table, key: tuple[str, ...]) -> str:
    """What differs between two readers' rows of a table of keys (empty: nothing): the same
    columns, and for each key the same values (DuckDB's types cast to pyiceberg's first)."""
    missing = [c for c in first.column_names if c not in second.column_names]
    if missing:
        return f"other columns (DuckDB lacks {', '.join(missing)})"
    second = second.select(first.column_names)
    # where a type does not cast, compared as Python values, which may still be equal
    with contextlib.suppress(pa.ArrowInvalid, pa.ArrowNotImplementedError):
        second = second.cast(first.schema)
    a, b = _by_key(first, key), _by_key(second, key)
    if len(b) != second.num_rows:
        return f"{second.num_rows - len(b)} rows repeating a key another row holds (DuckDB)"
    wrong = sorted((k for k in a.keys() | b.keys() if a.get(k) != b.get(k)), key=repr)
    if not wrong:
        return ""
    return f"other rows of {len(wrong)} keys, e.g. {wrong[:3]}"


def _by_key(rows: pa.Table, key: tuple[str, ...]) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    names = rows.column_names
    return {tuple(r[k] for k in key): tuple(r[n] for n in names) for r in rows.to_pylist()}
