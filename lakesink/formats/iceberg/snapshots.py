"""What lakesink writes into each Iceberg snapshot summary, and how it finds it again.

Every snapshot lakesink commits carries (the Iceberg Kafka Connect sink's shape):
- `lakesink.layout`: the layout of these keys (`1`);
- `lakesink.writer-id` and `lakesink.commit-id` (unique per commit attempt sequence of a batch);
- `lakesink.offsets`: the writer's next Kafka offset of every partition it has committed, after
  this commit (`{"topic:partition": offset}`, JSON) — the table is the source of truth;
- `lakesink.vtts`: the valid-through timestamp in ms (the minimum over the writer's partitions of
  the maximum record timestamp it ingested; absent when a partition had no records in the batch);
- `lakesink.incarnation`: the writer's incarnation that committed (absent for a writer that
  claimed none).

Zombie fencing: each start of a writer claims the next incarnation of its writer id in the table
property `lakesink.writer.<writer id>.incarnation` (`incarnation_key`), and each of its commits
requires, inside the catalog's commit, that the property still holds its own number.

Recovery walks the current snapshot's lineage back (parent by parent, past other writers'
snapshots) to the writer's newest commit (`find_writer_commit`). The `AppendRequirement` decides a
commit against what that walk finds: go ahead, already landed (our own commit id, its response
lost), a replay of committed ranges, or offsets that moved elsewhere (a stale or zombie writer).
Everything here is pure: values in, values out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from lakesink.errors import OffsetError
from lakesink.formats.iceberg.errors import SummaryLayoutError
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets

__all__ = [
    "KEY_BACKFILL_ID",
    "KEY_BACKFILL_SOURCE",
    "KEY_COMMIT_ID",
    "KEY_INCARNATION",
    "KEY_LAYOUT",
    "KEY_LOST",
    "KEY_MAINTENANCE",
    "KEY_OFFSETS",
    "KEY_RANGES",
    "KEY_SKIPPED",
    "KEY_VTTS",
    "KEY_WRITER_ID",
    "LAYOUT",
    "AppendRequirement",
    "AppendVerdict",
    "SnapshotInfo",
    "WriterCommit",
    "find_writer_commit",
    "incarnation_key",
    "last_commit_by_writer",
    "lineage",
    "parse_incarnation",
    "valid_through",
]

LAYOUT = "1"
PREFIX = "lakesink."
KEY_LAYOUT = PREFIX + "layout"
KEY_WRITER_ID = PREFIX + "writer-id"
KEY_COMMIT_ID = PREFIX + "commit-id"
KEY_OFFSETS = PREFIX + "offsets"
KEY_VTTS = PREFIX + "vtts"
KEY_INCARNATION = PREFIX + "incarnation"
KEY_BACKFILL_ID = PREFIX + "backfill-id"
"""In the summary of a backfill's snapshot: the digest of its source files (`lakesink backfill`)."""
KEY_BACKFILL_SOURCE = PREFIX + "backfill-source"
"""In the summary of a backfill's snapshot: its first source files, as a JSON list."""
KEY_MAINTENANCE = PREFIX + "maintenance"
"""In the summary of a snapshot lakesink's maintenance committed (a rewrite): which action. Such a
snapshot is no writer's commit; the lineage walk passes it by."""
KEY_LOST = PREFIX + "lost"
"""Spans cut off a batch at a restart, the broker's log end having moved back below them."""
KEY_RANGES = PREFIX + "ranges"
"""In the summary of a writer's commit to a table of keys: the Kafka ranges it ingested, compact
JSON `[["topic:partition", from, to], ...]` (to exclusive); the fold audit chains them."""
KEY_SKIPPED = PREFIX + "skipped"
"""Beside `KEY_RANGES`: spans Kafka had deleted before they were read, passed over
(kafka.fail.on.data.loss=false), in the same form."""


def incarnation_key(writer_id: str) -> str:
    """The table property holding the newest incarnation claimed for `writer_id`."""
    return f"{PREFIX}writer.{writer_id}.incarnation"


def parse_incarnation(properties: Mapping[str, str], writer_id: str) -> int | None:
    """The incarnation of `writer_id` in the table `properties`; None when unset.
    SummaryLayoutError when the property is not a positive whole number."""
    raw = properties.get(incarnation_key(writer_id))
    if raw is None:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise SummaryLayoutError(
            f"table property {incarnation_key(writer_id)}={raw!r} is not a positive whole number"
        )
    return n


@dataclass(frozen=True, slots=True)
class WriterCommit:
    """lakesink's part of one snapshot summary: who committed, which commit, the writer's
    offsets after it, and the valid-through timestamp (ms) if every partition had records."""

    writer_id: str
    commit_id: str
    offsets: WriterOffsets
    vtts_ms: int | None = None
    incarnation: int | None = None

    def to_summary(self) -> dict[str, str]:
        """The summary properties (strings only, as Iceberg requires)."""
        out = {
            KEY_LAYOUT: LAYOUT,
            KEY_WRITER_ID: self.writer_id,
            KEY_COMMIT_ID: self.commit_id,
            KEY_OFFSETS: json.dumps(self.offsets.to_json(), separators=(",", ":")),
        }
        if self.vtts_ms is not None:
            out[KEY_VTTS] = str(self.vtts_ms)
        if self.incarnation is not None:
            out[KEY_INCARNATION] = str(self.incarnation)
        return out

    @classmethod
    def from_summary(
        cls, summary: Mapping[str, str], snapshot_id: int | None = None
    ) -> WriterCommit | None:
        """lakesink's commit in a summary; None when the snapshot is not lakesink's (no
        `lakesink.*` keys, or a maintenance snapshot's). SummaryLayoutError when the keys are in
        another layout."""
        if not any(k.startswith(PREFIX) for k in summary):
            return None
        if KEY_MAINTENANCE in summary and KEY_WRITER_ID not in summary:
            return None
        where = f"snapshot {snapshot_id}" if snapshot_id is not None else "a snapshot"
        layout = summary.get(KEY_LAYOUT)
        if layout != LAYOUT:
            raise SummaryLayoutError(
                f"{where} has a lakesink summary of layout {layout!r}; this lakesink reads "
                f"layout {LAYOUT!r} only (was the table written by a newer lakesink?)"
            )
        missing = [k for k in (KEY_WRITER_ID, KEY_COMMIT_ID, KEY_OFFSETS) if k not in summary]
        if missing:
            raise SummaryLayoutError(f"{where}: lakesink summary lacks {', '.join(missing)}")
        try:
            raw = json.loads(summary[KEY_OFFSETS])
            if not isinstance(raw, dict) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in raw.values()
            ):
                raise ValueError("not an object of whole numbers")
            offsets = WriterOffsets.from_json(raw)
            vtts = int(summary[KEY_VTTS]) if KEY_VTTS in summary else None
            inc = int(summary[KEY_INCARNATION]) if KEY_INCARNATION in summary else None
        except (ValueError, OffsetError) as e:
            raise SummaryLayoutError(
                f"{where}: lakesink summary {KEY_OFFSETS}/{KEY_VTTS}/{KEY_INCARNATION} cannot be "
                f"read: {e}"
            ) from e
        return cls(summary[KEY_WRITER_ID], summary[KEY_COMMIT_ID], offsets, vtts, inc)


def valid_through(
    max_timestamps_ms: Mapping[TopicPartition, int | None], partitions: Iterable[TopicPartition]
) -> int | None:
    """The VTTS of a batch: the minimum over `partitions` (the writer's partitions) of the
    maximum record timestamp ingested from each; None when one had no records in the batch."""
    out: int | None = None
    for tp in partitions:
        ts = max_timestamps_ms.get(tp)
        if ts is None:
            return None
        out = ts if out is None else min(out, ts)
    return out


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """What the lineage walk needs of one snapshot."""

    snapshot_id: int
    parent_id: int | None
    sequence_number: int
    timestamp_ms: int
    summary: Mapping[str, str] = field(default_factory=dict)


def _lineage(snapshots: Mapping[int, SnapshotInfo], current_id: int | None) -> list[SnapshotInfo]:
    """The current snapshot and its ancestors, newest first. Expiry cuts the chain (pyiceberg
    clears the parent id of a snapshot whose parent it removed), so past the end of the chain
    the walk goes on with the retained snapshots of lower sequence numbers, newest first: their
    ancestry cannot be proven any more, but expiry keeps each writer's newest commit."""
    out: list[SnapshotInfo] = []
    seen: set[int] = set()
    sid = current_id
    while sid is not None and sid in snapshots and sid not in seen:
        s = snapshots[sid]
        out.append(s)
        seen.add(sid)
        sid = s.parent_id
    if out:
        floor = out[-1].sequence_number
        rest = [
            s for s in snapshots.values() if s.snapshot_id not in seen and s.sequence_number < floor
        ]
        out.extend(sorted(rest, key=lambda s: s.sequence_number, reverse=True))
    return out


def lineage(snapshots: Mapping[int, SnapshotInfo], current_id: int | None) -> list[SnapshotInfo]:
    """The snapshots a writer's commits are looked for in, newest first: the current snapshot's
    ancestors, then past an expiry gap the retained older ones (see `_lineage`)."""
    return _lineage(snapshots, current_id)


def find_writer_commit(
    snapshots: Mapping[int, SnapshotInfo], current_id: int | None, writer_id: str
) -> WriterCommit | None:
    """The writer's newest commit in the lineage of `current_id`, walking back past other
    writers' snapshots; None if the writer never committed to this lineage."""
    for s in _lineage(snapshots, current_id):
        c = WriterCommit.from_summary(s.summary, s.snapshot_id)
        if c is not None and c.writer_id == writer_id:
            return c
    return None


def last_commit_by_writer(
    snapshots: Mapping[int, SnapshotInfo], current_id: int | None
) -> dict[str, int]:
    """For every writer in the lineage of `current_id`, the id of its newest snapshot."""
    out: dict[str, int] = {}
    for s in _lineage(snapshots, current_id):
        c = WriterCommit.from_summary(s.summary, s.snapshot_id)
        if c is not None and c.writer_id not in out:
            out[c.writer_id] = s.snapshot_id
    return out


class AppendVerdict(Enum):
    """How an append stands against the writer's committed offsets."""

    PROCEED = "proceed"
    """The writer's offsets are exactly the batch's start offsets: commit."""
    LANDED = "landed"
    """Our own commit id is the writer's newest commit: an earlier attempt landed (its response
    was lost). Nothing more to do; never delete its files."""
    REPLAYED = "replayed"
    """The writer's offsets already stand at the batch's end offsets under another commit id:
    the batch was committed before (a replay after a restart). Commit nothing."""


@dataclass(frozen=True, slots=True)
class AppendRequirement:
    """An append of `ranges` by `writer_id` under `commit_id` requires that the writer's
    offsets in the current lineage are exactly the ranges' start offsets (a partition the writer
    never committed may start anywhere)."""

    writer_id: str
    commit_id: str
    ranges: tuple[OffsetRange, ...]

    def end_offsets(self, committed: WriterOffsets) -> WriterOffsets:
        """The writer's offsets after this append (OffsetError when it does not fit)."""
        return committed.advanced_by(self.ranges)

    def evaluate(self, last: WriterCommit | None) -> AppendVerdict:
        """Decide against the writer's newest commit `last`; OffsetError naming the expected
        and found offsets when they moved elsewhere (a stale or zombie writer)."""
        committed = last.offsets if last is not None else WriterOffsets.empty()
        if last is not None and last.commit_id == self.commit_id:
            return AppendVerdict.LANDED
        mismatched = [r for r in self.ranges if committed.get(r.partition) not in (None, r.start)]
        if not mismatched:
            return AppendVerdict.PROCEED
        if all(committed.get(r.partition) == r.end for r in self.ranges) and any(
            not r.is_empty for r in self.ranges
        ):
            return AppendVerdict.REPLAYED
        detail = ", ".join(
            f"{r.partition} expected {r.start} found {committed.get(r.partition)}"
            for r in mismatched
        )
        raise OffsetError(
            f"writer {self.writer_id!r}: the table's committed offsets moved since this batch "
            f"was planned ({detail}); another incarnation of this writer committed, so this "
            "one must stop and restart from the table's offsets"
        )
