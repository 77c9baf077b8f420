"""Kafka offsets as values: a partition, a half-open range of offsets, and a writer's positions."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from lakesink.errors import OffsetError


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """One partition of one Kafka topic."""

    topic: str
    partition: int

    def __post_init__(self) -> None:
        if not self.topic:
            raise OffsetError("a topic name must not be empty")
        if self.partition < 0:
            raise OffsetError(f"partition {self.partition} of {self.topic!r} is negative")

    def key(self) -> str:
        """The text form used in commit metadata: `topic:partition`."""
        return f"{self.topic}:{self.partition}"

    @classmethod
    def parse(cls, text: str) -> TopicPartition:
        topic, sep, partition = text.rpartition(":")
        if not sep or not partition.isdigit():
            raise OffsetError(f"{text!r} is not a partition key of the form 'topic:partition'")
        return cls(topic, int(partition))

    def __str__(self) -> str:
        return self.key()


@dataclass(frozen=True, slots=True, order=True)
class OffsetRange:
    """The records `[start, end)` of one partition. Offsets may have gaps inside the range
    (transaction markers, compaction), so `end - start` bounds the record count, not equals it."""

    partition: TopicPartition
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise OffsetError(
                f"offset range [{self.start}, {self.end}) of {self.partition} is not valid: "
                "need 0 <= start <= end"
            )

    @property
    def span(self) -> int:
        return self.end - self.start

    @property
    def is_empty(self) -> bool:
        return self.end == self.start

    def split(self, max_span: int) -> list[OffsetRange]:
        """Cut into consecutive ranges of at most `max_span` offsets (one Spark task each)."""
        if max_span <= 0:
            raise OffsetError(f"max_span must be positive, got {max_span}")
        return [
            OffsetRange(self.partition, s, min(s + max_span, self.end))
            for s in range(self.start, self.end, max_span)
        ]


def partition_order(tp: TopicPartition) -> tuple[str, int]:
    """Sort key of partitions: their order, as a plain tuple (comparing the dataclasses
    themselves builds two tuples per comparison; at hundreds of partitions that showed)."""
    return (tp.topic, tp.partition)


def range_order(r: OffsetRange) -> tuple[str, int, int, int]:
    """Sort key of ranges: their order, as a plain tuple (see `partition_order`)."""
    return (r.partition.topic, r.partition.partition, r.start, r.end)


@dataclass(frozen=True, slots=True)
class WriterOffsets:
    """The next offset to read for every partition a writer has committed: what the table knows."""

    next_offsets: Mapping[TopicPartition, int]

    @classmethod
    def empty(cls) -> WriterOffsets:
        return cls({})

    def get(self, partition: TopicPartition) -> int | None:
        return self.next_offsets.get(partition)

    def to_json(self) -> dict[str, int]:
        items = sorted(self.next_offsets.items(), key=lambda kv: partition_order(kv[0]))
        return {tp.key(): off for tp, off in items}

    @classmethod
    def from_json(cls, data: Mapping[str, int]) -> WriterOffsets:
        return cls({TopicPartition.parse(k): int(v) for k, v in data.items()})

    def advanced_by(self, ranges: Iterable[OffsetRange]) -> WriterOffsets:
        """The positions after committing `ranges`. Refuses to move backwards or to skip:
        each range must start exactly where this writer's committed position for it stands
        (a partition never seen before may start anywhere)."""
        merged = dict(self.next_offsets)
        for r in sorted(ranges, key=range_order):
            current = merged.get(r.partition)
            if current is not None and r.start != current:
                kind = "overlaps" if r.start < current else "leaves a gap after"
                raise OffsetError(
                    f"range [{r.start}, {r.end}) of {r.partition} {kind} the committed "
                    f"position {current}; expected a range starting at {current}"
                )
            merged[r.partition] = r.end
        return WriterOffsets(merged)

    def __iter__(self) -> Iterator[TopicPartition]:
        return iter(sorted(self.next_offsets, key=partition_order))


def merge_contiguous(ranges: Iterable[OffsetRange]) -> list[OffsetRange]:
    """Join ranges of the same partition that touch (the task splits of one partition)."""
    out: list[OffsetRange] = []
    last: OffsetRange | None = None
    for r in sorted(ranges, key=range_order):
        # partitions compared by their fields: the dataclass `==` builds two tuples per call
        if (
            last is None
            or last.partition.partition != r.partition.partition
            or last.partition.topic != r.partition.topic
        ):
            out.append(r)
        elif last.end == r.start:
            out[-1] = OffsetRange(r.partition, last.start, r.end)
        elif r.start < last.end:
            raise OffsetError(f"ranges of {r.partition} overlap at offset {r.start}")
        else:
            out.append(r)
        last = out[-1]
    return out
