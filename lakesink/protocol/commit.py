"""The coordinator's commit decision for one batch, as pure logic.

The commit is idempotent on (writer id, offsets): a batch whose ranges the writer has already
committed is a replay and publishes nothing; a batch that starts exactly where the writer's
committed offsets stand is published; anything else is a stale or confused coordinator and fails
with a message naming expected and found offsets.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lakesink.errors import CommitError, OffsetError
from lakesink.protocol.offsets import OffsetRange, WriterOffsets, merge_contiguous, range_order
from lakesink.protocol.write_status import WriteStatus


class Verdict(enum.Enum):
    PUBLISH = "publish"
    ALREADY_COMMITTED = "already-committed"
    NOTHING_TO_COMMIT = "nothing-to-commit"


@dataclass(frozen=True, slots=True)
class CommitDecision:
    verdict: Verdict
    statuses: tuple[WriteStatus, ...]  # one accepted status per planned range
    next_offsets: WriterOffsets  # the writer's positions after this batch


def classify_batch(committed: WriterOffsets, planned: Iterable[OffsetRange]) -> Verdict:
    """Is this batch new, a replay of committed work, or nothing at all?"""
    ranges = [r for r in merge_contiguous(planned) if not r.is_empty]
    if not ranges:
        return Verdict.NOTHING_TO_COMMIT
    # each partition's committed position looked up once (hundreds of partitions per batch)
    positions = [committed.get(r.partition) for r in ranges]
    replayed = [
        (r, pos)
        for r, pos in zip(ranges, positions, strict=True)
        if pos is not None and pos >= r.end
    ]
    if len(replayed) == len(ranges):
        return Verdict.ALREADY_COMMITTED
    if replayed:
        done = ", ".join(f"{r.partition}@{pos}" for r, pos in replayed)
        raise OffsetError(
            f"batch is partly committed already ({done}) and partly not; "
            "the table and the checkpoint disagree. Run 'lakesink verify' and restart the query."
        )
    for r, current in zip(ranges, positions, strict=True):
        if current is not None and current != r.start:
            raise OffsetError(
                f"batch starts {r.partition} at {r.start} but the table's committed position is "
                f"{current}; expected a batch starting at {current}. Another incarnation of this "
                "writer may be running, or the checkpoint belongs to another table."
            )
    return Verdict.PUBLISH


def decide(
    committed: WriterOffsets,
    planned: Sequence[OffsetRange],
    statuses: Iterable[WriteStatus],
) -> CommitDecision:
    """Check the task statuses cover the planned ranges exactly once, then classify the batch."""
    verdict = classify_batch(committed, planned)
    if verdict is not Verdict.PUBLISH:
        return CommitDecision(verdict, (), committed)
    wanted = {r: None for r in planned if not r.is_empty}
    by_range: dict[OffsetRange, WriteStatus] = {}
    unranged: list[WriteStatus] = []
    for s in statuses:
        if s.offset_range is None:
            unranged.append(s)  # a sink task: Spark returns one successful attempt per task
            continue
        if s.offset_range not in wanted:
            raise CommitError(
                f"task attempt {s.task_attempt} reports range {s.offset_range.partition} "
                f"[{s.offset_range.start}, {s.offset_range.end}) that this batch did not plan"
            )
        by_range.setdefault(s.offset_range, s)  # a duplicate attempt's files become orphans
    if by_range and not unranged:
        missing = [r for r in wanted if r not in by_range]
        if missing:
            names = ", ".join(f"{r.partition}[{r.start},{r.end})" for r in missing)
            raise CommitError(f"no write status for planned ranges {names}; batch not committed")
    ordered = tuple(by_range[r] for r in sorted(by_range, key=range_order)) + tuple(unranged)
    return CommitDecision(verdict, ordered, committed.advanced_by(wanted))
