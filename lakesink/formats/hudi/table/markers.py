"""Markers: one empty object per data file an instant creates, written BEFORE the data file,
under `.hoodie/.temp/<instantTime>/<partition>/<fileName>.marker.CREATE` (Hudi's direct
marker layout; a log file's marker is `.marker.APPEND` in table version 6, as Hudi's
DirectWriteMarkersV1 names it). Rollback and pre-commit cleanup find every file of an instant
through them. Listing an instant's markers is one LIST request on an object store."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from lakesink.errors import CorruptTableError
from lakesink.protocol.instant import InstantTime
from lakesink.storage import ObjectExistsError, Storage, as_storage

log = logging.getLogger(__name__)

MARKER_ROOT = ".hoodie/.temp"
MARKER_SUFFIX = ".marker.CREATE"
MarkerType = Literal["CREATE", "APPEND"]
_SUFFIXES = (MARKER_SUFFIX, ".marker.APPEND")


def marker_key(instant_time: InstantTime | str) -> str:
    """The marker folder of an instant, relative to the table root."""
    return f"{MARKER_ROOT}/{InstantTime(str(instant_time))}"


def marker_dir(table_base: str | Path, instant_time: InstantTime | str) -> Path:
    """The marker folder of an instant of a local table."""
    return Path(table_base) / marker_key(instant_time)


def create_marker(
    table: Storage | str | Path,
    instant_time: InstantTime | str,
    partition_path: str,
    file_name: str,
    marker_type: MarkerType = "CREATE",
) -> str:
    """Record that `partition_path/file_name` is about to be created by this instant (a
    version-6 log file: APPEND). Idempotent: an existing marker is kept. Returns its key."""
    if "/" in file_name or not file_name:
        raise ValueError(f"file name {file_name!r} must be a bare name")
    d = marker_key(instant_time)
    suffix = f".marker.{marker_type}"
    key = (
        f"{d}/{partition_path}/{file_name}{suffix}"
        if partition_path
        else f"{d}/{file_name}{suffix}"
    )
    with contextlib.suppress(ObjectExistsError):
        as_storage(table).create(key, b"")
    return key


def list_marked_files(table: Storage | str | Path, instant_time: InstantTime | str) -> list[str]:
    """Relative paths (from the table base) of every file the instant's markers name, sorted."""
    return marked_files(instant_time, as_storage(table).list_keys(marker_key(instant_time)))


def marked_files(instant_time: InstantTime | str, keys: Iterable[str]) -> list[str]:
    """The files named by `keys`, the listing of the instant's marker folder, sorted."""
    d = marker_key(instant_time)
    out: list[str] = []
    for key in keys:
        for suffix in _SUFFIXES:
            if key.endswith(suffix):
                out.append(key[len(d) + 1 : -len(suffix)])
    return sorted(out)


def delete_markers(
    table: Storage | str | Path,
    instant_time: InstantTime | str,
    keys: list[str] | None = None,
) -> None:
    """Remove the instant's marker folder (no error if it is gone already). `keys`: the
    folder's listing taken before (when the instant's files were reconciled): on an object
    store those keys are deleted without listing again; a marker a straggling task attempt
    created after that listing stays, and the writer's next start deletes it
    (`delete_completed_markers`)."""
    storage = as_storage(table)
    if keys is not None and not storage.is_local:
        storage.delete_many(keys)
    else:
        storage.delete_prefix(marker_key(instant_time))


# A completed instant's markers are deleted by one background thread, off the batch's path: at
# hundreds of Kafka partitions that is hundreds of unlinks (or a LIST and DELETEs on an object
# store) that nothing waits for. Python joins the thread at exit, so a normal exit deletes them;
# a crash leaves them to `delete_completed_markers` at the writer's next start.
_deleter: ThreadPoolExecutor | None = None
_deleter_guard = threading.Lock()


def _forget_the_parents_deleter() -> None:
    # a forked child has none of its parent's threads: it starts its own deleter when it needs
    # one, with a fresh guard (the parent's deleter thread may have held it at the fork)
    global _deleter, _deleter_guard
    _deleter, _deleter_guard = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_the_parents_deleter)


def delete_markers_soon(
    table: Storage | str | Path, instant_time: InstantTime | str, keys: list[str] | None = None
) -> None:
    """`delete_markers` in the background, for a COMPLETED instant only (nothing reads its
    markers; a pending instant's rollback needs them). `wait_for_marker_deletions` waits."""
    global _deleter
    storage, t = as_storage(table), str(instant_time)
    with _deleter_guard:
        if _deleter is None:
            _deleter = ThreadPoolExecutor(1, thread_name_prefix="lakesink-markers")
        job = _deleter.submit(delete_markers, storage, t, keys)
    job.add_done_callback(lambda done: _log_failure(done, t))


def _log_failure(job: Future[None], instant_time: str) -> None:
    if (error := job.exception()) is not None:  # the next start deletes them
        log.warning("markers of completed instant %s not deleted: %s", instant_time, error)


def wait_for_marker_deletions(timeout_s: float | None = None) -> bool:
    """Wait for the deletions `delete_markers_soon` queued; False if some still run."""
    with _deleter_guard:
        if _deleter is None:
            return True
        # one worker thread, in order: this no-op is done once every earlier deletion is
        last = _deleter.submit(lambda: None)
    try:
        last.result(timeout=timeout_s)
    except TimeoutError:
        return False
    return True


def delete_completed_markers(
    table: Storage | str | Path, completed: Callable[[InstantTime], bool]
) -> list[InstantTime]:
    """Delete the marker folders of instants that `completed` says are completed: a writer
    deletes its instant's markers after publishing, outside the lock, so a crash in between
    leaves them (nothing reads a completed instant's markers). Returns the instants cleaned."""
    storage = as_storage(table)
    cleaned: list[InstantTime] = []
    for name in storage.list_folder(MARKER_ROOT).folders:
        try:
            t = InstantTime(name)
        except CorruptTableError:
            continue  # not an instant's folder: not ours to delete
        if completed(t):
            storage.delete_prefix(marker_key(t))
            cleaned.append(t)
    return cleaned


def delete_unreferenced_files(
    table: Storage | str | Path, instant_time: InstantTime | str, keep: Iterable[str]
) -> list[str]:
    """Pre-commit cleanup: delete every file the instant's markers name that is not in `keep`
    (relative paths of the files the commit will reference: failed or duplicate task attempts
    leave such files). Returns the relative paths deleted."""
    storage = as_storage(table)
    keep_set = set(keep)
    deleted: list[str] = []
    for rel in list_marked_files(storage, instant_time):
        if rel in keep_set:
            continue
        if storage.exists(rel):
            storage.delete(rel)
            deleted.append(rel)
    return deleted
