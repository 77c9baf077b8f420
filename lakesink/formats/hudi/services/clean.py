"""The cleaner: delete the files no retained view needs, as its own `clean` instant.

It keeps every file slice needed by the views as of the last N completed data instants (or
those of the last H hours) and by the latest view; it deletes the older slices of file groups
that were replaced (by clustering) or superseded, and the leftover files of failed writes
(base files of no instant on the timeline, or of a completed instant that does not list them).
It never deletes a file of a pending instant, nor a file some retained view reads.

On a merge-on-read table a file slice is a base file and the log files deltacommits wrote over
it (`lakesink.formats.hudi.table.view`), and the slice goes as a whole, as Hudi's CleanPlanner
does: a slice superseded by a compaction's base file loses its base file and its log files
together. Data instants are commits, deltacommits and replacecommits alike. A pending
compaction holds back what its plan reads, as in Hudi: the views to keep start no later than
the compaction's instant, and no slice of a planned file group at or after the planned slice's
base instant is deleted. Leftover log files of failed writes go too: a log file no completed
instant lists and no pending instant's markers name (version 8 names the deltacommit that
wrote it: it must lie inside the active timeline, as a base file).

`plan_clean` is pure; `clean` runs it under the table lock and records the clean instant
(requested → inflight → completed, Avro `HoodieCleanMetadata`, which hudi-rs skips).
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import fastavro

from lakesink.engine.transaction import TableTransaction
from lakesink.errors import CorruptTableError
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.format import HudiFormat
from lakesink.formats.hudi.services.lazy_rollback import rollback_failed_writes
from lakesink.formats.hudi.table.compaction_plan import CompactionOperation, read_compaction_plan
from lakesink.formats.hudi.table.file_group import FileSlice
from lakesink.formats.hudi.table.files import parse_base_file_name
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.log_file import LogFileName, is_log_file_name
from lakesink.formats.hudi.table.markers import list_marked_files
from lakesink.formats.hudi.table.view import (
    CommitEntry,
    active_commits_and_base,
    all_file_slices,
)
from lakesink.protocol.instant import Action, Instant, InstantTime, State
from lakesink.storage import StorageError

if TYPE_CHECKING:
    from lakesink.formats.hudi.table.timeline import Timeline

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RetainPolicy:
    """What the cleaner keeps: views as of the last `commits` data instants, and (if set) as of
    every data instant of the last `hours`; the union when both are set."""

    commits: int = 30
    hours: float | None = None

    def __post_init__(self) -> None:
        if self.commits < 1:
            raise ValueError(f"the cleaner must retain at least 1 commit, not {self.commits}")


@dataclass(frozen=True, slots=True)
class CleanPlan:
    """Files (relative paths) the cleaner deletes, and why."""

    earliest_retained: InstantTime | None
    replaced: tuple[str, ...] = ()  # slices (base and log files) replaced or superseded
    failed: tuple[str, ...] = ()  # leftovers of failed or rolled-back writes

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(sorted({*self.replaced, *self.failed}))

    @property
    def is_empty(self) -> bool:
        return not self.replaced and not self.failed


@dataclass(frozen=True, slots=True)
class CleanResult:
    instant: Instant | None
    deleted: tuple[str, ...] = ()
    rolled_back: tuple[Instant, ...] = ()
    plan: CleanPlan = field(default_factory=lambda: CleanPlan(None))


def earliest_retained(
    commits: Sequence[CommitEntry], policy: RetainPolicy, now_ms: int
) -> InstantTime | None:
    """The oldest data instant whose view the cleaner must keep (None: keep everything)."""
    times = sorted(i.time for i, _ in commits if i.is_completed and i.action.writes_data)
    if not times:
        return None
    keep = times[-policy.commits] if len(times) >= policy.commits else times[0]
    if policy.hours is not None:
        horizon = now_ms - int(policy.hours * 3_600_000)
        recent = [t for t in times if t.to_epoch_ms() >= horizon]
        keep = min(keep, recent[0]) if recent else keep
    return keep


def replaced_files(
    commits: Sequence[CommitEntry],
    keep_from: InstantTime,
    base: Sequence[FileSlice] = (),
    planned: Sequence[CompactionOperation] = (),
) -> list[str]:
    """Pure: the files of the slices (base file and log files) that no view as of `keep_from`
    or later reads: slices older than `keep_from` of groups replaced at or before it, or
    superseded by a newer slice at or before it. `base` are the slices archived instants left
    visible; `planned` the operations of pending compactions, whose slices (and any newer one
    of their groups) are kept."""
    replaced_at: dict[tuple[str, str], InstantTime] = {}
    for inst, md in commits:
        if not inst.is_completed or not inst.action.writes_data:
            continue
        for p, ids in md.replaced_file_ids.items():
            for f in ids:
                prev = replaced_at.get((p, f))
                replaced_at[(p, f)] = inst.time if prev is None else min(prev, inst.time)
    needed: dict[tuple[str, str], InstantTime] = {}
    for op in planned:
        key = (op.partition_path, op.file_id)
        needed[key] = min(needed.get(key, op.base_instant), op.base_instant)
    out: list[str] = []
    for key, group in all_file_slices(commits, base).items():
        gone = replaced_at.get(key)
        floor = needed.get(key)
        for idx, s in enumerate(group):
            if s.instant_time >= keep_from or (floor is not None and s.instant_time >= floor):
                continue
            superseded = idx + 1 < len(group) and group[idx + 1].instant_time <= keep_from
            if superseded or (gone is not None and gone <= keep_from):
                out.extend(p for p in (s.path, *s.log_paths) if p)
    return sorted(out)


def failed_files(
    on_storage: Iterable[str],
    instants: Sequence[Instant],
    referenced: set[str],
) -> list[str]:
    """Pure: base files (relative paths) left by failed writes. A file of a pending instant is
    kept; a file of a completed instant is failed only if the instant does not list it; a file
    of no instant is failed only if its time lies inside the timeline (instants are created in
    time order under the lock, so it was rolled back; older ones may be archived)."""
    if not instants:
        return []
    by_time = {i.time: i for i in instants}
    first, last = instants[0].time, max(i.time for i in instants)
    out: list[str] = []
    for rel in on_storage:
        try:
            t = parse_base_file_name(rel.rsplit("/", 1)[-1]).instant_time
        except CorruptTableError:
            continue
        inst = by_time.get(t)
        if inst is None:
            if first <= t < last:
                out.append(rel)
        elif inst.is_completed and inst.action.writes_data and rel not in referenced:
            out.append(rel)
    return sorted(out)


def failed_log_files(
    logs: Iterable[str],
    instants: Sequence[Instant],
    referenced: set[str],
    marked: set[str],
    *,
    named_by_writer: bool,
) -> list[str]:
    """Pure: log files (relative paths) left by failed writes: listed by no completed instant
    (`referenced`) and named by no pending instant's markers (`marked`; a writer creates the
    marker before the file). With `named_by_writer` (table version 8: the name carries the
    deltacommit's instant) the instant must also be none on the timeline and lie inside it,
    or be completed, as `failed_files` asks of a base file; version 6 names a log file by its
    slice's base instant, which tells nothing of its writer."""
    if not instants:
        return []
    by_time = {i.time: i for i in instants}
    first, last = instants[0].time, max(i.time for i in instants)
    out: list[str] = []
    for rel in logs:
        if rel in referenced or rel in marked or not is_log_file_name(rel.rsplit("/", 1)[-1]):
            continue
        if named_by_writer:
            t = LogFileName.parse(rel.rsplit("/", 1)[-1]).instant_time
            inst = by_time.get(t)
            if inst is None and not first <= t < last:
                continue  # older than the active timeline: maybe archived
            if inst is not None and not (inst.is_completed and inst.action.writes_data):
                continue  # of a pending instant
        out.append(rel)
    return sorted(out)


def plan_clean(
    commits: Sequence[CommitEntry],
    instants: Sequence[Instant],
    on_storage: Iterable[str],
    policy: RetainPolicy,
    now_ms: int,
    base: Sequence[FileSlice] = (),
    *,
    pending_compactions: Mapping[InstantTime, Sequence[CompactionOperation]] | None = None,
    logs: LogListing | None = None,
) -> CleanPlan:
    """Pure: the whole plan from the timeline, the commit metadata (of active instants), the
    slices archived instants left visible (`base`), the storage listing (`on_storage`: base
    files) and, on a merge-on-read table, the plans of the pending compactions and the log
    files on storage (`logs`)."""
    pending = pending_compactions or {}
    keep_from = earliest_retained(commits, policy, now_ms)
    if keep_from is not None and pending:  # never past a pending compaction (Hudi's rule)
        keep_from = min(keep_from, *pending)
    planned = [op for ops in pending.values() for op in ops]
    replaced = replaced_files(commits, keep_from, base, planned) if keep_from is not None else []
    referenced = {w.path for _, md in commits for w in md.writes}
    referenced |= {p for b in base for p in (b.path, *b.log_paths)}
    failed = failed_files(on_storage, instants, referenced)
    if logs is not None:
        failed += failed_log_files(
            logs.paths,
            instants,
            referenced,
            logs.marked,
            named_by_writer=logs.named_by_writer,
        )
    gone = set(replaced)
    return CleanPlan(keep_from, tuple(replaced), tuple(sorted(f for f in failed if f not in gone)))


@dataclass(frozen=True, slots=True)
class LogListing:
    """The log files of a merge-on-read table on storage, for the cleaner."""

    paths: tuple[str, ...]
    marked: set[str]
    """Files the markers of pending instants name (listed after `paths`)."""
    named_by_writer: bool
    """Table version 8: a log file's name carries the deltacommit that wrote it."""


def list_data_files(table: HudiTable) -> tuple[list[str], list[str]]:
    """Relative paths of every base file and every log file in the table's partitions."""
    base: list[str] = []
    logs: list[str] = []
    for partition in table.list_partitions_on_storage():
        for m in table.storage.list_folder(partition).objects:
            n = m.key.rsplit("/", 1)[-1]
            rel = f"{partition}/{n}" if partition else n
            if n.endswith(".parquet"):
                base.append(rel)
            elif is_log_file_name(n):
                logs.append(rel)
    return base, logs


def list_base_files(table: HudiTable) -> list[str]:
    """Relative paths of every base file in the table's partitions."""
    return list_data_files(table)[0]


def pending_compaction_plans(
    table: HudiTable,
) -> dict[InstantTime, tuple[CompactionOperation, ...]]:
    """The operations of every requested or inflight compaction, by instant time."""
    timeline = table.timeline()
    out: dict[InstantTime, tuple[CompactionOperation, ...]] = {}
    for inst in timeline.inflight_or_requested(Action.COMPACTION):
        key = timeline.key_of(inst.with_state(State.REQUESTED))
        out[inst.time] = read_compaction_plan(table.storage.read(key), f"{table.uri}/{key}")
    return out


def _log_listing(table: HudiTable, logs: list[str], timeline: Timeline) -> LogListing:
    marked: set[str] = set()
    for inst in timeline.inflight_or_requested():
        marked.update(list_marked_files(table.storage, inst.time))
    return LogListing(tuple(logs), marked, table.config.version >= 8)


_STRINGS = {"type": "array", "items": "string"}
_CLEAN_SCHEMA = fastavro.parse_schema(
    {
        "type": "record",
        "name": "HoodieCleanMetadata",
        "namespace": "org.apache.hudi.avro.model",
        "fields": [
            {"name": "startCleanTime", "type": "string"},
            {"name": "timeTakenInMillis", "type": "long"},
            {"name": "totalFilesDeleted", "type": "int"},
            {"name": "earliestCommitToRetain", "type": "string"},
            {
                "name": "partitionMetadata",
                "type": {
                    "type": "map",
                    "values": {
                        "type": "record",
                        "name": "HoodieCleanPartitionMetadata",
                        "fields": [
                            {"name": "partitionPath", "type": "string"},
                            {"name": "policy", "type": "string"},
                            {
                                "name": "deletePathPatterns",
                                "type": {"type": "array", "items": "string"},
                            },
                            {
                                "name": "successDeleteFiles",
                                "type": {"type": "array", "items": "string"},
                            },
                            {
                                "name": "failedDeleteFiles",
                                "type": {"type": "array", "items": "string"},
                            },
                        ],
                    },
                },
            },
            {"name": "version", "type": ["int", "null"], "default": 2},
        ],
    }
)


def clean_metadata_bytes(
    start: InstantTime, plan: CleanPlan, deleted: Sequence[str], failed: Sequence[str], took_ms: int
) -> bytes:
    def by_partition(paths: Iterable[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for p in paths:
            out.setdefault(p.rpartition("/")[0], []).append(p.rsplit("/", 1)[-1])
        return out

    ok, bad, planned = by_partition(deleted), by_partition(failed), by_partition(plan.files)
    record = {
        "startCleanTime": start.value,
        "timeTakenInMillis": took_ms,
        "totalFilesDeleted": len(deleted),
        "earliestCommitToRetain": plan.earliest_retained.value if plan.earliest_retained else "",
        "partitionMetadata": {
            p: {
                "partitionPath": p,
                "policy": "KEEP_LATEST_COMMITS",
                "deletePathPatterns": planned.get(p, []),
                "successDeleteFiles": ok.get(p, []),
                "failedDeleteFiles": bad.get(p, []),
            }
            for p in sorted(set(planned) | set(ok) | set(bad))
        },
        "version": 2,
    }
    buf = io.BytesIO()
    fastavro.writer(buf, _CLEAN_SCHEMA, [record], codec="null")
    return buf.getvalue()


def clean(
    table: HudiTable,
    control: CommitControl,
    policy: RetainPolicy | None = None,
    *,
    rollback_failed: bool = True,
) -> CleanResult:
    """Roll back failed writes, then plan (under the lock), delete and record a clean instant
    (a transaction). Nothing to delete: no instant is written."""
    policy = policy or RetainPolicy()
    rolled = tuple(rollback_failed_writes(table, control)) if rollback_failed else ()
    started = time.monotonic()
    tx = TableTransaction(
        HudiFormat(table), control, writer_id=control.writer_id, action=Action.CLEAN
    )
    with tx.locked():
        timeline = table.timeline()
        commits, base = active_commits_and_base(timeline)
        base_files, logs = list_data_files(table)
        merge_on_read = table.config.table_type == "MERGE_ON_READ"
        plan = plan_clean(
            commits,
            timeline.instants,
            base_files,
            policy,
            int(time.time() * 1000),
            base,
            # markers are listed after the files: a writer creates the marker first
            pending_compactions=pending_compaction_plans(table) if merge_on_read else None,
            logs=_log_listing(table, logs, timeline) if merge_on_read else None,
        )
        if plan.is_empty:
            return CleanResult(None, (), rolled, plan)
        t = tx.begin_locked()
    try:
        deleted: list[str] = []
        failed: list[str] = []
        for rel in plan.files:
            try:
                table.storage.delete(rel)
                deleted.append(rel)
            except (OSError, StorageError) as e:
                log.warning(
                    "table %s: clean %s could not delete %s: %s", table.config.name, t, rel, e
                )
                failed.append(rel)
        took = int((time.monotonic() - started) * 1000)
        # a clean that dies stays pending: lazy rollback abandons it (its deletes were garbage)
        done = tx.complete(clean_metadata_bytes(t, plan, deleted, failed, took))
    finally:
        tx.stop_heartbeat()
    log.info(
        "table %s: clean %s deleted %d files (%d replaced, %d of failed writes), keeping views "
        "from %s",
        table.config.name,
        t,
        len(deleted),
        len(plan.replaced),
        len(plan.failed),
        plan.earliest_retained,
    )
    return CleanResult(done if isinstance(done, Instant) else None, tuple(deleted), rolled, plan)
