"""The coordinator's commit decision: publish, replay, or refuse a confused batch."""

import pytest

from lakesink.errors import CommitError, OffsetError
from lakesink.protocol.commit import Verdict, classify_batch, decide
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets
from lakesink.protocol.write_status import FileWrite, WriteStatus

TP0 = TopicPartition("events", 0)
TP1 = TopicPartition("events", 1)


def status(r: OffsetRange | None, attempt: str = "a") -> WriteStatus:
    f = FileWrite("", "fid", f"fid_{attempt}.parquet", 3, 100)
    return WriteStatus("20260101000000000", attempt, r, (f,), 3, 3)


def test_new_batch_on_fresh_writer_publishes() -> None:
    assert classify_batch(WriterOffsets.empty(), [OffsetRange(TP0, 0, 5)]) is Verdict.PUBLISH


def test_batch_starting_at_committed_position_publishes() -> None:
    committed = WriterOffsets({TP0: 5})
    assert classify_batch(committed, [OffsetRange(TP0, 5, 9)]) is Verdict.PUBLISH


def test_replayed_batch_is_already_committed() -> None:
    """Spark re-runs batch N after a crash between the table commit and commits/N."""
    committed = WriterOffsets({TP0: 9, TP1: 4})
    batch = [OffsetRange(TP0, 5, 9), OffsetRange(TP1, 0, 4)]
    assert classify_batch(committed, batch) is Verdict.ALREADY_COMMITTED


def test_empty_batch_commits_nothing() -> None:
    assert (
        classify_batch(WriterOffsets({TP0: 3}), [OffsetRange(TP0, 3, 3)])
        is Verdict.NOTHING_TO_COMMIT
    )


def test_partly_committed_batch_is_refused() -> None:
    committed = WriterOffsets({TP0: 9, TP1: 0})
    with pytest.raises(OffsetError, match="partly committed"):
        classify_batch(committed, [OffsetRange(TP0, 5, 9), OffsetRange(TP1, 0, 4)])


def test_batch_with_a_gap_names_expected_offset() -> None:
    with pytest.raises(OffsetError, match="expected a batch starting at 5"):
        classify_batch(WriterOffsets({TP0: 5}), [OffsetRange(TP0, 7, 9)])


def test_decide_advances_offsets_over_all_planned_ranges() -> None:
    planned = [OffsetRange(TP0, 0, 5), OffsetRange(TP1, 0, 0)]
    d = decide(WriterOffsets.empty(), planned, [status(None)])
    assert d.verdict is Verdict.PUBLISH
    assert d.next_offsets.get(TP0) == 5


def test_decide_keeps_one_attempt_per_range() -> None:
    r = OffsetRange(TP0, 0, 5)
    d = decide(WriterOffsets.empty(), [r], [status(r, "a"), status(r, "b")])
    assert [s.task_attempt for s in d.statuses] == ["a"]


def test_decide_refuses_a_status_for_an_unplanned_range() -> None:
    with pytest.raises(CommitError, match="did not plan"):
        decide(WriterOffsets.empty(), [OffsetRange(TP0, 0, 5)], [status(OffsetRange(TP0, 0, 6))])


def test_decide_refuses_missing_ranged_status() -> None:
    planned = [OffsetRange(TP0, 0, 5), OffsetRange(TP1, 0, 5)]
    with pytest.raises(CommitError, match="no write status"):
        decide(WriterOffsets.empty(), planned, [status(OffsetRange(TP0, 0, 5))])


def test_write_status_json_round_trip() -> None:
    s = status(OffsetRange(TP1, 2, 9))
    assert WriteStatus.from_json(s.to_json()) == s
