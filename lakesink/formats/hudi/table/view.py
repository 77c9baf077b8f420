"""The file-system view: which base file of each file group a reader sees.

Built from COMPLETED commit and replacecommit metadata only — data folders are never listed
to decide visibility, so files of inflight, failed or rolled-back instants are never visible.
The rules mirror hudi-rs: as of a time T, the instants requested at or before T count; a
file group's visible slice is its latest one at or before T; file groups replaced by a
replacecommit at or before T are hidden.

The file groups and their slices are values of `lakesink.formats.hudi.table.file_group`.
A deltacommit's log files join the slice they were written over: the latest slice whose base
instant is at or before the instant the log file's name carries (version 6: the base instant
itself; version 8: the deltacommit's); a log file with no such slice starts a slice of log files
only, at that instant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal

from lakesink.errors import CorruptTableError, InstantArchivedError
from lakesink.formats.hudi.table.archive import load_archived_view
from lakesink.formats.hudi.table.file_group import FileGroup, FileSlice
from lakesink.formats.hudi.table.files import parse_base_file_name
from lakesink.formats.hudi.table.log_file import LogFileName, is_log_file_name
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.protocol.instant import Action, Instant, InstantTime

if TYPE_CHECKING:
    from lakesink.formats.hudi.table.hudi_table import HudiTable
    from lakesink.formats.hudi.table.timeline import Timeline

IncrementalOrder = Literal["requested", "completion"]


CommitEntry = tuple[Instant, CommitMetadata]


_LogEntry = tuple[LogFileName, str]  # (its name's parts, its relative path)


def _logs_of(instant: Instant, metadata: CommitMetadata) -> Iterable[tuple[str, _LogEntry]]:
    """(partition, (name, path)) of each log file a deltacommit wrote."""
    if instant.action is not Action.DELTA_COMMIT:
        return
    for w in metadata.writes:
        name = w.path.rsplit("/", 1)[-1]
        if not is_log_file_name(name):
            continue
        parsed = LogFileName.parse(name)
        if parsed.file_id != w.file_id:
            raise CorruptTableError(
                f"deltacommit {instant.time}: write stat for {w.path!r} names file id "
                f"{w.file_id!r}, but the file name says {parsed.file_id!r}"
            )
        yield w.partition_path, (parsed, w.path)


def _slices_of(instant: Instant, metadata: CommitMetadata) -> Iterable[FileSlice]:
    for w in metadata.writes:
        name = w.path.rsplit("/", 1)[-1]
        if instant.action is Action.DELTA_COMMIT and is_log_file_name(name):
            continue  # a log file: see _logs_of
        parsed = parse_base_file_name(name)
        if parsed.file_id != w.file_id or parsed.instant_time != instant.time:
            raise CorruptTableError(
                f"commit {instant.time}: write stat for {w.path!r} names file id {w.file_id!r}, "
                f"but the file name says {parsed.file_id!r} of instant {parsed.instant_time}"
            )
        yield FileSlice(
            w.partition_path, w.file_id, instant.time, w.path, w.file_size_bytes, w.num_writes
        )


def build_file_groups(
    commits: Iterable[CommitEntry],
    as_of: InstantTime | None = None,
    base: Iterable[FileSlice] = (),
) -> tuple[dict[tuple[str, str], FileGroup], set[tuple[str, str]]]:
    """Pure: (visible file groups keyed by (partition, file id), replaced keys) from the
    completed data instants, as of `as_of` (requested time, inclusive; None = all), on top of
    the `base` slices (what archived instants left visible)."""
    slices, replaced = _all_slices(commits, as_of, base)
    groups = {
        key: FileGroup(key[0], key[1], tuple(sorted(lst, key=lambda s: s.instant_time)))
        for key, lst in slices.items()
        if key not in replaced
    }
    return groups, replaced


def all_file_slices(
    commits: Iterable[CommitEntry], base: Iterable[FileSlice] = ()
) -> dict[tuple[str, str], list[FileSlice]]:
    """Pure: every slice of every file group, replaced groups' too, with its log files joined,
    oldest first (what the cleaner chooses from)."""
    slices, _ = _all_slices(commits, None, base)
    return {key: sorted(lst, key=lambda s: s.instant_time) for key, lst in slices.items()}


def _all_slices(
    commits: Iterable[CommitEntry], as_of: InstantTime | None, base: Iterable[FileSlice]
) -> tuple[dict[tuple[str, str], list[FileSlice]], set[tuple[str, str]]]:
    slices: dict[tuple[str, str], list[FileSlice]] = {}
    for s in base:
        slices.setdefault((s.partition_path, s.file_id), []).append(s)
    replaced: set[tuple[str, str]] = set()
    logs: dict[tuple[str, str], list[_LogEntry]] = {}
    for instant, md in commits:
        if not instant.is_completed or not instant.action.writes_data:
            continue
        if as_of is not None and instant.time > as_of:
            continue
        for partition, entry in _logs_of(instant, md):
            logs.setdefault((partition, entry[0].file_id), []).append(entry)
        for s in _slices_of(instant, md):
            lst = slices.setdefault((s.partition_path, s.file_id), [])
            if any(x.instant_time == s.instant_time for x in lst):
                raise CorruptTableError(
                    f"file group {s.file_id} in {s.partition_path!r} has two base files of "
                    f"instant {s.instant_time}; readers cannot tell them apart"
                )
            lst.append(s)
        if instant.action is Action.REPLACE_COMMIT:
            for partition, ids in md.replaced_file_ids.items():
                replaced.update((partition, fid) for fid in ids)
    for key, entries in logs.items():
        slices[key] = _with_logs(key, slices.get(key, []), entries)
    return slices, replaced


def _with_logs(
    key: tuple[str, str], bases: list[FileSlice], entries: list[_LogEntry]
) -> list[FileSlice]:
    """The slices of one group with its log files joined to them (see the module's doc)."""
    by_time = {s.instant_time: s for s in bases}
    joined: dict[InstantTime, list[_LogEntry]] = {}
    times = sorted(by_time)
    for entry in sorted(entries):
        at = [t for t in times if t <= entry[0].instant_time]
        slice_time = at[-1] if at else entry[0].instant_time
        if slice_time not in by_time:  # a slice of log files only
            by_time[slice_time] = FileSlice(key[0], key[1], slice_time, "")
            times = sorted(by_time)
        joined.setdefault(slice_time, []).append(entry)
    # a slice of the archived view keeps the log files of archived deltacommits: the active
    # ones follow them, all in the order readers apply them
    return [
        dataclasses.replace(s, log_paths=_in_log_order(s.log_paths, joined.get(t, ())))
        for t, s in sorted(by_time.items())
    ]


def _in_log_order(earlier: Sequence[str], entries: Sequence[_LogEntry]) -> tuple[str, ...]:
    if not earlier:
        return tuple(path for _, path in entries)
    named = [(LogFileName.parse(p.rsplit("/", 1)[-1]), p) for p in earlier]
    return tuple(path for _, path in sorted({*named, *entries}))


def incremental_slices(
    commits: Sequence[CommitEntry],
    start_exclusive: InstantTime,
    end_inclusive: InstantTime,
    by: IncrementalOrder = "requested",
) -> tuple[list[FileSlice], frozenset[InstantTime]]:
    """Pure: the slices holding rows committed in (start, end] and the instant times whose
    rows count. `by="requested"` compares instant times (hudi-rs, table version 6);
    `by="completion"` compares completion times (layout 2: the order commits became visible)."""

    def key(i: Instant) -> InstantTime:
        return (i.completion_time or i.time) if by == "completion" else i.time

    chosen = [
        (i, md)
        for i, md in commits
        if i.is_completed and i.action.writes_data and start_exclusive < key(i) <= end_inclusive
    ]
    groups, _ = build_file_groups(chosen)
    return [g.latest for g in groups.values()], frozenset(i.time for i, _ in chosen)


class FileSystemView:
    """Latest file slices of a table as of an instant (default: everything completed): the
    archived view (what archived instants left visible) plus the active timeline's commits."""

    def __init__(
        self,
        table: HudiTable | None = None,
        as_of: InstantTime | None = None,
        *,
        timeline: Timeline | None = None,
        commits: Sequence[CommitEntry] | None = None,
        base: Sequence[FileSlice] = (),
    ) -> None:
        self.as_of = as_of
        if commits is None:
            if timeline is None:
                if table is None:
                    raise ValueError("FileSystemView needs a table, a timeline or commits")
                timeline = table.timeline()
            commits, base = active_commits_and_base(timeline, as_of)
        self.commits: tuple[CommitEntry, ...] = tuple(commits)
        self.base: tuple[FileSlice, ...] = tuple(base)
        self._groups, self._replaced = build_file_groups(self.commits, as_of, self.base)

    @classmethod
    def from_commits(
        cls,
        commits: Sequence[CommitEntry],
        as_of: InstantTime | None = None,
        base: Sequence[FileSlice] = (),
    ) -> FileSystemView:
        """Pure constructor (no I/O) for tests and tools."""
        return cls(None, as_of, commits=commits, base=base)

    def file_groups(self, partitions: Iterable[str] | None = None) -> list[FileGroup]:
        wanted = None if partitions is None else set(partitions)
        return sorted(
            (g for g in self._groups.values() if wanted is None or g.partition_path in wanted),
            key=lambda g: (g.partition_path, g.file_id),
        )

    def latest_base_files(self, partitions: Iterable[str] | None = None) -> list[FileSlice]:
        """The visible base file of every file group (optionally of some partitions)."""
        out: list[FileSlice] = []
        for g in self.file_groups(partitions):
            s = g.latest if self.as_of is None else _as_of(g, self.as_of)
            if s is not None:
                out.append(s)
        return out

    def partitions(self) -> list[str]:
        return sorted({g.partition_path for g in self._groups.values()})

    def replaced_file_groups(self) -> set[tuple[str, str]]:
        return set(self._replaced)

    @property
    def total_records(self) -> int:
        return sum(s.num_records for s in self.latest_base_files())


def active_commits_and_base(
    timeline: Timeline, as_of: InstantTime | None = None
) -> tuple[list[CommitEntry], tuple[FileSlice, ...]]:
    """The completed data instants of `timeline` not yet archived, with their metadata, and
    the slices the archived ones left visible. InstantArchivedError if `as_of` is archived.

    The archived view is read after the timeline was listed: archival writes the view before
    moving instants, so every instant missing from the listing is in this view or an older
    one, and the active instants the view covers already are skipped."""
    archived = load_archived_view(timeline.storage)
    done = timeline.completed_data_instants()
    if archived is None:
        return [(i, timeline.commit_metadata(i)) for i in done], ()
    if as_of is not None and as_of < archived.upto:
        raise InstantArchivedError(
            f"instant {as_of} of {timeline.storage.uri} is archived; time travel reaches back to "
            f"{archived.upto}"
        )
    active = [(i, timeline.commit_metadata(i)) for i in done if i.time > archived.upto]
    return active, archived.slices


def _as_of(g: FileGroup, t: InstantTime) -> FileSlice | None:
    chosen = [s for s in g.slices if s.instant_time <= t]
    return chosen[-1] if chosen else None
