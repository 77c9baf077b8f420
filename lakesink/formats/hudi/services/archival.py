"""Archival: keep the active timeline short, so that listing it and committing stay fast as the
table ages, without changing what any reader sees.

Archived instants move (requested, inflight, then completed file) from the active timeline to
lakesink's archive (`lakesink.formats.hudi.table.archive`), which hudi-rs never lists. Before
moving any, archival writes the archived view (the latest base file of every file group they
leave live), which lakesink's readers, cleaner and clustering start from; and it records every
lakesink writer's newest archived offsets in `writers.json`, so a writer whose last commit was
archived still finds them (`lakesink.formats.hudi.writer_state` falls back to it).

What may be archived is a prefix of the completed instants (by instant time) that
- keeps at least `min_instants` completed instants active, and runs only when more than
  `max_instants` are; the newest commit or replacecommit always stays active (hudi-rs reads as
  of it);
- stops before the earliest pending instant, and before any instant that completed after a
  pending one began (that writer's conflict check must still see it);
- completed, as a whole, before every instant left active (layout 2), so an incremental
  reader starting at an active completion time misses nothing that was archived;
- leaves on storage no base file older than the first active instant other than the live ones
  of the archived view: hudi-rs reads any base file older than the active timeline as
  committed, so files of failed writes, superseded slices and file groups an archived
  replacecommit replaced must be gone first (the cleaner deletes them; archival waits).

On a merge-on-read table deltacommits are archived as commits, and a compaction as its commit
with its `compaction.requested` and `.inflight` files (which would otherwise read as a pending
compaction). The archived view keeps each live slice's log files, and the rule above holds for
log files too (hudi-rs reads a log file of an instant older than the active timeline as
committed): a log file a live slice does not read, no active instant lists and no pending
instant's markers name holds archival back until the cleaner deleted it. As in Hudi's
archiver, archival stops before a pending compaction and before the oldest slice its plan
reads; and (`compaction_every_commits` N > 0: the writer's inline archival with inline
compaction every N deltacommits, and `lakesink table archive`) it keeps active the deltacommits
the compaction trigger counts, by Hudi's rule (`CompactionUtils.
getEarliestInstantToRetainForCompaction`): while fewer than N deltacommits (pending ones
counted) follow the last completed compaction, archival stops before that compaction, or before
the first deltacommit when none is active; with N or more it keeps only the last N. So a table
never compacted archives nothing until N deltacommits were written, as in Hudi, and then all
but the last N (the trigger still counts N and compacts).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from lakesink.errors import CorruptTableError
from lakesink.faults import crash_point
from lakesink.formats.hudi.conflicts import completed_after
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.services.clean import list_data_files, pending_compaction_plans
from lakesink.formats.hudi.table.archive import (
    PACK_FAN_IN,
    PACK_LOOSE_FILES,
    TIMELINE_KEY,
    ArchivedView,
    archived_file_names,
    load_archived_view,
    pack_archived_timeline,
    write_archived_view,
)
from lakesink.formats.hudi.table.compaction_plan import CompactionOperation
from lakesink.formats.hudi.table.file_group import FileSlice
from lakesink.formats.hudi.table.files import parse_base_file_name
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.log_file import LogFileName, is_log_file_name
from lakesink.formats.hudi.table.markers import list_marked_files
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.timeline import Timeline, instants_named
from lakesink.formats.hudi.table.view import build_file_groups
from lakesink.formats.hudi.writer_state import record_archived_writers
from lakesink.protocol.instant import Action, Instant, InstantTime, State, TimelineLayout
from lakesink.storage import ObjectNotFoundError, Storage

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ArchivePolicy:
    """Archive when more than `max_instants` completed instants are active, down to (at least)
    `min_instants`."""

    min_instants: int = 20
    max_instants: int = 30
    pack_files: int = PACK_LOOSE_FILES
    """Loose archived timeline files gathered into one pack (formats/hudi/table/archive.py)."""
    pack_fan_in: int = PACK_FAN_IN
    """Packs of one level merged into one pack of the next."""
    compaction_every_commits: int = 0
    """Merge-on-read with compaction every N deltacommits (table.compaction.every.commits):
    keep active the deltacommits its trigger counts (`merge_on_read_holds`); 0: none."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_instants <= self.max_instants:
            raise ValueError(
                f"archive policy needs 1 <= min ({self.min_instants}) <= max ({self.max_instants})"
            )
        if self.compaction_every_commits < 0:
            raise ValueError(
                f"archive policy needs compaction every >= 0 ({self.compaction_every_commits})"
            )
        if self.pack_files < 1 or self.pack_fan_in < 2:
            raise ValueError(
                f"archive packs need pack files >= 1 ({self.pack_files}) and "
                f"fan-in >= 2 ({self.pack_fan_in})"
            )


@dataclass(frozen=True, slots=True)
class ArchiveResult:
    archived: tuple[Instant, ...] = ()
    active_before: int = 0
    active_after: int = 0
    held_back_by: str = ""
    """Why archival stopped before the policy's limit, when it did."""


Entry = tuple[Instant, CommitMetadata | None]


@dataclass(frozen=True, slots=True)
class Hold:
    """An instant archival must not reach: every archived instant is older than `time`."""

    time: InstantTime
    why: str


@dataclass(frozen=True, slots=True)
class PrefixChoice:
    """How many entries to archive, what they leave visible, and what held archival back."""

    count: int
    live: tuple[FileSlice, ...] = ()
    held_back_by: str = ""


def archivable_prefix(
    entries: Sequence[Entry],
    base: Sequence[FileSlice],
    pending: Sequence[Instant],
    on_storage: Mapping[str, InstantTime],
    policy: ArchivePolicy,
    completed_after_began: Callable[[Instant, Instant], bool] = lambda _done, _pending: False,
    *,
    holds: Sequence[Hold] = (),
    marked: Collection[str] = (),
) -> PrefixChoice:
    """Pure: the longest prefix of the completed `entries` (sorted by instant time, metadata for
    data instants) that obeys the rules in the module doc. `base` is the previous archived view,
    `on_storage` maps data files on storage (relative paths; base files and log files) to the
    instant times their names carry, `completed_after_began(done, pending)` tells whether
    `done` completed after `pending` began, `holds` are instants archival must stay before (a
    pending compaction's plan, the compaction trigger) and `marked` the files pending instants'
    markers name."""
    if len(entries) <= policy.max_instants:
        return PrefixChoice(0)
    limit = len(entries) - policy.min_instants
    # hudi-rs reads as of the newest completed commit or replacecommit on the active timeline
    # (and takes the table schema from it): the newest data instant always stays active
    last_data = max((k for k, (i, _) in enumerate(entries) if i.action.writes_data), default=-1)
    limit = min(limit, max(last_data, 0))
    earliest_pending = min((p.time for p in pending), default=None)
    hold = min(holds, key=lambda h: h.time, default=None)
    why = ""
    n = 0
    while n < limit:
        inst = entries[n][0]
        if earliest_pending is not None and inst.time >= earliest_pending:
            why = f"pending instant {earliest_pending}"
            break
        if hold is not None and inst.time >= hold.time:
            why = hold.why
            break
        racing = next((p for p in pending if completed_after_began(inst, p)), None)
        if racing is not None:
            why = f"{inst.time} completed after pending instant {racing.time} began"
            break
        n += 1
    # layout 2: the archived instants must all have completed before every active one
    done_at = [i.completion_time or i.time for i, _ in entries]
    suffix_min = list(done_at)
    for k in range(len(done_at) - 2, -1, -1):
        suffix_min[k] = min(done_at[k], suffix_min[k + 1])
    prefix_max: list[InstantTime] = []
    for t in done_at:
        prefix_max.append(t if not prefix_max else max(prefix_max[-1], t))
    while n > 0:
        if prefix_max[n - 1] >= suffix_min[n]:
            n -= 1
            why = why or "completion order (an older instant completed after a newer one)"
            continue
        boundary = entries[n][0].time
        if earliest_pending is not None:
            boundary = min(boundary, earliest_pending)
        commits = [(i, md) for i, md in entries[:n] if md is not None]
        groups, _ = build_file_groups(commits, None, base)
        live = tuple(g.latest for g in groups.values())
        # a log file of an active instant may carry an older time (version 6 names it by its
        # slice's base instant), and a pending instant's files are no failed write's
        live_paths = {p for s in live for p in (s.path, *s.log_paths)}
        live_paths |= {w.path for _, md in entries[n:] if md is not None for w in md.writes}
        live_paths |= set(marked)
        stray = sorted(
            (t, p) for p, t in on_storage.items() if t < boundary and p not in live_paths
        )
        if not stray:
            return PrefixChoice(n, live, why)
        n, held_by = min((_last_prefix_keeping(entries, n, p, t), p) for t, p in stray)
        why = (
            f"{held_by} is on storage but not live (a failed write, or replaced or superseded "
            "and not cleaned yet)"
        )
    return PrefixChoice(0, (), why)


def _last_prefix_keeping(entries: Sequence[Entry], n: int, path: str, time_: InstantTime) -> int:
    """The longest prefix (shorter than `n`) that leaves the data file `path` of instant `time_`
    either live or newer than the first active instant."""
    partition = path.rpartition("/")[0]
    name = path.rsplit("/", 1)[-1]
    file_id = (
        LogFileName.parse(name).file_id
        if is_log_file_name(name)
        else parse_base_file_name(name).file_id
    )
    for k, (inst, md) in enumerate(entries[:n]):
        if md is None or inst.time <= time_:
            continue
        if file_id in md.replaced_file_ids.get(partition, ()) or any(
            w.file_id == file_id and w.partition_path == partition for w in md.writes
        ):
            return k  # the instant that replaced or superseded it must stay active
    # a file of no archived instant: the first active instant must be at or before it
    k = n - 1
    while k > 0 and entries[k][0].time > time_:
        k -= 1
    return k


def archived_instants(table: HudiTable) -> list[Instant]:
    """Completed instants in the archive, by instant time."""
    listed = instants_named(archived_file_names(table.storage), f"{table.uri}/{TIMELINE_KEY}")
    found = [i for _, i in listed if i.is_completed]
    return sorted(found, key=lambda i: i.time)


def _move(storage: Storage, src: str) -> None:
    """Copy a timeline file into the archive (whole), then delete it from the timeline."""
    try:
        content = storage.read(src)
    except ObjectNotFoundError:
        return
    storage.write(f"{TIMELINE_KEY}/{src.rsplit('/', 1)[-1]}", content)
    storage.delete(src)


def _data_files_by_time(table: HudiTable) -> dict[str, InstantTime]:
    """Base files and log files on storage, with the instant times their names carry."""
    out: dict[str, InstantTime] = {}
    base, logs = list_data_files(table)
    for rel in base:
        try:
            out[rel] = parse_base_file_name(rel.rsplit("/", 1)[-1]).instant_time
        except CorruptTableError:
            continue  # not a base file name lakesink or Hudi writes
    for rel in logs:
        out[rel] = LogFileName.parse(rel.rsplit("/", 1)[-1]).instant_time
    return out


def merge_on_read_holds(
    timeline: Timeline,
    plans: Mapping[InstantTime, Sequence[CompactionOperation]],
    compaction_every_commits: int,
) -> list[Hold]:
    """Pure but for reading `timeline`: what a merge-on-read table's archival must stay before:
    the oldest slice a pending compaction's plan reads, and (`compaction_every_commits` N > 0)
    what the compaction trigger counts, by Hudi's rule: the last completed compaction (else
    the first deltacommit) while fewer than N deltacommits follow it, else the N-th last
    deltacommit. Deltacommits of every state count, as in Hudi."""
    holds = [
        Hold(
            min((op.base_instant for op in ops), default=t),
            f"the slices pending compaction {t} reads",
        )
        for t, ops in plans.items()
    ]
    if compaction_every_commits > 0:
        last = timeline.last_completed(Action.COMMIT)
        since = sorted(
            i.time
            for i in timeline.instants
            if i.action is Action.DELTA_COMMIT and (last is None or i.time > last.time)
        )
        if len(since) >= compaction_every_commits:
            holds.append(
                Hold(
                    since[-compaction_every_commits],
                    f"the last {compaction_every_commits} deltacommits (the compaction "
                    "trigger counts them)",
                )
            )
        elif last is not None:
            holds.append(
                Hold(
                    last.time,
                    "the last compaction and the deltacommits since (its trigger counts them)",
                )
            )
        elif since:
            holds.append(
                Hold(
                    since[0],
                    f"the deltacommits of a table never compacted, fewer than "
                    f"{compaction_every_commits} (the compaction trigger counts them)",
                )
            )
    return holds


def _table_schema(timeline: Timeline, entries: Sequence[Entry], previous: str | None) -> str | None:
    """The schema of the last archived data instant (by completion) that recorded one."""
    metadata = {i: md for i, md in entries if md is not None}
    for inst in reversed(timeline.in_completion_order(list(metadata))):
        if metadata[inst].schema:
            return metadata[inst].schema.encode()
    return previous


def archive(
    table: HudiTable, control: CommitControl, policy: ArchivePolicy | None = None
) -> ArchiveResult:
    """Under the lock: choose the archivable prefix, write the archived view and the writers'
    offsets, then move the prefix to the archive."""
    policy = policy or ArchivePolicy()
    merge_on_read = table.config.table_type == "MERGE_ON_READ"
    with control.locked(table):
        timeline = table.timeline()
        previous = load_archived_view(table.storage)
        if previous is not None:
            # an archival interrupted after writing its view: finish moving what it covers
            leftovers = [i for i in timeline.completed() if i.time <= previous.upto]
            _move_instants(timeline, leftovers, merge_on_read=merge_on_read)
            timeline = table.timeline()
        completed = list(timeline.completed())
        entries: list[Entry] = [
            (i, timeline.commit_metadata(i) if i.action.writes_data else None) for i in completed
        ]
        pending = timeline.inflight_or_requested()
        on_storage = _data_files_by_time(table)
        holds: list[Hold] = []
        marked: set[str] = set()
        if merge_on_read:
            holds = merge_on_read_holds(
                timeline, pending_compaction_plans(table), policy.compaction_every_commits
            )
            for p in pending:  # listed after the files: a writer creates the marker first
                marked.update(list_marked_files(table.storage, p.time))
        choice = archivable_prefix(
            entries,
            previous.slices if previous is not None else (),
            pending,
            on_storage,
            policy,
            # a compaction runs under the lock from plan to commit and checks no conflicts
            # with what completed meanwhile: its own hold (its plan) is what keeps instants
            lambda done, pending: (
                pending.action is not Action.COMPACTION
                and completed_after(timeline, pending.time, done)
            ),
            holds=holds,
            marked=marked,
        )
        chosen = [i for i, _ in entries[: choice.count]]
        if not chosen:
            if choice.held_back_by:
                log.info("table %s: nothing archived: %s", table.config.name, choice.held_back_by)
            return ArchiveResult((), len(completed), len(completed), choice.held_back_by)
        record_archived_writers(table, timeline, chosen)
        done_at = [i.completion_time or i.time for i in chosen]
        write_archived_view(
            table.storage,
            ArchivedView(
                upto=chosen[-1].time,
                completed_upto=max(done_at),
                slices=choice.live,
                table_schema=_table_schema(
                    timeline,
                    entries[: choice.count],
                    previous.table_schema if previous is not None else None,
                ),
            ),
        )
        _move_instants(timeline, chosen, merge_on_read=merge_on_read)
        packs = pack_archived_timeline(
            table.storage, loose_files=policy.pack_files, fan_in=policy.pack_fan_in
        )
        if packs:
            log.info("table %s: archive packed into %s", table.config.name, ", ".join(packs))
    if table.layout is TimelineLayout.V1 and table.is_local:
        with contextlib.suppress(OSError):
            os.utime(timeline.folder)
    log.info(
        "table %s: archived %d instants (%s .. %s); %d remain active%s",
        table.config.name,
        len(chosen),
        chosen[0].time,
        chosen[-1].time,
        len(completed) - len(chosen),
        f"; held back by {choice.held_back_by}" if choice.held_back_by else "",
    )
    return ArchiveResult(
        tuple(chosen), len(completed), len(completed) - len(chosen), choice.held_back_by
    )


def _move_instants(
    timeline: Timeline, instants: Sequence[Instant], *, merge_on_read: bool = False
) -> None:
    """Move each instant's requested and inflight files, then its completed file (a reader
    never sees a completed instant as pending), to the archive; on a merge-on-read table a
    commit's `compaction.requested` and `.inflight` files too."""
    if not instants:
        return
    for k, inst in enumerate(instants):
        if k == 1:
            crash_point("during-archival")
        for state in (State.REQUESTED, State.INFLIGHT):
            _move(timeline.storage, timeline.key_of(inst.with_state(state)))
            if merge_on_read and inst.action is Action.COMMIT:  # a compaction's files
                compaction = Instant(inst.time, Action.COMPACTION, state)
                _move(timeline.storage, timeline.key_of(compaction))
        if inst.is_completed:
            _move(timeline.storage, timeline.key_of(inst))
