"""The format-neutral half of the exactly-once audit: Kafka coordinates, the records Kafka holds
in committed spans, those a transformation drops and those a writer dead-lettered. Each format's
audit (formats/hudi/audit.py, formats/iceberg/audit.py) reads its own table and checks its rows
against these, and `lakesink verify` builds the dead letters without knowing the format."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from lakesink.protocol.offsets import OffsetRange, TopicPartition

if TYPE_CHECKING:
    from lakesink.kafka.decoded import Deserializer

COORDINATES = ["kafka_topic", "kafka_partition", "kafka_offset"]
Coordinate = tuple[str, int, int]
# The Kafka records a table's transformation keeps, of the ranges given (cli.verify builds one
# from `transform.arrow`): the records it filters out are accounted for, not missing.
KeptByTransform = Callable[[list[OffsetRange]], set[Coordinate]]


def coordinates_in(table: pa.Table, topics: set[str]) -> list[Coordinate]:
    """The coordinates of `table`'s rows of `topics` (the audit checks only the writer's topics)."""
    cols = [table.column(c).to_pylist() for c in COORDINATES]
    return [(t, int(p), int(o)) for t, p, o in zip(*cols, strict=True) if t in topics]


def follow_ranges(
    spans: dict[TopicPartition, tuple[int, int]],
    skipped: Iterable[Sequence[Any]],
    ranges: Iterable[Sequence[Any]],
    where: str,
    problems: list[str],
) -> None:
    """Extend `spans` ([first start, end) per partition of a writer's commits so far) by one
    commit's ranges, each a JSON triple (partition key, start, end): a skipped range (Kafka had
    deleted it before it was read) extends a span it starts at the end of; a committed range
    must start where the partition's span ends, else a problem naming `where` (the commit)."""
    for key, start, end in skipped:
        tp = TopicPartition.parse(key)
        if tp in spans and spans[tp][1] == start:
            spans[tp] = (spans[tp][0], end)
    for key, start, end in ranges:
        tp = TopicPartition.parse(key)
        if tp in spans and spans[tp][1] != start:
            problems.append(
                f"{where}: range of {tp} starts at {start}, but the writer's previous commit "
                f"ended at {spans[tp][1]}"
            )
        spans[tp] = (spans[tp][0] if tp in spans else start, end)


def kafka_offsets(
    bootstrap: str,
    spans: Mapping[TopicPartition, tuple[int, int]],
    isolation_level: str,
    consumer_config: Mapping[str, str],
    log_starts: dict[TopicPartition, int] | None = None,
) -> set[Coordinate]:
    """The offsets Kafka holds in each span (records, not gaps or transaction markers), from
    the log start on; each partition's log start goes into `log_starts` when given."""
    from lakesink.kafka.client import watermarks
    from lakesink.kafka.deserializers import make_deserializer
    from lakesink.kafka.reader import read_range
    from lakesink.protocol.offsets import OffsetRange

    out: set[Coordinate] = set()
    raw = make_deserializer("raw")
    marks = watermarks(bootstrap, list(spans), isolation_level, extra=dict(consumer_config))
    for tp, (start, end) in spans.items():
        low = marks[tp][0]
        if log_starts is not None:
            log_starts[tp] = low
        if max(start, low) >= end:
            continue
        for batch in read_range(
            bootstrap,
            OffsetRange(tp, max(start, low), end),
            isolation_level=isolation_level,
            deserializer=raw,
            consumer_config=dict(consumer_config),
        ):
            out.update(
                (tp.topic, tp.partition, int(o)) for o in batch.column("kafka_offset").to_pylist()
            )
    return out


def filtered_out(
    kept_by_transform: KeptByTransform | None,
    spans: Mapping[TopicPartition, tuple[int, int]],
    log_starts: Mapping[TopicPartition, int],
    expected: set[Coordinate],
    dead: set[Coordinate],
) -> set[Coordinate]:
    """The Kafka records of the committed spans (from the log start on) that the table's
    transformation drops: consumed and committed, but never rows."""
    if kept_by_transform is None:
        return set()
    ranges = [
        OffsetRange(tp, max(start, log_starts.get(tp, 0)), end)
        for tp, (start, end) in spans.items()
        if max(start, log_starts.get(tp, 0)) < end
    ]
    return expected - dead - kept_by_transform(ranges)


@dataclass(frozen=True, slots=True)
class DeadLetters:
    """The Kafka coordinates of the records a writer dead-lettered, as read back from its
    dead-letter table (exactly once, like the main table: a record twice is a problem) or
    topic (at least once: a retried task may send a record again)."""

    coordinates: tuple[Coordinate, ...]
    exactly_once: bool

    def check(self, table_rows: set[Coordinate], problems: list[str]) -> set[Coordinate]:
        """The dead-lettered records, after noting in `problems` those the dead-letter table
        holds twice and those that are in the main table as well (each record belongs in
        exactly one of the two)."""
        counts = Counter(self.coordinates)
        twice = sorted(c for c, n in counts.items() if n > 1)
        if self.exactly_once and twice:
            problems.append(f"dead-letter table: {len(twice)} duplicated records, e.g. {twice[:3]}")
        both = sorted(table_rows & counts.keys())
        if both:
            problems.append(
                f"{len(both)} records are both in the table and dead-lettered, e.g. {both[:3]}"
            )
        return set(counts)


@dataclass(frozen=True, slots=True)
class KafkaComparison:
    """What `compare_with_kafka` counted (each format's report keeps these numbers)."""

    kafka_records: int  # records Kafka holds in the committed spans, from the log start on
    rows_below_log_start: int  # rows whose records Kafka deleted since: not checked
    dead_letters: int  # records of the spans the writer dead-lettered
    filtered: int  # records of the spans the transformation drops


def compare_with_kafka(
    rows: set[Coordinate],
    spans: Mapping[TopicPartition, tuple[int, int]],
    *,
    bootstrap: str,
    isolation_level: str,
    consumer_config: Mapping[str, str],
    dead_letters: DeadLetters | None,
    kept_by_transform: KeptByTransform | None,
    problems: list[str],
) -> KafkaComparison:
    """The table's `rows` against the records Kafka holds in the writer's committed `spans`:
    every record is a row, dead-lettered or filtered out by the transformation (else it is
    missing), and every row is a record (else it is extra) unless Kafka deleted it since (below
    the log start). Each failure goes into `problems`."""
    lows: dict[TopicPartition, int] = {}
    expected = kafka_offsets(bootstrap, spans, isolation_level, consumer_config, lows)
    gone = {c for c in rows if c[2] < lows.get(TopicPartition(c[0], c[1]), 0)}
    dead = dead_letters.check(rows, problems) & expected if dead_letters else set()
    filtered = filtered_out(kept_by_transform, spans, lows, expected, dead)
    missing = expected - rows - dead - filtered
    if missing:
        problems.append(
            f"{len(missing)} Kafka records of committed ranges are not in the table, "
            f"e.g. {sorted(missing)[:3]}"
        )
    extra = rows - expected - gone
    if extra:
        problems.append(
            f"{len(extra)} table rows are not records in Kafka, e.g. {sorted(extra)[:3]}"
        )
    return KafkaComparison(len(expected), len(gone), len(dead), len(filtered))


@dataclass(frozen=True, slots=True)
class FoldAudit:
    """What a table whose rows change by key (write.operation upsert or cdc) is audited with:
    the deserializer its records were decoded with (a change stream's carries the operation),
    its record key and ordering columns. The table must equal the fold of the committed
    records by key under the ordering rule (lakesink.engine.fold)."""

    deserializer: Deserializer
    key: tuple[str, ...]
    ordering: str | None


@dataclass(frozen=True, slots=True)
class FoldComparison:
    """What `compare_with_fold` counted."""

    kafka_records: int  # records Kafka holds in the committed spans (tombstones included)
    versions: int  # of them, the versions of keys (the decoded records)
    keys: int  # keys the fold leaves (deleted keys not counted)
    wrong_keys: int  # keys missing from the table, extra in it, or holding other values
    dead_letters: int  # records that did not decode: dead letters, not versions


def folded_versions(
    audit: FoldAudit,
    spans: Mapping[TopicPartition, tuple[int, int]],
    *,
    bootstrap: str,
    isolation_level: str,
    consumer_config: Mapping[str, str],
    problems: list[str],
) -> tuple[pa.Table | None, int, int, int]:
    """The fold of every record Kafka holds in `spans`, decoded as the writer decoded them:
    (one row per live key or None when there were no versions, records read, versions, records
    that failed to decode). A span whose first records Kafka has deleted cannot be folded: it is
    named in `problems`."""
    from lakesink.engine.fold import fold_by_key
    from lakesink.kafka.client import watermarks
    from lakesink.kafka.reader import RangeReadStats, read_range
    from lakesink.protocol.mutation import CHANGE_COLUMNS, OPERATION_COLUMN, RowOperation

    marks = watermarks(bootstrap, list(spans), isolation_level, extra=dict(consumer_config))
    pieces: list[pa.Table] = []
    read = failed = 0
    for tp, (start, end) in sorted(spans.items()):
        if marks[tp][0] > start:
            problems.append(
                f"{tp}: Kafka deleted records from {start} to {marks[tp][0]} since they were "
                "committed; the fold of the table's records cannot be rebuilt"
            )
            continue
        if start >= end:
            continue
        stats = RangeReadStats()
        failures: list[object] = []
        for batch in read_range(
            bootstrap,
            OffsetRange(tp, start, end),
            deserializer=audit.deserializer,
            isolation_level=isolation_level,
            consumer_config=dict(consumer_config),
            errors_tolerance="all",
            on_dead_letter=failures.append,
            stats=stats,
        ):
            pieces.append(pa.Table.from_batches([batch]))
        read += stats.records_read
        failed += len(failures)
    if not pieces:
        return None, read, 0, failed
    versions = pa.concat_tables(pieces, promote_options="default")
    if OPERATION_COLUMN not in versions.column_names:  # upserts: every record a new version
        versions = versions.append_column(
            OPERATION_COLUMN,
            pa.array([RowOperation.UPDATE.code] * versions.num_rows, pa.int8()),
        )
    folded = fold_by_key(versions, audit.key, audit.ordering)
    live = folded.filter(pc.not_equal(folded.column(OPERATION_COLUMN), RowOperation.DELETE.code))
    kept = [c for c in live.column_names if c not in CHANGE_COLUMNS]
    return live.select(kept), read, versions.num_rows, failed


def compare_with_fold(
    rows: pa.Table | None,
    spans: Mapping[TopicPartition, tuple[int, int]],
    audit: FoldAudit,
    *,
    bootstrap: str,
    isolation_level: str,
    consumer_config: Mapping[str, str],
    problems: list[str],
    null_list_is_empty: bool = False,
) -> FoldComparison:
    """The table's `rows` (every column, as one reader read them) against the fold of the
    records Kafka holds in the writer's committed `spans`: the same keys, and for each key the
    same value in every column the fold has (the Kafka coordinates of the winning version
    included). Each failure goes into `problems`, with a few keys as examples.
    `null_list_is_empty`: a null list and an empty one count as equal (the table's writer keeps
    no difference: pyiceberg writes a null list as an empty one)."""
    expected, read, versions, failed = folded_versions(
        audit,
        spans,
        bootstrap=bootstrap,
        isolation_level=isolation_level,
        consumer_config=consumer_config,
        problems=problems,
    )
    want = _by_key(expected, audit.key, null_list_is_empty) if expected is not None else {}
    columns = list(expected.column_names) if expected is not None else []
    if rows is None:  # nothing committed yet
        rows = expected.schema.empty_table() if expected is not None else pa.table({})
    missing = [c for c in columns if c not in rows.column_names]
    if missing:
        problems.append(f"the table has no column {', '.join(map(repr, missing))}")
        return FoldComparison(read, versions, len(want), len(want), failed)
    got = _by_key(rows.select(columns), audit.key, null_list_is_empty) if columns else {}
    wrong = sorted((k for k in want.keys() | got.keys() if want.get(k) != got.get(k)), key=repr)
    if len(got) != rows.num_rows:
        problems.append(f"{rows.num_rows - len(got)} rows repeat a key another row holds")
    if wrong:
        examples = "; ".join(
            f"key {k!r}: expected {want.get(k)!r}, table {got.get(k)!r}" for k in wrong[:3]
        )
        problems.append(
            f"{len(wrong)} of {len(want)} keys differ from the fold of the committed Kafka "
            f"records ({len(set(got) - set(want))} extra, {len(set(want) - set(got))} "
            f"missing): {examples}"
        )
    return FoldComparison(read, versions, len(want), len(wrong), failed)


def _by_key(
    rows: pa.Table, key: tuple[str, ...], null_list_is_empty: bool = False
) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    names = rows.column_names
    out: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for row in rows.to_pylist():
        values = (row[n] for n in names)
        if null_list_is_empty:
            values = (None if v == [] else v for v in values)
        out[tuple(row[k] for k in key)] = tuple(values)
    return out
