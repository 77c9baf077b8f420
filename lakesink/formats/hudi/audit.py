"""The exactly-once audit: does the table hold every record of the writer's committed Kafka
ranges exactly once, and nothing else?

It reads the table with two independent readers (hudi-rs and lakesink's own) and the committed
ranges' records from Kafka, and checks: no duplicate (topic, partition, offset); the writer's
committed ranges are contiguous per partition and end where the commit metadata says; every
Kafka record in them is in the table (or in the dead-letter topic), and no row lies outside them;
both readers return the same rows.

Kafka may have deleted records since they were ingested (retention, delete-records): table rows
below a partition's log start are counted as `rows_below_log_start`, not checked against Kafka.
Spans a commit passed over because Kafka had deleted them before they were read
(`kafka.fail.on.data.loss=false`) keep the ranges contiguous and are listed in `skipped`.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from lakesink.engine import writer_state as keys
from lakesink.errors import CorruptTableError
from lakesink.extras import require
from lakesink.formats.audit import (
    COORDINATES,
    Coordinate,
    DeadLetters,
    FoldAudit,
    KeptByTransform,
    compare_with_fold,
    compare_with_kafka,
    coordinates_in,
    follow_ranges,
)
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.protocol.instant import Action, Instant
from lakesink.protocol.offsets import TopicPartition
from lakesink.storage import Storage

log = logging.getLogger(__name__)


@dataclass
class AuditReport:
    """What the audit found; `ok` is True only when nothing is wrong."""

    writer_id: str
    commits: int = 0
    rows_hudi_rs: int = 0
    rows_lakesink: int = 0
    kafka_records: int = 0
    dead_letters: int = 0
    filtered: int = 0
    rows_below_log_start: int = 0
    skipped: list[tuple[str, int, int]] = field(default_factory=list)
    committed: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    keys: int | None = None  # a table of keys (upsert, cdc): the keys the fold leaves
    wrong_keys: int = 0  # of a table of keys: keys that differ from the fold

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "writer_id": self.writer_id,
            "commits": self.commits,
            "rows_hudi_rs": self.rows_hudi_rs,
            "rows_lakesink": self.rows_lakesink,
            "kafka_records": self.kafka_records,
            "dead_letters": self.dead_letters,
            "filtered": self.filtered,
            "rows_below_log_start": self.rows_below_log_start,
            "skipped": [list(s) for s in self.skipped],
            "committed": self.committed,
            "problems": self.problems,
            **({"keys": self.keys, "wrong_keys": self.wrong_keys} if self.keys is not None else {}),
        }


def writer_ranges(
    table: HudiTable, writer_id: str, report: AuditReport
) -> dict[TopicPartition, tuple[int, int]]:
    """[first start, committed end) per partition, checking contiguity commit after commit."""
    spans: dict[TopicPartition, tuple[int, int]] = {}
    last_offsets: dict[str, int] = {}
    for instant, metadata in completed_commits(table):
        extra = metadata.extra
        if extra.get(keys.WRITER_ID_KEY) != writer_id:
            continue
        report.commits += 1
        skipped = json.loads(extra.get(keys.SKIPPED_KEY, "[]"))
        report.skipped.extend((key, start, end) for key, start, end in skipped)
        ranges = json.loads(extra.get(keys.RANGES_KEY, "[]"))
        follow_ranges(spans, skipped, ranges, f"instant {instant.time}", report.problems)
        offsets = json.loads(extra.get(keys.OFFSETS_KEY, "{}"))
        for key, pos in last_offsets.items():
            if offsets.get(key, pos) < pos:
                report.problems.append(f"instant {instant.time}: offset of {key} moved back")
        last_offsets = offsets
    for key, pos in last_offsets.items():
        tp = TopicPartition.parse(key)
        if tp in spans and spans[tp][1] != pos:
            report.problems.append(
                f"{tp}: ranges end at {spans[tp][1]} but the last commit records {pos}"
            )
    report.committed = last_offsets
    return spans


_BATCH_ACTIONS = (Action.COMMIT, Action.DELTA_COMMIT)  # deltacommits: merge-on-read batches


def completed_commits(table: HudiTable) -> list[tuple[Instant, CommitMetadata]]:
    """Every completed commit and deltacommit, archived ones first (archival moves the oldest
    instants aside)."""
    from lakesink.formats.hudi.services.archival import archived_instants
    from lakesink.formats.hudi.table.archive import iter_archived_files

    timeline = table.timeline()
    out: list[tuple[Instant, CommitMetadata]] = []
    active = {i.time for i in timeline.completed()}
    archived = {
        i.file_name(table.layout): i
        for i in archived_instants(table)
        if i.action in _BATCH_ACTIONS and i.time not in active
    }
    unread = set(archived)
    for name, content in iter_archived_files(table.storage, set(archived)):
        unread.discard(name)
        instant = archived[name]
        out.append((instant, CommitMetadata.from_bytes(content, table.layout, instant.action)))
    if unread:
        missing = sorted(unread)
        raise CorruptTableError(f"archived commit files listed but unreadable: {missing[:5]}")
    out.sort(key=lambda pair: pair[0].time)
    out += [
        (i, timeline.commit_metadata(i)) for i in timeline.completed() if i.action in _BATCH_ACTIONS
    ]
    return out


_NO_ROWS = pa.schema(
    [("kafka_topic", pa.string()), ("kafka_partition", pa.int32()), ("kafka_offset", pa.int64())]
)


def hudi_rs_batches(
    base_path: str,
    storage_options: Mapping[str, str] | None = None,
    columns: list[str] | None = None,
) -> list[pa.RecordBatch]:
    """Every row hudi-rs reads (of `columns`, None: all), straight from the table's storage."""
    hudi = require("hudi", "reading a table with hudi-rs (the exactly-once audit)")

    builder = hudi.HudiTableBuilder.from_base_uri(base_path)
    if storage_options:
        builder = builder.with_storage_options(dict(storage_options))
    table = builder.build()
    if columns is None:
        return list(table.read())
    return list(table.read(hudi.HudiReadOptions(projection=columns)))


def read_with_hudi_rs(base_path: str, storage_options: Mapping[str, str] | None = None) -> pa.Table:
    """The coordinates of every row hudi-rs reads, straight from the table's storage."""
    batches = hudi_rs_batches(base_path, storage_options, COORDINATES)
    if not batches:
        return _NO_ROWS.empty_table()
    return pa.Table.from_batches(batches).select(COORDINATES)


def _hudi_rs_read(table: HudiTable, columns: list[str] | None) -> list[pa.RecordBatch]:
    """`hudi_rs_batches` of an open table; what hudi-rs refuses is a CorruptTableError."""
    try:
        return hudi_rs_batches(table.uri, table.storage.reader_options(), columns)
    except Exception as e:  # hudi-rs raises its own error types
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CorruptTableError(f"hudi-rs cannot read {table.uri}: {first}") from e


def _coordinates_by_hudi_rs(table: HudiTable) -> pa.Table:
    batches = _hudi_rs_read(table, COORDINATES)
    if not batches:
        return _NO_ROWS.empty_table()
    return pa.Table.from_batches(batches).select(COORDINATES)


def read_with_lakesink(table: HudiTable) -> pa.Table:
    from lakesink.formats.hudi.table.reader import TableReader
    from lakesink.formats.hudi.table.view import FileSystemView

    if not FileSystemView(table).latest_base_files():
        return _NO_ROWS.empty_table()  # nothing committed yet: no data columns exist
    return TableReader(table).snapshot(columns=COORDINATES)


def check_rows(name: str, rows: Iterable[Coordinate], report: AuditReport) -> set[Coordinate]:
    counts = Counter(rows)
    dupes = [c for c, n in counts.items() if n > 1]
    if dupes:
        report.problems.append(f"{name}: {len(dupes)} duplicated records, e.g. {sorted(dupes)[:3]}")
    return set(counts)


def audit(
    table_path: str | Storage,
    writer_id: str,
    *,
    bootstrap: str | None,
    isolation_level: str = "read_committed",
    consumer_config: Mapping[str, str] | None = None,
    dead_letters: DeadLetters | None = None,
    kept_by_transform: KeptByTransform | None = None,
    fold: FoldAudit | None = None,
) -> AuditReport:
    """Run the audit. With `bootstrap=None` the Kafka comparison is skipped (said in problems
    only if other checks fail); the readers' agreement and contiguity are always checked.
    `kept_by_transform`: the table's transformation, whose filtered records are not missing.
    `fold`: the table's rows change by key, so it must equal the fold of the records by key
    (`audit_fold`) rather than hold each record once."""
    report = AuditReport(writer_id)
    table = HudiTable.open(table_path)
    spans = writer_ranges(table, writer_id, report)
    if fold is not None:
        return audit_fold(table, spans, fold, report, bootstrap, isolation_level, consumer_config)
    topics = {tp.topic for tp in spans}
    by_hudi_rs = _coordinates_by_hudi_rs(table)
    by_lakesink = read_with_lakesink(table)
    rows_rs = coordinates_in(by_hudi_rs, topics)
    rows_ls = coordinates_in(by_lakesink, topics)
    report.rows_hudi_rs, report.rows_lakesink = len(rows_rs), len(rows_ls)
    set_rs = check_rows("hudi-rs", rows_rs, report)
    set_ls = check_rows("lakesink reader", rows_ls, report)
    if set_rs != set_ls:
        report.problems.append(
            f"readers disagree: {len(set_rs - set_ls)} rows only in hudi-rs, "
            f"{len(set_ls - set_rs)} only in lakesink's reader"
        )
    outside = [
        c
        for c in set_rs
        if not (
            TopicPartition(c[0], c[1]) in spans
            and spans[TopicPartition(c[0], c[1])][0] <= c[2] < spans[TopicPartition(c[0], c[1])][1]
        )
    ]
    if outside:
        report.problems.append(
            f"{len(outside)} rows lie outside committed ranges, e.g. {sorted(outside)[:3]}"
        )
    if bootstrap is not None:
        found = compare_with_kafka(
            set_rs,
            spans,
            bootstrap=bootstrap,
            isolation_level=isolation_level,
            consumer_config=consumer_config or {},
            dead_letters=dead_letters,
            kept_by_transform=kept_by_transform,
            problems=report.problems,
        )
        report.kafka_records = found.kafka_records
        report.rows_below_log_start = found.rows_below_log_start
        report.dead_letters = found.dead_letters
        report.filtered = found.filtered
    return report


def audit_fold(
    table: HudiTable,
    spans: Mapping[TopicPartition, tuple[int, int]],
    fold: FoldAudit,
    report: AuditReport,
    bootstrap: str | None,
    isolation_level: str,
    consumer_config: Mapping[str, str] | None,
) -> AuditReport:
    """The audit of a table of keys: hudi-rs and lakesink's reader read the same rows (every
    column, one row per key), every row's record lies in a committed range, and (with Kafka)
    the rows equal the fold of the committed records by key under the ordering rule."""
    from lakesink.engine.evolution import concat_unified
    from lakesink.formats.hudi.table.avro_schema import META_COLUMNS
    from lakesink.formats.hudi.table.reader import TableReader
    from lakesink.formats.hudi.table.view import FileSystemView

    batches = _hudi_rs_read(table, None)
    has_files = bool(FileSystemView(table).latest_base_files())
    # hudi-rs (0.5.0) returns every slice in the latest commit's schema, older files null-filled
    # and widened; unified by name all the same, a safeguard should a version hand a slice in
    # its own file's schema (concat would refuse the batches)
    by_hudi_rs = concat_unified(batches) if batches else None
    by_lakesink = TableReader(table).snapshot() if has_files else None
    readers = [("hudi-rs", by_hudi_rs), ("lakesink reader", by_lakesink)]
    data: list[pa.Table] = []
    for name, rows in readers:
        if rows is None:
            continue
        rows = rows.drop_columns([c for c in META_COLUMNS if c in rows.column_names])
        check_rows(name, coordinates_in(rows, {tp.topic for tp in spans}), report)
        data.append(rows)
    report.rows_hudi_rs = by_hudi_rs.num_rows if by_hudi_rs is not None else 0
    report.rows_lakesink = by_lakesink.num_rows if by_lakesink is not None else 0
    if len(data) == 2 and _sorted_rows(data[0], fold.key) != _sorted_rows(data[1], fold.key):
        report.problems.append("readers disagree: hudi-rs and lakesink's reader read other rows")
    if bootstrap is not None:
        found = compare_with_fold(
            data[0] if data else None,
            spans,
            fold,
            bootstrap=bootstrap,
            isolation_level=isolation_level,
            consumer_config=consumer_config or {},
            problems=report.problems,
        )
        report.kafka_records = found.kafka_records
        report.dead_letters = found.dead_letters
        report.keys, report.wrong_keys = found.keys, found.wrong_keys
    return report


def _sorted_rows(rows: pa.Table, key: tuple[str, ...]) -> list[dict[str, object]]:
    names = sorted(rows.column_names)
    return sorted(
        (
            dict(zip(names, r, strict=True))
            for r in zip(*(rows.column(n).to_pylist() for n in names), strict=True)
        ),
        key=lambda r: repr(tuple(r[k] for k in key)),
    )


def dead_letter_table_coordinates(path: str | Storage) -> list[Coordinate]:
    """The Kafka coordinates of the records in a dead-letter table as hudi-rs reads it, one per
    row (sorted; none if the table does not exist)."""
    from lakesink.errors import TableNotFoundError

    try:
        table = HudiTable.open(path)
    except TableNotFoundError:
        return []
    rows = _coordinates_by_hudi_rs(table)
    return sorted(coordinates_in(rows, set(rows.column("kafka_topic").to_pylist())))
