"""State machine over the pure commit protocol (classify_batch, decide, WriterOffsets): a Kafka
log, Spark's offset log and a table modelled as the list of committed batches.

Random interleavings of produce, plan, commit (with duplicate and failed task attempts), Spark
replays (crash after the table commit, before Spark records the batch), replays of any older
batch, deleted checkpoints, stale coordinators planning from old offsets. Invariants: every
offset is committed exactly once, contiguously; committed offsets only move forward; a replay
never publishes; a confused batch (overlap, gap, partly committed) is refused, never published.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lakesink.errors import CommitError, OffsetError
from lakesink.protocol.commit import Verdict, classify_batch, decide
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets, merge_contiguous
from lakesink.protocol.write_status import WriteStatus

PARTS = [TopicPartition("t", p) for p in range(3)]
Batch = tuple[OffsetRange, ...]


def status(r: OffsetRange | None, attempt: str) -> WriteStatus:
    return WriteStatus("20260101000000000", attempt, r, (), 0, 0 if r is None else r.span)


class ProtocolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.hw = {tp: 0 for tp in PARTS}
        self.committed = WriterOffsets.empty()
        self.commits: list[Batch] = []  # the table: each published batch's ranges
        self.spark_end: dict[TopicPartition, int] = {}  # end of Spark's last planned batch
        self.pending: Batch | None = None  # planned by Spark, not recorded as done

    @rule(p=st.sampled_from(PARTS), n=st.integers(1, 50))
    def produce(self, p: TopicPartition, n: int) -> None:
        self.hw[p] += n

    @precondition(lambda self: self.pending is None)
    @rule(cap=st.integers(1, 40), split=st.integers(1, 20))
    def plan(self, cap: int, split: int) -> None:
        """Spark plans the next batch from its offset log (or the table, on a fresh query),
        split into tasks of at most `split` offsets."""
        ranges: list[OffsetRange] = []
        for tp in PARTS:
            start = self.spark_end.get(tp, self.committed.get(tp) or 0)
            ranges.extend(OffsetRange(tp, start, min(self.hw[tp], start + cap)).split(split))
            if self.hw[tp] == start:
                ranges.append(OffsetRange(tp, start, start))
        self.pending = tuple(ranges)
        for r in ranges:
            self.spark_end[r.partition] = max(self.spark_end.get(r.partition, 0), r.end)

    @precondition(lambda self: self.pending is not None)
    @rule(
        sink_tasks=st.booleans(),
        duplicates=st.booleans(),
        spark_records=st.booleans(),
    )
    def commit(self, sink_tasks: bool, duplicates: bool, spark_records: bool) -> None:
        """The coordinator decides on the pending batch; Spark records it (or crashes first)."""
        assert self.pending is not None
        planned = list(self.pending)
        non_empty = [r for r in planned if not r.is_empty]
        if sink_tasks:
            statuses = [status(None, f"sink-{i}") for i in range(max(1, len(non_empty)))]
        else:
            statuses = [status(r, f"a-{i}") for i, r in enumerate(non_empty)]
            if duplicates:
                statuses += [status(r, f"dup-{i}") for i, r in enumerate(non_empty)]
        before = self.committed
        decision = decide(self.committed, planned, statuses)
        if decision.verdict is Verdict.PUBLISH:
            assert non_empty
            for r in merge_contiguous(non_empty):
                assert (before.get(r.partition) or 0) <= r.start
            self.committed = decision.next_offsets
            self.commits.append(tuple(non_empty))
        elif decision.verdict is Verdict.ALREADY_COMMITTED:
            assert all((before.get(r.partition) or 0) >= r.end for r in non_empty)
            assert decision.next_offsets == before
        else:
            assert not non_empty
        if spark_records:
            self.pending = None

    @precondition(lambda self: self.pending is not None)
    @rule(drop=st.integers(0, 10))
    def missing_status_is_refused(self, drop: int) -> None:
        """A batch whose statuses do not cover every planned range is never published."""
        assert self.pending is not None
        non_empty = [r for r in self.pending if not r.is_empty]
        if classify_batch(self.committed, self.pending) is not Verdict.PUBLISH or not non_empty:
            return
        statuses = [status(r, f"a-{i}") for i, r in enumerate(non_empty)]
        del statuses[drop % len(statuses)]
        if not statuses:
            return  # no status at all: the sink-task path, covered by commit()
        with pytest.raises(CommitError):
            decide(self.committed, list(self.pending), statuses)

    @precondition(lambda self: self.pending is not None)
    @rule()
    def unplanned_status_is_refused(self) -> None:
        assert self.pending is not None
        if classify_batch(self.committed, self.pending) is not Verdict.PUBLISH:
            return
        stray = OffsetRange(TopicPartition("other", 0), 0, 1)
        with pytest.raises(CommitError):
            decide(self.committed, list(self.pending), [status(stray, "x")])

    @precondition(lambda self: bool(self.commits))
    @rule(data=st.data())
    def replay_of_any_committed_batch_publishes_nothing(self, data: st.DataObject) -> None:
        batch = data.draw(st.sampled_from(self.commits))
        assert classify_batch(self.committed, batch) is Verdict.ALREADY_COMMITTED
        decision = decide(self.committed, list(batch), [])
        assert decision.verdict is Verdict.ALREADY_COMMITTED
        assert decision.next_offsets == self.committed

    @precondition(lambda self: self.pending is None)
    @rule()
    def delete_checkpoint(self) -> None:
        """Spark's checkpoint is lost: the next batch is planned from the table's offsets."""
        self.spark_end = {}

    @rule(p=st.sampled_from(PARTS), back=st.integers(1, 30), length=st.integers(0, 30))
    def stale_or_confused_batch_is_refused(self, p: TopicPartition, back: int, length: int) -> None:
        """A batch starting before or after the committed position (a zombie, a foreign
        checkpoint) that is not a pure replay is refused with OffsetError."""
        pos = self.committed.get(p)
        if pos is None:
            return
        for start in (max(0, pos - back), pos + back):
            end = start + length
            r = OffsetRange(p, start, end)
            if r.is_empty or end <= pos:
                continue  # empty or a pure replay: fine
            if start == pos:
                continue
            with pytest.raises(OffsetError):
                classify_batch(self.committed, [r])

    @invariant()
    def every_offset_committed_exactly_once_contiguously(self) -> None:
        seen: dict[TopicPartition, list[int]] = {}
        for batch in self.commits:
            for r in batch:
                seen.setdefault(r.partition, []).extend(range(r.start, r.end))
        for tp, offsets in seen.items():
            assert offsets == list(range(len(offsets))), f"{tp}: gap or duplicate"
            assert self.committed.get(tp) == len(offsets)
            assert len(offsets) <= self.hw[tp]


ProtocolMachine.TestCase.settings = settings(max_examples=50, stateful_step_count=30, deadline=None)
test_protocol_state_machine = ProtocolMachine.TestCase


offsets_maps = st.dictionaries(st.sampled_from(PARTS), st.integers(0, 1000), max_size=3)


@settings(max_examples=200, deadline=None)
@given(
    committed=offsets_maps,
    ranges=st.lists(
        st.tuples(st.sampled_from(PARTS), st.integers(0, 1000), st.integers(0, 100)),
        max_size=6,
    ),
)
def test_writer_offsets_advance_only_contiguously_and_forward(
    committed: dict[TopicPartition, int], ranges: list[tuple[TopicPartition, int, int]]
) -> None:
    base = WriterOffsets(committed)
    rs = [OffsetRange(tp, s, s + n) for tp, s, n in ranges]
    try:
        after = base.advanced_by(rs)
    except OffsetError:
        # refused: some range does not start at the position (after earlier ranges) it needs
        return
    for tp, pos in base.next_offsets.items():
        assert (after.get(tp) or 0) >= pos
    ordered = sorted(rs)
    position = dict(base.next_offsets)
    for r in ordered:
        if r.partition in position:
            assert r.start == position[r.partition]
        position[r.partition] = r.end
    assert after.next_offsets == position
    assert WriterOffsets.from_json(after.to_json()) == after
