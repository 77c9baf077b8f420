"""The timeline: every instant of a table, read from the active timeline folder only
(`.hoodie/` in layout 1, `.hoodie/timeline/` in layout 2), and the writes that move an
instant along requested → inflight → completed."""

from __future__ import annotations

import bisect
import itertools
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lakesink.errors import (
    CommitConflictError,
    CommitError,
    CorruptTableError,
    UnsupportedTableError,
)
from lakesink.formats.hudi.table.archive import load_archived_view, read_archived_file
from lakesink.formats.hudi.table.markers import delete_markers as _delete_markers
from lakesink.formats.hudi.table.metadata import CommitMetadata, RollbackMetadata, RollbackPlan
from lakesink.protocol.instant import Action, Instant, InstantTime, State, TimelineLayout
from lakesink.storage import (
    LocalStorage,
    ObjectExistsError,
    ObjectNotFoundError,
    Storage,
    as_storage,
)

log = logging.getLogger(__name__)

_IGNORED_SUFFIXES = (".crc", ".tmp")


def timeline_folder(base_path: Path, layout: TimelineLayout) -> Path:
    return base_path / timeline_key(layout)


def timeline_key(layout: TimelineLayout) -> str:
    """The active timeline folder relative to the table root."""
    return ".hoodie/timeline" if layout is TimelineLayout.V2 else ".hoodie"


def _looks_like_instant(name: str) -> bool:
    return len(name) > 17 and name[:17].isdigit() and not name.endswith(_IGNORED_SUFFIXES)


_PARSED: dict[str, Instant] = {}
"""Timeline file name -> Instant: a name always parses to the same instant, and parsing (two
regular expressions, three dataclasses) was most of the cost of every timeline load."""
_PARSED_MAX = 20_000


def _parse_name(name: str) -> Instant:
    inst = _PARSED.get(name)
    if inst is None:
        inst = Instant.parse(name)
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[name] = inst
    return inst


def instants_named(names: Iterable[str], where: Path | str) -> list[tuple[str, Instant]]:
    """The instant files among file `names` (of folder `where`, for errors), parsed."""
    out: list[tuple[str, Instant]] = []
    for name in names:
        if not _looks_like_instant(name):
            continue
        try:
            out.append((name, _parse_name(name)))
        except CorruptTableError as err:
            raise UnsupportedTableError(
                f"timeline file {where}/{name} is not one lakesink handles: {err}"
            ) from err
    return out


def list_instant_files(folder: Path) -> list[tuple[str, Instant]]:
    """Parse every instant file directly inside local `folder` (no recursion)."""
    listing = LocalStorage(folder).list_folder("")
    return instants_named((m.key for m in listing.objects), folder)


def _parse_names(folder: str, names: Sequence[str]) -> list[tuple[str, Instant]]:
    """The instant files among the entry `names` of `folder` (what list_instant_files finds):
    a name seen before as an instant file is not parsed or checked again."""
    out: list[tuple[str, Instant]] = []
    for name in names:
        inst = _PARSED.get(name)
        if inst is None:
            if not _looks_like_instant(name):
                continue
            try:
                inst = _parse_name(name)
            except CorruptTableError as err:
                raise UnsupportedTableError(
                    f"timeline file {folder}/{name} is not one lakesink handles: {err}"
                ) from err
        out.append((name, inst))
    return out


@dataclass(frozen=True, slots=True)
class _Loaded:
    """A timeline folder at its last load: its entry names (sorted), and its instants at their
    latest states, sorted by time, with their times as text and by time."""

    names: list[str]
    values: list[str]
    instants: tuple[Instant, ...]
    by_value: dict[str, Instant]


_LOADED: dict[str, _Loaded] = {}
"""Timeline folder -> its last load: a load that lists the same names reuses the instants, and
one that lists more names (the usual: a commit added files) updates only the instants of the
new files, instead of rebuilding a thousand entries on every commit step."""

_METADATA: dict[tuple[str, int, int, int, str], CommitMetadata] = {}
"""Parsed commit metadata by (path, inode, mtime ns, size, action): a completed timeline file is
written once, atomically, and never changed in place, so a file with the same identity holds the
same metadata. Shared by every Timeline snapshot of the process (a snapshot is taken per commit
step), so each commit's Avro/JSON is parsed once, not on every batch."""
_METADATA_MAX = 2048


def _remember_metadata(key: tuple[str, int, int, int, str], metadata: CommitMetadata) -> None:
    if len(_METADATA) >= _METADATA_MAX:
        _METADATA.clear()
    _METADATA[key] = metadata


def _apply_states(
    by_value: dict[str, Instant], parsed: Iterable[tuple[str, Instant]], folder: str
) -> set[str]:
    """Update `by_value` (instant time as text -> the instant at its latest state) with the
    parsed files; returns the times whose entry changed (the result is the same whatever order
    files are seen in)."""
    changed: set[str] = set()
    for name, inst in parsed:
        t = inst.time.value
        prev = by_value.get(t)
        if prev is not None and prev.action is not inst.action and not _compaction_pair(prev, inst):
            raise CorruptTableError(
                f"timeline {folder} has two actions at instant {inst.time}: "
                f"{prev.action.value} and {inst.action.value} ({name})"
            )
        if prev is not None and prev.state is State.COMPLETED and inst.state is State.COMPLETED:
            raise CorruptTableError(
                f"timeline {folder} has two completed files for instant {inst.time}: "
                f"{prev} and {name}"
            )
        if prev is None or inst.state > prev.state:
            by_value[t] = inst
            changed.add(t)
    return changed


def _compaction_pair(a: Instant, b: Instant) -> bool:
    """A compaction's pending files and the commit that completes it share one instant time."""
    actions = {a.action, b.action}
    if actions != {Action.COMPACTION, Action.COMMIT}:
        return False
    commit = a if a.action is Action.COMMIT else b
    return commit.is_completed


def _load_all(names: list[str], folder: str) -> _Loaded:
    by_value: dict[str, Instant] = {}
    _apply_states(by_value, _parse_names(folder, names), folder)
    values = sorted(by_value)
    return _Loaded(names, values, tuple(by_value[v] for v in values), by_value)


def _load_added(hit: _Loaded, names: list[str], added: list[str], folder: str) -> _Loaded:
    """`hit` plus the files `added`: only the instants from the earliest changed time on are
    re-sorted (new files are mostly of the newest instants)."""
    by_value = dict(hit.by_value)
    changed = _apply_states(by_value, _parse_names(folder, added), folder)
    if not changed:
        return _Loaded(names, hit.values, hit.instants, by_value)
    cut = bisect.bisect_left(hit.values, min(changed))
    tail = sorted(changed.union(hit.values[cut:]))
    return _Loaded(
        names,
        hit.values[:cut] + tail,
        hit.instants[:cut] + tuple(by_value[v] for v in tail),
        by_value,
    )


@dataclass(frozen=True, slots=True)
class EncodedCommit:
    """A commit's completed-file content (`encode_commit`), and the dict it encodes."""

    instant: Instant
    metadata: CommitMetadata
    as_dict: dict[str, Any]
    content: bytes


def encode_commit(
    layout: TimelineLayout, instant: Instant, metadata: CommitMetadata
) -> EncodedCommit:
    """The completed file's content of commit or replacecommit `instant` with `metadata`: it
    does not depend on the timeline's state, so a publisher encodes it before taking the lock."""
    if not instant.action.writes_data:
        raise CommitError(f"publish() completes commits and replacecommits, not {instant}")
    if instant.action is Action.COMMIT and metadata.replaced_file_ids:
        raise CommitError(f"{instant}: only a replacecommit may replace file groups")
    as_dict = metadata.to_dict(layout, instant.action)
    content = CommitMetadata.encode(as_dict, layout, instant.action)
    return EncodedCommit(instant, metadata, as_dict, content)


class Timeline:
    """A snapshot of a table's active timeline: one entry per instant, at its latest state,
    sorted by instant (requested) time. Archived instants are not loaded: lakesink's archival
    moves them under `.hoodie/.lakesink/archive/` (`lakesink.formats.hudi.table.archive`)."""

    def __init__(
        self,
        base_path: Path | Storage,
        layout: TimelineLayout,
        instants: Sequence[Instant],
        *,
        presorted: bool = False,
        by_value: dict[str, Instant] | None = None,
    ) -> None:
        """`by_value`: the presorted `instants` by time as text, when the caller has it (never
        changed by the timeline)."""
        self.storage = as_storage(base_path)
        self.layout = layout
        self.folder_key = timeline_key(layout)
        self.where = f"{self.storage.uri}/{self.folder_key}"
        """The timeline folder as a path or URI, for messages."""
        self.instants: tuple[Instant, ...] = (
            tuple(instants) if presorted else tuple(sorted(instants, key=lambda i: i.time.value))
        )
        # by instant time as text: a str key hashes in C, an InstantTime in Python
        self._by_time: dict[str, Instant] = (
            by_value if by_value is not None else {i.time.value: i for i in self.instants}
        )
        self._commit_cache: dict[Instant, CommitMetadata] = {}

    @property
    def base_path(self) -> Path:
        """The table folder of a local table (TypeError-free only for local storage)."""
        if isinstance(self.storage, LocalStorage):
            return self.storage.root
        raise CommitError(f"the timeline of {self.storage.uri} is on an object store")

    @property
    def folder(self) -> Path:
        return self.base_path / self.folder_key

    @classmethod
    def load(cls, base_path: str | Path | Storage, layout: TimelineLayout) -> Timeline:
        """Read the active timeline: one listing of the timeline folder (one LIST request per
        1000 entries on an object store), never of data folders."""
        base = as_storage(base_path)
        folder = f"{base.uri}/{timeline_key(layout)}"
        names = base.list_names(timeline_key(layout))
        hit = _LOADED.get(folder)
        if hit is not None and hit.names == names:
            # the same entries as at the last load: the same instants at the same states
            loaded = hit
        elif hit is not None and names[: len(hit.names)] == hit.names:
            # names sort by instant time: a commit's new files come after the old ones
            loaded = _load_added(hit, names, names[len(hit.names) :], folder)
        elif hit is not None:
            seen = set(hit.names)
            added = [n for n in names if n not in seen]
            if len(hit.names) + len(added) == len(names):  # nothing removed: add the new files
                loaded = _load_added(hit, names, added, folder)
            else:
                loaded = _load_all(names, folder)
        else:
            loaded = _load_all(names, folder)
        if len(_LOADED) >= 64:
            _LOADED.clear()
        _LOADED[folder] = loaded
        return cls(base, layout, loaded.instants, presorted=True, by_value=loaded.by_value)

    # -- reading -----------------------------------------------------------------------------

    def completed(self, action: Action | None = None) -> tuple[Instant, ...]:
        """Completed instants in instant-time order, optionally of one action."""
        return tuple(
            i for i in self.instants if i.is_completed and (action is None or i.action is action)
        )

    def completed_data_instants(self) -> tuple[Instant, ...]:
        """Completed commits and replacecommits (what readers see), in instant-time order."""
        return tuple(i for i in self.instants if i.is_completed and i.action.writes_data)

    def in_completion_order(self, instants: Iterable[Instant] | None = None) -> list[Instant]:
        """Completed instants ordered as they became visible: by completion time in layout 2,
        by instant time in layout 1."""
        chosen = [i for i in (self.instants if instants is None else instants) if i.is_completed]
        return sorted(chosen, key=lambda i: (i.completion_time or i.time, i.time))

    def inflight_or_requested(self, action: Action | None = None) -> tuple[Instant, ...]:
        return tuple(
            i
            for i in self.instants
            if not i.is_completed and (action is None or i.action is action)
        )

    def last_completed(self, action: Action | None = None) -> Instant | None:
        """The most recently completed instant (by completion time in layout 2)."""
        done = self.in_completion_order(self.completed(action))
        return done[-1] if done else None

    def get(self, time_: InstantTime | str) -> Instant | None:
        key = time_.value if isinstance(time_, InstantTime) else InstantTime(str(time_)).value
        return self._by_time.get(key)

    def __contains__(self, time_: object) -> bool:
        return isinstance(time_, InstantTime | str) and self.get(time_) is not None

    def __len__(self) -> int:
        return len(self.instants)

    def path_of(self, instant: Instant) -> Path:
        """The local path of an instant file (local tables only; see key_of)."""
        return self.folder / instant.file_name(self.layout)

    def key_of(self, instant: Instant) -> str:
        """The key of an instant file relative to the table root."""
        return f"{self.folder_key}/{instant.file_name(self.layout)}"

    def _read(self, instant: Instant) -> bytes:
        key = self.key_of(instant)
        try:
            return self.storage.read(key)
        except ObjectNotFoundError:
            raise CorruptTableError(f"timeline file {self.storage.uri}/{key} is missing") from None

    def commit_metadata(self, instant: Instant) -> CommitMetadata:
        """The metadata of a completed commit or replacecommit; CorruptTableError naming the
        file if it is missing, empty or garbled."""
        if not instant.is_completed or not instant.action.writes_data:
            raise CorruptTableError(
                f"instant {instant} has no commit metadata; only completed commits and "
                "replacecommits do"
            )
        cached = self._commit_cache.get(instant)
        if cached is None:
            key = self._metadata_key(instant)
            cached = _METADATA.get(key) if key is not None else None
            if cached is None:
                name = self.key_of(instant)
                content, source = self._commit_file(name)
                cached = CommitMetadata.from_bytes(
                    content, self.layout, instant.action, source=source
                )
                if key is not None:
                    _remember_metadata(key, cached)
            self._commit_cache[instant] = cached
        return cached

    def _metadata_key(self, instant: Instant) -> tuple[str, int, int, int, str] | None:
        """The `_METADATA` key of a completed commit file (None: the file is gone). A completed
        file is written once, whole, and never changed: its name identifies its content on an
        object store; a local file also by inode and mtime."""
        action = instant.action.value
        if isinstance(self.storage, LocalStorage):
            path = self.path_of(instant)
            try:
                st = path.stat()
            except FileNotFoundError:
                return None  # archival moved it since this snapshot was listed
            return (str(path), st.st_ino, st.st_mtime_ns, st.st_size, action)
        return (f"{self.storage.uri}/{self.key_of(instant)}", 0, 0, 0, action)

    def _commit_file(self, key: str) -> tuple[bytes, str]:
        """(content, where it was read) of a commit file, from the archive when archival
        moved it after this snapshot was listed."""
        where = f"{self.storage.uri}/{key}"
        try:
            return self.storage.read(key), where
        except ObjectNotFoundError:
            name = key.rsplit("/", 1)[-1]
            content = read_archived_file(self.storage, name)
            if content is None:
                raise CorruptTableError(f"timeline file {where} is missing") from None
            return content, f"archived {name}"

    def rollback_metadata(self, instant: Instant) -> RollbackMetadata:
        if instant.action is not Action.ROLLBACK or not instant.is_completed:
            raise CorruptTableError(f"instant {instant} is not a completed rollback")
        return RollbackMetadata.from_bytes(self._read(instant), source=self.key_of(instant))

    def rollback_plan(self, instant: Instant) -> RollbackPlan:
        if instant.action is not Action.ROLLBACK:
            raise CorruptTableError(f"instant {instant} is not a rollback")
        req = instant.with_state(State.REQUESTED)
        return RollbackPlan.from_bytes(self._read(req), source=self.key_of(req))

    def latest_schema(self) -> str | None:
        """The Avro schema of the last completed data instant that recorded one (archived
        instants included)."""
        for inst in reversed(self.in_completion_order(self.completed_data_instants())):
            schema = self.commit_metadata(inst).schema
            if schema:
                return schema.encode()
        archived = load_archived_view(self.storage)
        return archived.table_schema if archived is not None else None

    def latest_written_partitions(self) -> frozenset[str]:
        """The partitions the last completed data instant wrote files into. Each writer of a
        partition creates its `.hoodie_partition_metadata` before its first file there, and
        nothing deletes one: in these partitions it exists."""
        done = self.in_completion_order(self.completed_data_instants())
        if not done:
            return frozenset()
        return frozenset(w.partition_path for w in self.commit_metadata(done[-1]).writes)

    # -- writing -----------------------------------------------------------------------------

    def begin(
        self,
        action: Action,
        time_: InstantTime,
        *,
        requested_content: bytes = b"",
        snapshot_is_fresh: bool = False,
    ) -> Instant:
        """Write the instant's requested then inflight file. CommitError if an instant with
        this time exists already (pick a new time and retry). `snapshot_is_fresh`: this
        timeline was listed under the lock held now: it is not listed again."""
        fresh = self if snapshot_is_fresh else Timeline.load(self.storage, self.layout)
        existing = fresh.get(time_)
        if existing is not None:
            raise CommitError(
                f"instant time {time_} is taken by {existing} in {self.where}; "
                "generate a new instant time"
            )
        requested = Instant(time_, action, State.REQUESTED)
        try:
            self.storage.create(self.key_of(requested), requested_content)
        except ObjectExistsError:
            raise CommitError(
                f"instant time {time_} was begun concurrently in {self.where}; "
                "generate a new instant time"
            ) from None
        inflight = requested.with_state(State.INFLIGHT)
        self.storage.create(self.key_of(inflight), b"")
        log.info("table %s: began %s", self.storage.uri, inflight)
        return inflight

    def publish(
        self,
        instant: Instant,
        metadata: CommitMetadata,
        completion_time: InstantTime | None = None,
        *,
        snapshot_is_fresh: bool = False,
        encoded: EncodedCommit | None = None,
        delete_markers: bool = True,
    ) -> Instant:
        """Write the completed file of a commit or replacecommit atomically (never partial,
        never empty, never twice). Returns the completed instant. `snapshot_is_fresh`: this
        timeline was listed just now, under the lock: it is not listed again before publishing
        (one LIST less per commit on an object store). `encoded`: `encode_commit` of this
        instant and metadata, done before the lock was taken. `delete_markers=False`: the
        caller deletes the instant's markers itself, after releasing the lock."""
        if encoded is None or encoded.metadata is not metadata or encoded.instant != instant:
            encoded = encode_commit(self.layout, instant, metadata)
        done = self._complete(
            instant,
            encoded.content,
            completion_time,
            snapshot_is_fresh=snapshot_is_fresh,
            delete_markers=delete_markers,
        )
        # The next commit step reads this commit's metadata (the writer's offsets): keep what a
        # reader parses from the file (`as_read`), instead of reading and parsing it again.
        key = self._metadata_key(done)
        if key is not None:
            _remember_metadata(key, metadata.as_read(encoded.as_dict))
        return done

    def complete_rollback(
        self,
        instant: Instant,
        metadata: RollbackMetadata,
        completion_time: InstantTime | None = None,
    ) -> Instant:
        if instant.action is not Action.ROLLBACK:
            raise CommitError(f"{instant} is not a rollback")
        return self._complete(instant, metadata.to_bytes(), completion_time)

    def _complete(
        self,
        instant: Instant,
        content: bytes,
        completion_time: InstantTime | None,
        *,
        snapshot_is_fresh: bool = False,
        delete_markers: bool = True,
    ) -> Instant:
        fresh = self if snapshot_is_fresh else Timeline.load(self.storage, self.layout)
        current = fresh.get(instant.time)
        completes_compaction = (
            current is not None
            and current.action is Action.COMPACTION
            and instant.action is Action.COMMIT
        )
        if current is None or (current.action is not instant.action and not completes_compaction):
            raise CommitError(
                f"cannot publish {instant.time}.{instant.action.value}: it was never begun or "
                f"was rolled back (not in {self.where})"
            )
        if current.is_completed:
            raise CommitError(f"instant {current} is already completed in {self.where}")
        done = instant.with_state(State.COMPLETED)
        if self.layout is TimelineLayout.V2:
            if completion_time is None:
                completion_time = next_completion_time(fresh, instant.time)
            elif completion_time < instant.time:
                raise CommitError(
                    f"completion time {completion_time} of {instant.time} is before its "
                    "instant time"
                )
            done = instant.with_state(State.COMPLETED, completion_time)
        target = self.key_of(done)
        # The one conditional create that publishes: whole, in one request, never twice.
        try:
            self.storage.create(target, content)
        except ObjectExistsError:
            # A store client retries a create whose response was lost and meets its own object:
            # the same bytes mean this writer's publish landed, anything else is someone else's.
            if self.storage.read(target) != content:
                raise CommitError(
                    f"{self.storage.uri}/{target} exists: instant {instant.time} is already "
                    "completed"
                ) from None
            log.info("table %s: publish of %s had landed before its retry", self.storage.uri, done)
        # Two publishers racing with different completion times: keep exactly one.
        others = _completed_files_of(self.storage, self.folder_key, instant.time, target)
        if others:
            self.storage.delete(target)
            raise CommitConflictError(
                f"instant {instant.time} was completed concurrently as {others[0]} in {self.where}"
            )
        log.info("table %s: completed %s", self.storage.uri, done)
        if done.action.writes_data and delete_markers:
            _delete_markers(self.storage, done.time)
        return done

    def remove_pending(self, instant: Instant) -> None:
        """Delete an instant's inflight then requested files (after its rollback completed)."""
        for state in (State.INFLIGHT, State.REQUESTED):
            self.storage.delete(self.key_of(instant.with_state(state)))


def latest_time(timeline: Timeline) -> InstantTime | None:
    """The latest instant time or completion time on `timeline`: a new instant begins after
    it, so that nothing that completed before the instant began has a completion time at or
    after the instant's own time (which the conflict check would take for a concurrent
    commit)."""
    instants = timeline.instants  # sorted by instant time
    if not instants:
        return None
    done = [c.value for i in instants if (c := i.completion_time) is not None]
    latest = instants[-1].time.value
    return InstantTime(max(latest, *done) if done else latest)


def next_completion_time(timeline: Timeline, instant_time: InstantTime) -> InstantTime:
    """The completion time (layout 2) of `instant_time` completing now on `timeline`: the clock,
    but never before the instant's own time nor at or before the last completion time, and no
    other instant's time or completion time (each completion time on a timeline is unique).
    The one rule for every instant lakesink completes, data commits and cleans alike."""
    # Instant times are fixed-width digit strings: compare them as text and convert only the few
    # values needed to epoch ms (a strptime each; a whole timeline of them was a third of a
    # publish).
    instants = timeline.instants
    done = [c.value for i in instants if (c := i.completion_time) is not None]
    taken = {i.time.value for i in instants}
    taken.update(done)
    last_done = InstantTime(max(done)).to_epoch_ms() if done else 0
    own = instant_time.to_epoch_ms()
    candidate = max(int(time.time() * 1000), own, last_done + 1)
    while candidate != own and InstantTime.from_epoch_ms(candidate).value in taken:
        candidate += 1
    return InstantTime.from_epoch_ms(candidate)


def _completed_files_of(
    storage: Storage, folder_key: str, time_: InstantTime, except_key: str
) -> list[str]:
    """Names of completed timeline files of instant `time_` other than `except_key` (only the
    names starting with the instant time are parsed)."""
    prefix = time_.value
    except_name = except_key.rsplit("/", 1)[-1]
    out = []
    names = storage.list_names(folder_key)  # sorted: the instant's files are side by side
    for n in itertools.takewhile(
        lambda n: n.startswith(prefix), names[bisect.bisect_left(names, prefix) :]
    ):
        if n == except_name or not _looks_like_instant(n):
            continue
        try:
            inst = _parse_name(n)
        except CorruptTableError:
            continue
        if inst.time == time_ and inst.is_completed:
            out.append(n)
    return out


CompletionOrder = Literal["requested", "completion"]
