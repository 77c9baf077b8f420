"""Archival: keep the active timeline short, so that listing it and committing stay fast as the
table ages, without changing what any reader sees.

Archived instants move (requested, inflight, then completed file) from the active timeline to
lakesink's archive `.hoodie/.lakesink/archive/timeline/`, which hudi-rs never lists. The newest
archived commit of every lakesink writer is kept in `.hoodie/.lakesink/archive/writers.json`, so
a writer whose last commit was archived still finds its committed offsets
(`lakesink.spark.commit_state` falls back to it).

What may be archived: lakesink's reader builds its file-system view from the active timeline
only, and hudi-rs treats a base file older than the active timeline as committed. So archival
moves a prefix of the timeline (every completed instant before a boundary B, and never past the
oldest pending instant) only when removing it changes no view as of B or later:
- every file group written before B is replaced by a replacecommit at or before B (clustering
  rewrote it), and
- every file group replaced by an archived replacecommit is gone from storage (the cleaner
  deleted it); otherwise hudi-rs would read it again.
Clean and rollback instants carry no data and are archived with the prefix. Deleting files of
archived instants is the cleaner's job, not archival's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lakesink.protocol.instant import Action, Instant, InstantTime, State, TimelineLayout
from lakesink.protocol.offsets import WriterOffsets
from lakesink.services.instants import read_json, write_json
from lakesink.spark import commit_state as keys
from lakesink.spark.coordinator import CommitServices
from lakesink.table.hudi_table import HudiTable
from lakesink.table.metadata import CommitMetadata
from lakesink.table.timeline import Timeline, list_instant_files

log = logging.getLogger(__name__)

ARCHIVE_DIR = Path(".hoodie") / ".lakesink" / "archive"
WRITERS_INDEX = "writers.json"


@dataclass(frozen=True, slots=True)
class ArchivePolicy:
    """Archive when more than `max_instants` completed instants are active, down to (at least)
    `min_instants`."""

    min_instants: int = 20
    max_instants: int = 30

    def __post_init__(self) -> None:
        if not 1 <= self.min_instants <= self.max_instants:
            raise ValueError(
                f"archive policy needs 1 <= min ({self.min_instants}) <= max ({self.max_instants})"
            )


@dataclass(frozen=True, slots=True)
class ArchiveResult:
    archived: tuple[Instant, ...] = ()
    active_before: int = 0
    active_after: int = 0


Entry = tuple[Instant, CommitMetadata | None]


def archivable_prefix(
    entries: Sequence[Entry],
    earliest_pending: InstantTime | None,
    policy: ArchivePolicy,
    exists: Callable[[str], bool],
) -> int:
    """Pure: how many of the completed `entries` (sorted by instant time; metadata for data
    instants) may be archived — the longest prefix that obeys the rules in the module doc."""
    if len(entries) <= policy.max_instants:
        return 0
    limit = len(entries) - policy.min_instants
    written: set[tuple[str, str]] = set()  # file groups written in the prefix, not yet replaced
    paths_of: dict[tuple[str, str], list[str]] = {}
    blocked = False  # an archived replacecommit would un-hide files still on storage
    best = 0
    for idx, (inst, md) in enumerate(entries):
        if idx > limit or (earliest_pending is not None and inst.time >= earliest_pending):
            break
        replaced_here: set[tuple[str, str]] = set()
        if md is not None and inst.action is Action.REPLACE_COMMIT:
            replaced_here = {(p, f) for p, ids in md.replaced_file_ids.items() for f in ids}
        # may the boundary sit here (archive entries[:idx])?
        if idx > 0 and not blocked and written <= replaced_here:
            best = idx
        if md is None:
            continue
        # extend the prefix by this instant
        for key in replaced_here:
            written.discard(key)
            if any(exists(p) for p in paths_of.get(key, ())):
                blocked = True
        for w in md.writes:
            key = (w.partition_path, w.file_id)
            written.add(key)
            paths_of.setdefault(key, []).append(w.path)
        if blocked:
            break
    return best


def _archive_folder(table: HudiTable) -> Path:
    return table.base_path / ARCHIVE_DIR / "timeline"


def _update_writers_index(table: HudiTable, timeline: Timeline, chosen: Sequence[Instant]) -> None:
    path = table.base_path / ARCHIVE_DIR / WRITERS_INDEX
    index: dict[str, Any] = read_json(path) or {}
    for inst in chosen:
        if inst.action is not Action.COMMIT:
            continue
        extra = timeline.commit_metadata(inst).extra
        writer = extra.get(keys.WRITER_ID_KEY)
        if writer is None or keys.OFFSETS_KEY not in extra:
            continue
        prev = index.get(writer)
        if prev is None or str(prev["instant"]) < inst.time.value:
            index[writer] = {
                "instant": inst.time.value,
                "offsets": json.loads(extra[keys.OFFSETS_KEY]),
            }
    write_json(path, index)


def archived_offsets(table: HudiTable, writer_id: str) -> WriterOffsets | None:
    """The offsets of `writer_id`'s newest archived commit, if one was archived."""
    index: Any = read_json(table.base_path / ARCHIVE_DIR / WRITERS_INDEX)
    if not isinstance(index, dict) or writer_id not in index:
        return None
    return WriterOffsets.from_json(index[writer_id]["offsets"])


def archived_instants(table: HudiTable) -> list[Instant]:
    """Completed instants in the archive, by instant time."""
    found = [i for _, i in list_instant_files(_archive_folder(table)) if i.is_completed]
    return sorted(found, key=lambda i: i.time)


def _move(src: Path, folder: Path) -> None:
    if not src.exists():
        return
    tmp = folder / f".{src.name}.tmp"
    shutil.copyfile(src, tmp)
    os.replace(tmp, folder / src.name)
    src.unlink()


def archive(
    table: HudiTable, services: CommitServices, policy: ArchivePolicy | None = None
) -> ArchiveResult:
    """Under the lock: choose the archivable prefix and move it to the archive."""
    policy = policy or ArchivePolicy()
    with services.locked(table):
        timeline = table.timeline()
        completed = list(timeline.completed())
        pending = timeline.inflight_or_requested()
        earliest_pending = min((i.time for i in pending), default=None)
        entries: list[Entry] = [
            (i, timeline.commit_metadata(i) if i.action.writes_data else None) for i in completed
        ]
        n = archivable_prefix(
            entries, earliest_pending, policy, lambda rel: (table.base_path / rel).exists()
        )
        chosen = [i for i, _ in entries[:n]]
        if not chosen:
            return ArchiveResult((), len(completed), len(completed))
        folder = _archive_folder(table)
        folder.mkdir(parents=True, exist_ok=True)
        _update_writers_index(table, timeline, chosen)
        for inst in chosen:
            for state in (State.REQUESTED, State.INFLIGHT):
                _move(timeline.path_of(inst.with_state(state)), folder)
            _move(timeline.path_of(inst), folder)
    if table.layout is TimelineLayout.V1:
        with contextlib.suppress(OSError):
            os.utime(timeline.folder)
    log.info(
        "table %s: archived %d instants (%s .. %s); %d remain active",
        table.config.name,
        len(chosen),
        chosen[0].time,
        chosen[-1].time,
        len(completed) - len(chosen),
    )
    return ArchiveResult(tuple(chosen), len(completed), len(completed) - len(chosen))
