"""Offsets as values: ranges, splits, the writer's forward-only positions."""

import pytest

from lakesink.errors import OffsetError
from lakesink.protocol.offsets import (
    OffsetRange,
    TopicPartition,
    WriterOffsets,
    merge_contiguous,
)

TP0 = TopicPartition("events", 0)
TP1 = TopicPartition("events", 1)


def test_partition_key_round_trips_even_with_colons_in_topic() -> None:
    tp = TopicPartition("ns:events", 12)
    assert TopicPartition.parse(tp.key()) == tp


@pytest.mark.parametrize("text", ["events", "events:", "events:x", ":-1"])
def test_partition_key_parse_rejects_garbage(text: str) -> None:
    with pytest.raises(OffsetError):
        TopicPartition.parse(text)


def test_range_rejects_end_before_start() -> None:
    with pytest.raises(OffsetError, match=r"\[5, 3\)"):
        OffsetRange(TP0, 5, 3)


def test_split_covers_range_without_overlap() -> None:
    pieces = OffsetRange(TP0, 10, 35).split(10)
    assert [(p.start, p.end) for p in pieces] == [(10, 20), (20, 30), (30, 35)]


def test_advance_moves_forward_contiguously() -> None:
    w = WriterOffsets({TP0: 10}).advanced_by([OffsetRange(TP0, 10, 20), OffsetRange(TP1, 3, 4)])
    assert w.get(TP0) == 20 and w.get(TP1) == 4


@pytest.mark.parametrize(("start", "word"), [(5, "overlaps"), (15, "gap")])
def test_advance_refuses_overlap_and_gap(start: int, word: str) -> None:
    with pytest.raises(OffsetError, match=word):
        WriterOffsets({TP0: 10}).advanced_by([OffsetRange(TP0, start, 30)])


def test_json_round_trip() -> None:
    w = WriterOffsets({TP0: 1, TopicPartition("b", 3): 7})
    assert WriterOffsets.from_json(w.to_json()) == w


def test_merge_contiguous_joins_task_splits_and_rejects_overlap() -> None:
    merged = merge_contiguous([OffsetRange(TP0, 20, 30), OffsetRange(TP0, 10, 20)])
    assert merged == [OffsetRange(TP0, 10, 30)]
    with pytest.raises(OffsetError):
        merge_contiguous([OffsetRange(TP0, 10, 20), OffsetRange(TP0, 15, 25)])
