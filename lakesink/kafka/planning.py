"""Offset planning on the driver: where each partition starts, where a batch ends, which tasks.

Pure functions over offsets; the broker is reached only through an `OffsetLookup` (the
`OffsetClient` in production, a fake in unit tests).

- `resolve_start`: the committed offset of the writer, else `starting_offsets` (earliest, latest
  or a timestamp in ms), checked against the log start (data loss).
- `check_data_loss`: positions below the log start (or above the log end) are records deleted
  before they were read: DataLossError, or with fail_on_data_loss=False a warning and the log start.
- `plan_ends` / `plan_ranges`: the end of each partition's range, up to the high watermark (last
  stable offset under read_committed) and a fair share of `max_records_per_batch`; ranges split
  into tasks of at most `max_records_per_task` offsets.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from lakesink.errors import ConfigError, DataLossError, OffsetError
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets

log = logging.getLogger(__name__)


class OffsetLookup(Protocol):
    """What planning needs from the broker (OffsetClient implements it)."""

    def watermarks(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, int]]: ...

    def offsets_for_times(
        self, timestamps_ms: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int | None]: ...


def parse_starting_offsets(value: str | int) -> str | int:
    """ "earliest", "latest", or a timestamp in epoch milliseconds (int or digit string)."""
    if isinstance(value, bool):
        raise ConfigError(f"starting offsets {value!r} is not valid")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"starting timestamp {value} must not be negative")
        return value
    text = value.strip().lower()
    if text in ("earliest", "latest"):
        return text
    if text.isdigit():
        return int(text)
    raise ConfigError(
        f"starting offsets {value!r} is not valid; use earliest, latest or epoch milliseconds"
    )


def check_data_loss(
    positions: Mapping[TopicPartition, int],
    watermarks: Mapping[TopicPartition, tuple[int, int]],
    *,
    fail_on_data_loss: bool = True,
) -> dict[TopicPartition, int]:
    """Positions checked against the log: a position below the log start means records were
    deleted (retention, delete-records) before they were read; above the log end, the topic was
    probably deleted and re-created. Raises DataLossError naming partition, position and log
    bounds, or with `fail_on_data_loss=False` logs a warning and moves to the log start."""
    out: dict[TopicPartition, int] = {}
    for tp, pos in positions.items():
        if tp not in watermarks:
            raise OffsetError(f"no watermarks for {tp}: cannot check its position {pos}")
        low, high = watermarks[tp]
        if low <= pos <= high:
            out[tp] = pos
            continue
        if pos < low:
            what = (
                f"the next offset to read of {tp} is {pos} but the log starts at {low}: "
                f"{low - pos} records were deleted before they were read"
            )
        else:
            what = (
                f"the next offset to read of {tp} is {pos} but the log ends at {high}: "
                "the topic was probably deleted and re-created"
            )
        if fail_on_data_loss:
            raise DataLossError(
                what + "; set kafka.fail.on.data.loss=false to continue from the log start"
            )
        log.warning("%s; continuing from the log start %d (fail_on_data_loss=false)", what, low)
        out[tp] = low
    return out


def resolve_start(
    committed: WriterOffsets,
    partitions: Sequence[TopicPartition],
    starting_offsets: str | int,
    lookup: OffsetLookup,
    *,
    fail_on_data_loss: bool = True,
) -> dict[TopicPartition, int]:
    """The first offset to read of each partition: the writer's committed offset if the table has
    one (checked for data loss), else per `starting_offsets`: the log start (earliest), the high
    watermark (latest), or the first offset at or after a timestamp in ms (the high watermark when
    no record is that recent)."""
    start_spec = parse_starting_offsets(starting_offsets)
    parts = sorted(set(partitions))
    if not parts:
        return {}
    marks = lookup.watermarks(parts)
    known = {tp: off for tp in parts if (off := committed.get(tp)) is not None}
    out = check_data_loss(known, marks, fail_on_data_loss=fail_on_data_loss)
    fresh = [tp for tp in parts if tp not in known]
    if isinstance(start_spec, int) and fresh:
        found = lookup.offsets_for_times(dict.fromkeys(fresh, start_spec))
        for tp in fresh:
            off = found.get(tp)
            out[tp] = marks[tp][1] if off is None else max(off, marks[tp][0])
    else:
        for tp in fresh:
            low, high = marks[tp]
            out[tp] = low if start_spec == "earliest" else high
    return {tp: out[tp] for tp in parts}


def _fair_shares(available: Mapping[TopicPartition, int], cap: int) -> dict[TopicPartition, int]:
    """Split `cap` across partitions by max-min fairness: each gets an equal share, a partition
    needing less gives the rest to the others; leftover units go to partitions in sorted order."""
    shares = dict.fromkeys(available, 0)
    remaining = cap
    hungry = sorted(tp for tp, n in available.items() if n > 0)
    while remaining > 0 and hungry:
        each = remaining // len(hungry)
        if each == 0:
            for tp in hungry[:remaining]:
                shares[tp] += 1
            break
        still: list[TopicPartition] = []
        for tp in hungry:
            give = min(each, available[tp] - shares[tp])
            shares[tp] += give
            remaining -= give
            if shares[tp] < available[tp]:
                still.append(tp)
        hungry = still
    return shares


def plan_ends(
    positions: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    max_records_per_batch: int | None,
) -> dict[TopicPartition, int]:
    """The end offset (exclusive) of each partition for one batch: up to `latest`, at most
    `max_records_per_batch` offsets in all, shared fairly between partitions."""
    if max_records_per_batch is not None and max_records_per_batch <= 0:
        raise ConfigError(f"max records per batch must be positive, got {max_records_per_batch}")
    available: dict[TopicPartition, int] = {}
    for tp, start in positions.items():
        if tp not in latest:
            raise OffsetError(f"no latest offset for {tp}: cannot plan from {start}")
        end = latest[tp]
        if end < start:
            raise OffsetError(
                f"the latest offset {end} of {tp} is below the next offset to read {start}; "
                "was the topic re-created?"
            )
        available[tp] = end - start
    total = sum(available.values())
    if max_records_per_batch is None or total <= max_records_per_batch:
        shares = available
    else:
        shares = _fair_shares(available, max_records_per_batch)
    return {tp: positions[tp] + shares[tp] for tp in positions}


def plan_ranges(
    start_positions: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    max_records_per_batch: int | None,
    max_records_per_task: int | None,
) -> list[OffsetRange]:
    """The non-empty task ranges of one batch, sorted by partition and start: each partition
    reads [start, end) with `plan_ends`, split into pieces of at most `max_records_per_task`."""
    if max_records_per_task is not None and max_records_per_task <= 0:
        raise ConfigError(f"max records per task must be positive, got {max_records_per_task}")
    ends = plan_ends(start_positions, latest, max_records_per_batch)
    out: list[OffsetRange] = []
    for tp in sorted(start_positions):
        r = OffsetRange(tp, start_positions[tp], ends[tp])
        if r.is_empty:
            continue
        out.extend(r.split(max_records_per_task) if max_records_per_task else [r])
    return out
