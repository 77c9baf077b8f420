"""What a task reports back to the coordinator (the seed's WRITE-STATUS)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lakesink.protocol.offsets import OffsetRange, TopicPartition


@dataclass(frozen=True, slots=True)
class FileWrite:
    """One base file a task wrote: Hudi's HoodieWriteStat, in lakesink's words."""

    partition_path: str
    file_id: str
    path: str  # relative to the table base path
    num_writes: int
    file_size_bytes: int
    prev_commit: str = "null"
    num_inserts: int = 0
    total_write_bytes: int = 0
    num_update_writes: int = 0
    """Rows of the file that a version of this write changed (an upsert's merge)."""
    num_deletes: int = 0
    """Rows of the previous slice that this write deleted."""

    def to_json(self) -> dict[str, Any]:
        return {
            "partition_path": self.partition_path,
            "file_id": self.file_id,
            "path": self.path,
            "num_writes": self.num_writes,
            "file_size_bytes": self.file_size_bytes,
            "prev_commit": self.prev_commit,
            "num_inserts": self.num_inserts,
            "total_write_bytes": self.total_write_bytes,
            "num_update_writes": self.num_update_writes,
            "num_deletes": self.num_deletes,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FileWrite:
        # statuses of older releases have no update and delete counts: they default to 0
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d or k not in _SINCE})


_SINCE = frozenset({"num_update_writes", "num_deletes"})


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that could not be converted, routed aside under errors.tolerance=all."""

    partition: TopicPartition
    offset: int
    error: str


@dataclass(frozen=True, slots=True)
class WriteStatus:
    """One task attempt's result: the files it wrote and, when the task also read Kafka, the
    offset range it read in full. Sink tasks that run after a user transformation cannot know
    their range; Spark's job success vouches that every planned range was read."""

    instant_time: str
    task_attempt: str  # unique per attempt; files of other attempts are orphans
    offset_range: OffsetRange | None = None
    files: tuple[FileWrite, ...] = ()
    records_read: int = 0
    records_written: int = 0
    dead_letters: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        r = self.offset_range
        return {
            "instant_time": self.instant_time,
            "task_attempt": self.task_attempt,
            "range": None
            if r is None
            else [r.partition.topic, r.partition.partition, r.start, r.end],
            "files": [f.to_json() for f in self.files],
            "records_read": self.records_read,
            "records_written": self.records_written,
            "dead_letters": self.dead_letters,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WriteStatus:
        rng = d.get("range")
        return cls(
            instant_time=d["instant_time"],
            task_attempt=d["task_attempt"],
            offset_range=None
            if rng is None
            else OffsetRange(TopicPartition(rng[0], rng[1]), rng[2], rng[3]),
            files=tuple(FileWrite.from_json(f) for f in d["files"]),
            records_read=d["records_read"],
            records_written=d["records_written"],
            dead_letters=d.get("dead_letters", 0),
            extra=d.get("extra", {}),
        )


def total_records(statuses: Iterable[WriteStatus]) -> int:
    return sum(s.records_written for s in statuses)
