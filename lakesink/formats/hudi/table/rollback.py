"""Rolling back an instant that never completed: delete the files its markers name (and any
base file of that instant in the partitions they name), record a completed rollback, then
remove the instant's requested/inflight files, as Hudi does. Idempotent: a crash at any step
and a second call finish the job."""

from __future__ import annotations

import contextlib
import logging
import time

from lakesink.errors import CommitError, CorruptTableError
from lakesink.formats.hudi.table.files import parse_base_file_name
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.markers import delete_markers, list_marked_files
from lakesink.formats.hudi.table.metadata import RollbackMetadata, RollbackPlan
from lakesink.formats.hudi.table.timeline import Timeline
from lakesink.protocol.instant import Action, Instant, InstantTime, State
from lakesink.storage import ObjectExistsError, StorageError

log = logging.getLogger(__name__)


def _new_time(timeline: Timeline) -> InstantTime:
    taken = [i.time.to_epoch_ms() for i in timeline.instants]
    taken += [i.completion_time.to_epoch_ms() for i in timeline.instants if i.completion_time]
    return InstantTime.from_epoch_ms(max([int(time.time() * 1000), *(t + 1 for t in taken)]))


def _find_rollback_of(timeline: Timeline, target: InstantTime) -> Instant | None:
    for inst in timeline.instants:
        if inst.action is not Action.ROLLBACK:
            continue
        if inst.is_completed:
            md = timeline.rollback_metadata(inst)
            if any(t == target.value for t, _ in md.rolled_back):
                return inst
        else:
            try:
                plan = timeline.rollback_plan(inst)
            except CorruptTableError:  # a garbled or empty pending plan is not ours
                continue
            if plan.instant_time == target.value:
                return inst
    return None


def _files_of(table: HudiTable, instant_time: InstantTime) -> list[str]:
    """Relative paths of the instant's files: what the markers name plus any base file of the
    instant found in the partitions the markers name."""
    marked = list_marked_files(table.storage, instant_time)
    found = set(marked)
    partitions = {m.rsplit("/", 1)[0] if "/" in m else "" for m in marked}
    for p in partitions:
        names = [m.key.rsplit("/", 1)[-1] for m in table.storage.list_folder(p).objects]
        for n in names:
            try:
                parsed = parse_base_file_name(n)
            except CorruptTableError:  # not a base file
                continue
            if parsed.instant_time == instant_time:
                found.add(f"{p}/{n}" if p else n)
    return sorted(found)


def rollback(
    table: HudiTable, instant: Instant, *, rollback_time: InstantTime | None = None
) -> Instant:
    """Roll back a requested or inflight commit/replacecommit; returns the completed rollback
    instant. CommitError for a completed instant (a published commit is never undone here)."""
    timeline = table.timeline()
    current = timeline.get(instant.time)
    existing = _find_rollback_of(timeline, instant.time)
    if current is not None and current.is_completed:
        raise CommitError(
            f"cannot roll back {current} in {table.uri}: it is completed and readers may "
            "see it; only requested or inflight instants can be rolled back"
        )
    if current is not None and not current.action.writes_data:
        raise CommitError(f"cannot roll back {current}: only commits and replacecommits")
    if current is None and existing is None:
        raise CommitError(f"instant {instant.time} is not on the timeline of {table.uri}")
    target = current or instant
    if existing is not None and existing.is_completed:
        _finish(table, timeline, target)
        return existing
    action = target.action
    started = time.monotonic()
    if existing is None:
        rb_time = rollback_time or _new_time(timeline)
        plan = RollbackPlan(instant.time.value, action.value)
        rb = timeline.begin(Action.ROLLBACK, rb_time, requested_content=plan.to_bytes())
    else:
        rb = existing
        if rb.state is State.REQUESTED:
            with contextlib.suppress(ObjectExistsError):
                table.storage.create(timeline.key_of(rb.with_state(State.INFLIGHT)), b"")
    deleted: dict[str, list[str]] = {}
    failed: dict[str, list[str]] = {}
    for rel in _files_of(table, instant.time):
        partition = rel.rsplit("/", 1)[0] if "/" in rel else ""
        try:
            if not table.storage.exists(rel):
                continue
            table.storage.delete(rel)
            deleted.setdefault(partition, []).append(rel)
        except (OSError, StorageError) as e:
            log.warning(
                "table %s: rollback of %s could not delete %s: %s",
                table.uri,
                instant.time,
                rel,
                e,
            )
            failed.setdefault(partition, []).append(rel)
    if failed:
        raise CommitError(
            f"rollback of {instant.time} in {table.uri} could not delete "
            f"{sum(len(v) for v in failed.values())} files; run it again"
        )
    metadata = RollbackMetadata(
        start_rollback_time=rb.time.value,
        rolled_back=((instant.time.value, action.value),),
        deleted_files={p: tuple(v) for p, v in deleted.items()},
        time_taken_ms=int((time.monotonic() - started) * 1000),
    )
    done = table.timeline().complete_rollback(rb, metadata)
    _finish(table, table.timeline(), target)
    log.info("table %s: rolled back %s with %s", table.uri, instant.time, done)
    return done


def is_rolled_back(table: HudiTable, instant_time: InstantTime) -> bool:
    """Has a rollback of this instant begun (or completed)? A task that finishes a file after
    that must delete it itself: the rollback may have listed the markers before it existed."""
    timeline = table.timeline()
    for inst in timeline.instants:
        if inst.action is not Action.ROLLBACK or inst.time <= instant_time:
            continue  # a rollback of an instant is always begun after it
        try:
            if inst.is_completed:
                done = timeline.rollback_metadata(inst)
                if any(t == instant_time.value for t, _ in done.rolled_back):
                    return True
            elif timeline.rollback_plan(inst).instant_time == instant_time.value:
                return True
        except CorruptTableError:  # a rollback being written right now, or garbled
            continue
    return False


def delete_leftovers(table: HudiTable, instant_time: InstantTime) -> list[str]:
    """Delete the files of an instant that is no longer on the timeline: it was rolled back
    while its tasks still wrote (a fenced or stalled writer). hudi-rs reads every base file
    whose instant time precedes the latest completed instant, on the timeline or not, so such
    files would be read as duplicates. Returns the relative paths deleted."""
    if table.timeline().get(instant_time) is not None:
        raise CommitError(
            f"instant {instant_time} is on the timeline of {table.uri}; roll it back instead"
        )
    deleted: list[str] = []
    for rel in _files_of(table, instant_time):
        if table.storage.exists(rel):
            table.storage.delete(rel)
            deleted.append(rel)
    delete_markers(table.storage, instant_time)
    if deleted:
        log.warning(
            "table %s: deleted %d files written for %s after it was rolled back",
            table.uri,
            len(deleted),
            instant_time,
        )
    return deleted


def _finish(table: HudiTable, timeline: Timeline, instant: Instant) -> None:
    delete_markers(table.storage, instant.time)
    timeline.remove_pending(instant)
