"""Offset planning without a broker: fair batch caps, task splits, start resolution, data loss."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import pytest

from lakesink.errors import ConfigError, DataLossError, OffsetError
from lakesink.kafka.planning import (
    check_data_loss,
    parse_starting_offsets,
    plan_ends,
    plan_ranges,
    resolve_start,
)
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets

A, B, C = (TopicPartition("t", p) for p in range(3))


class FakeLookup:
    def __init__(
        self,
        marks: Mapping[TopicPartition, tuple[int, int]],
        times: Mapping[TopicPartition, int | None] | None = None,
    ) -> None:
        self.marks = dict(marks)
        self.times = dict(times or {})
        self.time_queries: list[dict[TopicPartition, int]] = []

    def watermarks(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, int]]:
        return {tp: self.marks[tp] for tp in partitions}

    def offsets_for_times(
        self, timestamps_ms: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int | None]:
        self.time_queries.append(dict(timestamps_ms))
        return {tp: self.times.get(tp) for tp in timestamps_ms}


def test_plan_ends_without_cap_reads_up_to_latest() -> None:
    assert plan_ends({A: 5, B: 0}, {A: 10, B: 0}, None) == {A: 10, B: 0}


def test_plan_ends_cap_is_shared_max_min_fair() -> None:
    ends = plan_ends({A: 0, B: 0, C: 0}, {A: 100, B: 5, C: 50}, 60)
    # B needs only 5, the other 55 split between A and C; the odd unit goes to the first
    assert ends == {A: 28, B: 5, C: 27}


def test_plan_ends_cap_never_exceeds_available_and_sums_to_cap() -> None:
    starts = {TopicPartition("t", p): p * 7 for p in range(7)}
    latest = {tp: s + (p * 13) % 20 for p, (tp, s) in enumerate(starts.items())}
    for cap in range(1, 90):
        ends = plan_ends(starts, latest, cap)
        total_available = sum(latest[tp] - starts[tp] for tp in starts)
        assert sum(ends[tp] - starts[tp] for tp in starts) == min(cap, total_available)
        assert all(starts[tp] <= ends[tp] <= latest[tp] for tp in starts)


def test_plan_ends_latest_below_start_is_an_offset_error() -> None:
    with pytest.raises(OffsetError, match=r"t:0.*below the next offset to read 10"):
        plan_ends({A: 10}, {A: 3}, None)


def test_plan_ends_rejects_a_non_positive_cap() -> None:
    with pytest.raises(ConfigError):
        plan_ends({A: 0}, {A: 3}, 0)


def test_plan_ranges_splits_into_tasks_and_skips_empty_partitions() -> None:
    ranges = plan_ranges({A: 0, B: 4, C: 2}, {A: 25, B: 4, C: 3}, None, 10)
    assert ranges == [
        OffsetRange(A, 0, 10),
        OffsetRange(A, 10, 20),
        OffsetRange(A, 20, 25),
        OffsetRange(C, 2, 3),
    ]


def test_plan_ranges_applies_the_batch_cap_before_splitting() -> None:
    ranges = plan_ranges({A: 0, B: 0}, {A: 100, B: 100}, 50, 10)
    assert sum(r.span for r in ranges) == 50
    assert max(r.span for r in ranges) <= 10
    assert {r.partition for r in ranges} == {A, B}


def test_resolve_start_prefers_committed_offsets_of_the_writer() -> None:
    lookup = FakeLookup({A: (0, 100), B: (0, 50)})
    starts = resolve_start(WriterOffsets({A: 42}), [A, B], "latest", lookup)
    assert starts == {A: 42, B: 50}


@pytest.mark.parametrize(("spec", "expected"), [("earliest", 3), ("latest", 100)])
def test_resolve_start_fresh_partition_uses_starting_offsets(spec: str, expected: int) -> None:
    assert resolve_start(WriterOffsets.empty(), [A], spec, FakeLookup({A: (3, 100)})) == {
        A: expected
    }


def test_resolve_start_timestamp_uses_offsets_for_times_or_the_end() -> None:
    lookup = FakeLookup({A: (0, 100), B: (0, 50)}, times={A: 60, B: None})
    starts = resolve_start(WriterOffsets.empty(), [A, B], "1700000000000", lookup)
    assert starts == {A: 60, B: 50}
    assert lookup.time_queries == [{A: 1700000000000, B: 1700000000000}]


def test_resolve_start_committed_below_log_start_is_data_loss_naming_everything() -> None:
    lookup = FakeLookup({A: (500, 900)})
    with pytest.raises(DataLossError) as e:
        resolve_start(WriterOffsets({A: 120}), [A], "earliest", lookup)
    text = str(e.value)
    assert "t:0" in text and "120" in text and "500" in text


def test_resolve_start_data_loss_tolerated_starts_at_log_start_with_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lookup = FakeLookup({A: (500, 900)})
    with caplog.at_level(logging.WARNING, logger="lakesink.kafka.planning"):
        starts = resolve_start(
            WriterOffsets({A: 120}), [A], "earliest", lookup, fail_on_data_loss=False
        )
    assert starts == {A: 500}
    assert any("500" in r.getMessage() and "t:0" in r.getMessage() for r in caplog.records)


def test_check_data_loss_position_beyond_log_end_means_recreated_topic() -> None:
    with pytest.raises(DataLossError, match="re-created"):
        check_data_loss({A: 30}, {A: (0, 10)})
    assert check_data_loss({A: 30}, {A: (0, 10)}, fail_on_data_loss=False) == {A: 0}


def test_check_data_loss_keeps_positions_inside_the_log() -> None:
    assert check_data_loss({A: 0, B: 10}, {A: (0, 10), B: (0, 10)}) == {A: 0, B: 10}


@pytest.mark.parametrize("bad", ["soon", "-5", "", "12.5"])
def test_parse_starting_offsets_rejects_bad_values(bad: str) -> None:
    with pytest.raises(ConfigError, match="earliest, latest"):
        parse_starting_offsets(bad)


def test_parse_starting_offsets_accepts_names_and_timestamps() -> None:
    assert parse_starting_offsets(" Earliest ") == "earliest"
    assert parse_starting_offsets("latest") == "latest"
    assert parse_starting_offsets("1700000000000") == 1700000000000
    assert parse_starting_offsets(5) == 5
