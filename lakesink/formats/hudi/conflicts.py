"""Gathering the operations concurrent with an instant from storage, for the conflict rules of
`lakesink.protocol.conflicts`: completed instants since it began (from their metadata),
scheduled clusterings (from their plans) and inflight ingestions (from their markers)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

from lakesink.errors import CorruptTableError
from lakesink.formats.hudi.instants import plan_path, read_json
from lakesink.formats.hudi.table.files import parse_base_file_name
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.log_file import LogFileName, is_log_file_name
from lakesink.formats.hudi.table.markers import list_marked_files
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.timeline import Timeline
from lakesink.formats.hudi.writer_state import WRITER_ID_KEY
from lakesink.protocol.conflicts import (
    ConflictStrategy,
    FileGroupId,
    Operation,
    OperationKind,
    Phase,
    check,
    completed_since,
)
from lakesink.protocol.instant import Action, Instant, InstantTime, State

log = logging.getLogger(__name__)

CLUSTERING_PLANS = "clustering"
_RECENT_MS = 60_000
"""Layout 1 has no completion times, and in layout 2 an instant time generated ahead of the
clock can exceed the completion time of an instant that completed after it: so instants that
completed up to this long before also have their completed file's time compared with ours."""


def file_groups_of_paths(paths: Iterable[str]) -> frozenset[FileGroupId]:
    """(partition, file id) of relative base-file and log-file paths."""
    out: set[FileGroupId] = set()
    for p in paths:
        partition, _, name = p.rpartition("/")
        if is_log_file_name(name):  # a deltacommit's log file (merge-on-read)
            out.add((partition, LogFileName.parse(name).file_id))
        else:
            out.add((partition, parse_base_file_name(name).file_id))
    return frozenset(out)


def operation_of(instant: Instant, md: CommitMetadata) -> Operation:
    kind = (
        OperationKind.CLUSTERING
        if instant.action is Action.REPLACE_COMMIT
        else OperationKind.INGESTION
    )
    return Operation(
        instant.time,
        kind,
        written=frozenset((w.partition_path, w.file_id) for w in md.writes),
        replaced=frozenset((p, f) for p, ids in md.replaced_file_ids.items() for f in ids),
        phase=Phase.COMPLETED,
        writer=md.extra.get(WRITER_ID_KEY, ""),
    )


def _mtime(timeline: Timeline, instant: Instant) -> float | None:
    """When a timeline file was written (the file's or the object's modification time)."""
    if timeline.storage.is_local:
        try:
            return os.stat(timeline.path_of(instant)).st_mtime
        except FileNotFoundError:
            return None
    meta = timeline.storage.head(timeline.key_of(instant))
    return meta.modified if meta is not None and meta.modified else None


def completed_after(
    timeline: Timeline,
    began: InstantTime,
    other: Instant,
    began_mtime: Callable[[], float | None] | None = None,
    mtimes: MutableMapping[str, float] | None = None,
) -> bool:
    """Whether `other` completed after the instant `began` was begun (by completion time,
    and for recent ones by the times their timeline files were written). `began_mtime`: when
    `began`'s requested file was written, asked for only when needed (one HEAD on an object
    store, shared by every instant compared with it). `mtimes`: the times of completed files
    read before, by file key (a completed file is never rewritten; a writer keeps them across
    its commits: `MtimeCache`)."""
    if completed_since(began, other.time, other.completion_time):
        return True
    recent = other.completion_time is None or (
        began.to_epoch_ms() - other.completion_time.to_epoch_ms() < _RECENT_MS
    )
    if not recent:
        return False
    ours = began_mtime() if began_mtime is not None else _requested_mtime(timeline, began)
    theirs = _completed_mtime(timeline, other, mtimes)
    return ours is None or theirs is None or theirs >= ours


class MtimeCache(dict[str, float]):
    """The write times of completed timeline files a writer has read, by file key, kept
    across its commits (each commit compares itself with every completed instant of the last
    minute); cleared when it grows past `limit` entries."""

    def __init__(self, limit: int = 10_000) -> None:
        super().__init__()
        self.limit = limit


def _completed_mtime(
    timeline: Timeline, instant: Instant, mtimes: MutableMapping[str, float] | None
) -> float | None:
    if mtimes is None or not instant.is_completed:
        return _mtime(timeline, instant)
    key = timeline.key_of(instant)
    found = mtimes.get(key)
    if found is None:
        found = _mtime(timeline, instant)
        if found is not None:
            if isinstance(mtimes, MtimeCache) and len(mtimes) >= mtimes.limit:
                mtimes.clear()
            mtimes[key] = found
    return found


def _requested_mtime(timeline: Timeline, began: InstantTime) -> float | None:
    """When `began`'s requested file (a commit's, a deltacommit's or a replacecommit's) was
    written."""
    for action in (Action.COMMIT, Action.DELTA_COMMIT, Action.REPLACE_COMMIT):
        ours = _mtime(timeline, Instant(began, action, State.REQUESTED))
        if ours is not None:
            return ours
    return None


def pending_clustering_groups(
    table: HudiTable, instant_time: InstantTime
) -> frozenset[FileGroupId]:
    """The file groups a scheduled clustering plans to replace (empty if its plan is gone)."""

    plan: Any = read_json(table, plan_path(table, CLUSTERING_PLANS, instant_time))
    if not isinstance(plan, dict):
        return frozenset()
    return frozenset((str(p), str(f)) for p, f in plan.get("file_groups", []))


def concurrent_operations(
    table: HudiTable,
    began: InstantTime,
    *,
    timeline: Timeline | None = None,
    mtimes: MutableMapping[str, float] | None = None,
    began_on: Timeline | None = None,
) -> list[Operation]:
    """Every data instant other than `began` that completed since it began or is pending
    (`mtimes`: see `completed_after`). `began_on`: the snapshot listed under the lock right
    before `began`'s requested file was written (this process began it): an instant completed
    there, and by its times before `began`, completed before `began` began; its write time is
    not compared with `began`'s (no HEADs)."""
    tl = timeline or table.timeline()
    out: list[Operation] = []
    known: list[float | None] = []

    def began_mtime() -> float | None:
        if not known:
            known.append(_requested_mtime(tl, began))
        return known[0]

    # `completed_after`'s answer for the bulk of a long timeline, by comparing times as text
    # (fixed-width digits): requested before `began`, and completed before it by more than the
    # recent window, it is not concurrent
    began_value = began.value
    old_before = InstantTime.from_epoch_ms(began.to_epoch_ms() - _RECENT_MS).value
    for inst in tl.instants:
        t = inst.time.value
        if t == began_value or not inst.action.writes_data:
            continue
        if inst.is_completed:
            done = inst.completion_time
            if t < began_value and done is not None and done.value <= old_before:
                continue
            # completed in the snapshot `began` began on, and its times agree: it completed
            # before `began` began (what the write times would be compared for)
            seen = began_on.get(inst.time) if began_on is not None else None
            if (
                seen is not None
                and seen.is_completed
                and not completed_since(began, inst.time, inst.completion_time)
            ):
                continue
            if completed_after(tl, began, inst, began_mtime, mtimes):
                out.append(operation_of(inst, tl.commit_metadata(inst)))
        elif inst.action is Action.REPLACE_COMMIT:
            out.append(
                Operation(
                    inst.time,
                    OperationKind.CLUSTERING,
                    replaced=pending_clustering_groups(table, inst.time),
                    phase=Phase.PENDING,
                )
            )
        else:
            try:
                written = file_groups_of_paths(list_marked_files(table.storage, inst.time))
            except CorruptTableError:  # a marker of something that is not a base file
                written = frozenset()
            out.append(Operation(inst.time, OperationKind.INGESTION, written, phase=Phase.PENDING))
    return out


def check_operation(
    table: HudiTable,
    operation: Operation,
    strategy: ConflictStrategy,
    *,
    timeline: Timeline | None = None,
    mtimes: MutableMapping[str, float] | None = None,
    began_on: Timeline | None = None,
) -> None:
    """Under the lock, right before publishing: CommitConflictError if `strategy` forbids
    `operation` against the operations concurrent with it. `timeline`: a snapshot listed under
    the same lock hold (saves a LIST); `mtimes`: see `completed_after`; `began_on`: see
    `concurrent_operations`."""
    check(
        strategy,
        operation,
        concurrent_operations(
            table, operation.instant_time, timeline=timeline, mtimes=mtimes, began_on=began_on
        ),
    )
