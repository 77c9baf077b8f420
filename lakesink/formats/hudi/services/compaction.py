"""Compaction of a merge-on-read table: each file slice with log files is merged (base file and
logs, as every reader merges them: `merge_slice`) into a new base file of the same file group at
the compaction's instant, as Hudi's compaction does.

The instant moves `compaction.requested` (the Avro plan, `compaction_plan`) → `compaction.inflight`
→ a completed `commit` at the same instant time, whose write stats are the new base files. Until
that commit, readers read the planned slices as before (base + logs): the view is built from
completed instants only. A pending compaction is always executed, never rolled back (Hudi's
rule): its plan is executed again from the start by a new attempt.

Each execution attempt writes under its own write token (`<slice>-0-<random attempt id>`, Hudi's
`<partitionId>-<stageId>-<attemptId>` shape), so two attempts never write the same file name.
Before it deletes an earlier attempt's files of a slice (never visible: no commit names them)
and before it writes the slice, an attempt renews and checks its lease and checks that the
compaction is still pending: an attempt that stalled past its lease while another executed and
published the compaction stops there, touching nothing the commit names. (A stall longer than the
lease between that check and the next storage call is the limit every lease has.)

Deltacommits and compaction: a log file joins the latest slice whose base instant is at or
before the instant its name carries (the deltacommit's in table version 8, the slice's base
instant in 6). A deltacommit begun before the compaction's instant would name an instant before
it and its logs would stay behind in the old slice, so a compaction is scheduled only under the
table lock with no deltacommit pending, and the whole compaction holds the lock: a deltacommit
begins after it completed, over the new slices. A compaction left pending by a crash is executed
by the next writer to begin an instant, under the lock, before it begins
(`HudiFormat.next_instant_time`), so no deltacommit ever overlaps a pending compaction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from lakesink.engine.schema import TableSchema
from lakesink.errors import CorruptTableError, LakesinkError, UnsupportedTableError
from lakesink.faults import crash_point
from lakesink.formats.hudi.control import SERVICES_WRITER_ID, CommitControl
from lakesink.formats.hudi.table.compaction_plan import (
    CompactionOperation,
    compaction_plan_bytes,
    read_compaction_plan,
)
from lakesink.formats.hudi.table.files import write_token
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.merge_on_read import merge_slice
from lakesink.formats.hudi.table.metadata import COMPACT_OPERATION, CommitMetadata
from lakesink.formats.hudi.table.view import FileSystemView
from lakesink.formats.hudi.table.writer import BaseFileWriter
from lakesink.formats.hudi.writer_state import WRITER_ID_KEY
from lakesink.protocol.instant import Action, Instant, InstantTime, State
from lakesink.protocol.write_status import FileWrite
from lakesink.storage import ObjectExistsError

log = logging.getLogger(__name__)

_ONE_FILE = 1 << 62  # a compacted slice is one base file, whatever its size


class _Superseded(LakesinkError):
    """The compaction this attempt executes was completed by another attempt."""


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """What one compaction did (instant None: nothing to compact, a deltacommit pending, or
    another executor completed it first)."""

    instant: Instant | None
    file_groups: int = 0
    rows: int = 0
    reason: str = ""


def _require_merge_on_read(table: HudiTable) -> None:
    if table.config.table_type != "MERGE_ON_READ":
        raise UnsupportedTableError(
            f"table {table.uri} is {table.config.table_type}: only merge-on-read tables have "
            "log files to compact"
        )


def pending_compactions(table: HudiTable) -> tuple[InstantTime, ...]:
    """The instant times of the compactions requested or inflight, oldest first."""
    return tuple(i.time for i in table.timeline().inflight_or_requested(Action.COMPACTION))


def plan_operations(table: HudiTable) -> tuple[CompactionOperation, ...]:
    """One operation per latest file slice with log files (what a compaction now would merge)."""
    out = []
    for s in FileSystemView(table).latest_base_files():
        if not s.log_paths:
            continue
        out.append(
            CompactionOperation(
                s.partition_path,
                s.file_id,
                s.instant_time,
                s.base_file_name if s.has_base_file else "",
                tuple(p.rsplit("/", 1)[-1] for p in s.log_paths),
            )
        )
    return tuple(out)


def _schedule_locked(
    table: HudiTable, control: CommitControl, crash: Callable[[str], None]
) -> InstantTime | str:
    """Under the lock: the instant of the requested compaction, or why none was scheduled."""
    timeline = table.timeline()
    if timeline.inflight_or_requested(Action.DELTA_COMMIT):
        return "a deltacommit is pending: its log files must land before a compaction plans"
    operations = plan_operations(table)
    if not operations:
        return "no file slice has log files"
    t = control.next_instant_time(table, timeline)
    # Hudi 1.x readers of version 8 place a log file in the slice by its deltacommit's
    # completion time: the compaction's time must follow every completion (a skewed clock)
    done = [c for i in timeline.instants if (c := i.completion_time) is not None]
    if done and t <= max(done):
        t = InstantTime.from_epoch_ms(max(done).to_epoch_ms() + 1)
    requested = Instant(t, Action.COMPACTION, State.REQUESTED)
    table.storage.create(
        timeline.key_of(requested),
        compaction_plan_bytes(operations, {"lakesink.compaction": "true"}),
    )
    log.info(
        "table %s: scheduled compaction %s of %d file slices", table.config.name, t, len(operations)
    )
    crash("compaction-requested")
    return t


def _execute_locked(
    table: HudiTable, control: CommitControl, t: InstantTime, crash: Callable[[str], None]
) -> CompactionResult:
    """Under the lock: execute the pending compaction `t` from its plan and complete it."""
    timeline = table.timeline()
    current = timeline.get(t)
    if current is None or current.action is not Action.COMPACTION or current.is_completed:
        raise CorruptTableError(f"table {table.uri}: {t} is not a pending compaction")
    requested = Instant(t, Action.COMPACTION, State.REQUESTED)
    key = timeline.key_of(requested)
    operations = read_compaction_plan(table.storage.read(key), f"{table.uri}/{key}")
    if current.state is State.REQUESTED:
        with contextlib.suppress(ObjectExistsError):  # a crash right after it was written
            table.storage.create(timeline.key_of(current.with_state(State.INFLIGHT)), b"")
    crash("compaction-inflight")
    attempt = secrets.randbits(31)  # this attempt's files: no other attempt writes the names
    writes: list[FileWrite] = []
    rows = 0
    schema = ""
    try:
        for n, op in enumerate(operations):
            write, count, avro = _compact_slice(table, control, t, op, write_token(n, 0, attempt))
            writes.append(write)
            rows += count
            schema = schema or avro
            crash("compaction-slice-written")
        crash("compaction-written")
        _check_still_ours(table, control, t)  # LockError if the lease was lost: nothing published
    except _Superseded as e:
        log.warning("table %s: %s", table.config.name, e)
        return CompactionResult(None, reason=str(e))
    metadata = CommitMetadata(
        operation_type=COMPACT_OPERATION,
        writes=tuple(writes),
        schema=TableSchema.from_text(schema or (table.timeline().latest_schema() or "")),
        extra={WRITER_ID_KEY: SERVICES_WRITER_ID},
    )
    done = table.timeline().publish(Instant(t, Action.COMMIT, State.INFLIGHT), metadata)
    log.info(
        "table %s: compaction %s merged %d file slices (%d rows)",
        table.config.name,
        t,
        len(operations),
        rows,
    )
    return CompactionResult(done, len(operations), rows)


def _check_still_ours(table: HudiTable, control: CommitControl, t: InstantTime) -> None:
    """Before touching the table: LockError if this attempt's lease is lost (renewing it, so the
    holding outlasts the next step); `_Superseded` if `t` is no longer pending."""
    control.renew_lock()
    control.check_alive(table, t)
    current = table.timeline().get(t)
    if current is None or current.is_completed or current.action is not Action.COMPACTION:
        raise _Superseded(
            f"compaction {t} was completed by another executor; this attempt stops untouched"
        )


def _compact_slice(
    table: HudiTable, control: CommitControl, t: InstantTime, op: CompactionOperation, token: str
) -> tuple[FileWrite, int, str]:
    """The new base file of one planned slice: its rows as readers read them, with their
    commit times and sequence numbers kept (an incremental reader does not read them again)."""
    base: pa.Table | None = None
    if op.base_file:
        fs, root = table.storage.arrow()
        base = pq.read_table(
            f"{root}/{op.relative(op.base_file)}", filesystem=fs, partitioning=None
        )
    merged = merge_slice(table, base, [op.relative(name) for name in op.log_files])
    # an earlier attempt's file (a crash before the commit): never visible while t is pending,
    # and only deleted while it is (a completed t names its files: they are never touched)
    stale = [
        op.relative(name)
        for name in table.storage.list_names(op.partition_path)
        if name.startswith(f"{op.file_id}_") and name.endswith(f"_{t.value}.parquet")
    ]
    if stale:
        _check_still_ours(table, control, t)
        table.storage.delete_many(stale)
    _check_still_ours(table, control, t)
    writer = BaseFileWriter(
        table,
        op.partition_path,
        t,
        token,
        target_file_size_bytes=_ONE_FILE,
        preserve_commit_time=True,
        file_id_factory=lambda: op.file_id,
    )
    if merged.num_rows:
        writer.write(merged)
    else:  # every row deleted: an empty base file ends the group's older slices
        writer.write_empty(merged.schema)
    (write,) = writer.close()
    prev = op.base_instant.value if op.base_file else "null"
    return dataclasses.replace(write, prev_commit=prev), merged.num_rows, writer.avro_schema or ""


def compact(
    table: HudiTable,
    control: CommitControl,
    *,
    crash: Callable[[str], None] = crash_point,
) -> CompactionResult:
    """Under the table lock: execute the pending compactions, or schedule and execute one."""
    _require_merge_on_read(table)
    with control.locked(table):
        pending = pending_compactions(table)
        if pending:
            results = [_execute_locked(table, control, t, crash) for t in pending]
            return results[-1]
        scheduled = _schedule_locked(table, control, crash)
        if isinstance(scheduled, str):
            log.info("table %s: no compaction: %s", table.config.name, scheduled)
            return CompactionResult(None, reason=scheduled)
        return _execute_locked(table, control, scheduled, crash)


def complete_pending_compactions(
    table: HudiTable, control: CommitControl, *, crash: Callable[[str], None] = crash_point
) -> list[CompactionResult]:
    """Execute every compaction a crash left pending (none: one listing, no lock)."""
    if table.config.table_type != "MERGE_ON_READ" or not pending_compactions(table):
        return []
    with control.locked(table):
        return finish_compactions_locked(table, control, crash=crash)


def finish_compactions_locked(
    table: HudiTable, control: CommitControl, *, crash: Callable[[str], None] = crash_point
) -> list[CompactionResult]:
    """With the table lock held: execute every pending compaction (a writer does before it
    begins an instant, `HudiFormat.next_instant_time`)."""
    return [_execute_locked(table, control, t, crash) for t in pending_compactions(table)]


def deltacommits_since_compaction(table: HudiTable) -> int:
    """Completed deltacommits after the last completed commit (on a merge-on-read table every
    commit is a compaction's)."""
    timeline = table.timeline()
    last = timeline.last_completed(Action.COMMIT)
    return sum(
        1 for i in timeline.completed(Action.DELTA_COMMIT) if last is None or i.time > last.time
    )
