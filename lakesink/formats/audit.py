"""The format-neutral half of the exactly-once audit: Kafka coordinates, the records Kafka holds
in committed spans, those a transformation drops and those a writer dead-lettered. Each format's
audit (formats/hudi/audit.py, formats/iceberg/audit.py) reads its own table and checks its rows
against these, and `lakesink verify` builds the dead letters without knowing the format."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyarrow as pa

from lakesink.protocol.offsets import OffsetRange, TopicPartition

COORDINATES = ["kafka_topic", "kafka_partition", "kafka_offset"]
Coordinate = tuple[str, int, int]
# The Kafka records a table's transformation keeps, of the ranges given (cli.verify builds one
# from `transform.arrow`): the records it filters out are accounted for, not missing.
KeptByTransform = Callable[[list[OffsetRange]], set[Coordinate]]


def coordinates_in(table: pa.Table, topics: set[str]) -> list[Coordinate]:
    """The coordinates of `table`'s rows of `topics` (the audit checks only the writer's topics)."""
    cols = [table.column(c).to_pylist() for c in COORDINATES]
    return [(t, int(p), int(o)) for t, p, o in zip(*cols, strict=True) if t in topics]


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
