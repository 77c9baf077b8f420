"""The batch Spark replays at a restart, checked against the broker's log before it runs.

Spark's offset log (`offsets/N`) holds the ranges of batch N from the moment it was planned;
a batch with no entry in the commit log (`commits/N`) is run again with those ranges at the
next start. If the broker's log end has moved back below a planned range's end since (a broker
that lost acknowledged records on a restart, an unclean leader election), the offsets between
the new end and the planned one hold no record and never will hold the planned ones: the
replay could never finish. With `kafka.fail.on.data.loss=true` (the default) that is one
DataLossError naming the partition, the planned and the actual end. With `false` the batch's
ranges are cut at the new log end in the offset log itself, before Spark reads it — so the
source's tasks, the direct path and the commit all see the same ranges, and the next batch
starts at the new log end, where new records arrive — and the span is recorded as lost (a
file beside the checkpoint, read when the batch commits, then the commit metadata, the
metrics and `lakesink status`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from lakesink.errors import DataLossError
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.spark.source import offset_to_ranges, ranges_to_offset

log = logging.getLogger(__name__)

# Beside Spark's own folders in the checkpoint: the spans cut off a batch, by batch id
LOST_FOLDER = "lakesink-lost"

Watermarks = Callable[[list[TopicPartition]], Mapping[TopicPartition, tuple[int, int]]]


def unfinished_batch(checkpoint: Path) -> int | None:
    """The id of the last batch in Spark's offset log that its commit log lacks (the batch a
    restart runs again), or None."""
    try:
        planned = [int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()]
    except FileNotFoundError:
        return None
    if not planned:
        return None
    last = max(planned)
    return None if (checkpoint / "commits" / str(last)).exists() else last


def check_replay_against_log_end(
    checkpoint: Path, watermarks: Watermarks, *, fail_on_data_loss: bool
) -> list[OffsetRange]:
    """Check the batch a restart replays against the log ends `watermarks` gives (low, high
    per partition); the spans cut off it (empty: nothing to cut). Raises DataLossError with
    `fail_on_data_loss`."""
    batch = unfinished_batch(checkpoint)
    if batch is None:
        return []
    path = checkpoint / "offsets" / str(batch)
    lines = path.read_text().splitlines()
    at = next((i for i in range(2, len(lines)) if lines[i].strip()), None)
    if at is None:
        return []
    ranges = offset_to_ranges(json.loads(lines[at]))
    marks = watermarks([r.partition for r in ranges if not r.is_empty])
    lost = [
        OffsetRange(r.partition, max(r.start, marks[r.partition][1]), r.end)
        for r in ranges
        if not r.is_empty and marks[r.partition][1] < r.end
    ]
    if not lost:
        return []
    if any(span.start > marks[span.partition][1] for span in lost):
        raise DataLossError(
            _describe(batch, lost, marks)
            + "; the log now ends below offsets this writer had read already, which a table's "
            "offsets never move back over: ingest the topic with a new writer.id"
        )
    if fail_on_data_loss:
        raise DataLossError(
            _describe(batch, lost, marks)
            + "; set kafka.fail.on.data.loss=false to end the batch at the log end (the lost "
            "offsets are recorded in the commit) and go on"
        )
    log.warning(
        "%s; the batch ends at the log end (kafka.fail.on.data.loss=false)",
        _describe(batch, lost, marks),
    )
    cut = {r.partition: (r.start, min(r.end, max(r.start, marks[r.partition][1]))) for r in ranges}
    record = checkpoint / LOST_FOLDER / f"{batch}.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    _replace(record, json.dumps([[s.partition.key(), s.start, s.end] for s in lost]))
    lines[at] = json.dumps(ranges_to_offset(cut))
    _replace(path, "\n".join(lines) + "\n")
    # Hadoop's checksum of the old text: without one, Spark reads the file unchecked
    (path.parent / f".{path.name}.crc").unlink(missing_ok=True)
    return lost


def rewind_to(checkpoint: Path, batch_id: int, ranges: Sequence[OffsetRange]) -> bool:
    """Make Spark run batch `batch_id` again at the next start, with the ranges its offset log
    holds, which must be `ranges` (a dropped Pending epoch's, commit.mode=async): its entry in
    the commit log and every later batch's entries in both logs go (with Hadoop's checksums
    and the spans cut off those later batches), so Spark finds it the last planned batch and
    not committed. True when done (also when it was already); False, changing nothing, when the
    offset log does not hold batch `batch_id` with these ranges (another checkpoint: a deleted
    one restarts from the table's offsets anyway)."""
    planned = _planned(checkpoint, batch_id)
    if planned is None or planned != {r for r in ranges if not r.is_empty}:
        return False
    # later batches first, so a crash midway leaves a log whose last batch is still unrecorded
    for folder, first in (("offsets", batch_id + 1), ("commits", batch_id)):
        for n in sorted(_batch_ids(checkpoint / folder), reverse=True):
            if n >= first:
                (checkpoint / folder / str(n)).unlink(missing_ok=True)
                (checkpoint / folder / f".{n}.crc").unlink(missing_ok=True)
    for record in (checkpoint / LOST_FOLDER).glob("*.json"):
        if record.stem.isdigit() and int(record.stem) > batch_id:
            record.unlink(missing_ok=True)
    log.warning(
        "Spark's checkpoint %s rewound to batch %s: it is read from Kafka again", checkpoint,
        batch_id,
    )  # fmt: skip
    return True


def _batch_ids(folder: Path) -> list[int]:
    try:
        return [int(p.name) for p in folder.iterdir() if p.name.isdigit()]
    except FileNotFoundError:
        return []


def _planned(checkpoint: Path, batch_id: int) -> set[OffsetRange] | None:
    """The non-empty ranges of batch `batch_id` in Spark's offset log (None: not there)."""
    try:
        lines = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
    except FileNotFoundError:
        return None
    sources = [ln for ln in lines[2:] if ln.strip()]
    if len(sources) != 1:
        return None
    return {r for r in offset_to_ranges(json.loads(sources[0])) if not r.is_empty}


def lost_spans(checkpoint: Path, batch_id: int) -> tuple[OffsetRange, ...]:
    """The spans cut off batch `batch_id` at a restart (none: it was not cut)."""
    try:
        raw = json.loads((checkpoint / LOST_FOLDER / f"{batch_id}.json").read_text())
    except FileNotFoundError:
        return ()
    return tuple(OffsetRange(TopicPartition.parse(k), int(s), int(e)) for k, s, e in raw)


def _describe(
    batch: int, lost: list[OffsetRange], marks: Mapping[TopicPartition, tuple[int, int]]
) -> str:
    parts = ", ".join(
        f"{s.partition} was planned to end at {s.end} but the log ends at {marks[s.partition][1]}"
        for s in lost
    )
    return (
        f"the broker's log end moved back after batch {batch} was planned ({parts}): acknowledged "
        "records were lost (an unclean leader election, or a broker that lost data on a restart)"
    )


def _replace(path: Path, text: str) -> None:
    """Write `path` whole: a temporary in the checkpoint's root (Spark lists its folders),
    fsynced, renamed over it."""
    tmp = path.parent.parent / f".{path.parent.name}-{path.name}.lakesink.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
