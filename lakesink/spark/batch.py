"""One micro-batch over the tables it writes, committed in a fixed order.

A batch writes the main table's rows and, with `errors.deadletter.table`, the records that
failed to decode into the dead-letter table. Each table has its own coordinator and commits
the batch's ranges under its own writer's offsets requirement, so each is exactly once on
its own, and the batch runs the same steps over every table:

    begin every table's transaction (a table that committed these ranges already — a batch
    replayed after a crash between two tables' commits — begins none and is not written)
    → the writers (direct task path or DataFrame path) write every begun table's files
    → commit the tables one after another, in their order (dead letters first)

A crash before the first commit, between two commits or after the last leaves every table
either committed or not; the replay finishes the tables that are not and writes nothing twice
(the crash points `before-table-commits`, `between-table-commits`, `after-table-commits`).
A failure aborts the tables not committed yet, except one durably pre-committed (async mode:
its committer or the next start publishes it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from lakesink.engine.async_commit import AsyncCommitter
from lakesink.engine.coordinator import BatchOutcome, Coordinator
from lakesink.engine.schema import TableSchema
from lakesink.faults import crash_point
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.offsets import OffsetRange, WriterOffsets
from lakesink.protocol.write_status import WriteStatus

log = logging.getLogger(__name__)

ROWS = "rows"  # the main table
DEAD_LETTERS = "dead_letters"  # errors.deadletter.table


@dataclass(frozen=True, slots=True)
class BatchTable:
    """A table every batch writes: its role in the batch, its coordinator, and the async
    committer that publishes its commits (None: the batch commits it itself)."""

    role: str
    coordinator: Coordinator
    committer: AsyncCommitter | None = None


Instants = Mapping[str, InstantTime | None]
"""The instant each table's transaction began for a batch, by role (None: none begun)."""


class BatchTables:
    """The tables of an ingestion, in commit order, and the steps of one batch over them."""

    def __init__(self, tables: Sequence[BatchTable], *, skip_committed: bool = False) -> None:
        """`skip_committed` (many tables, lakesink.spark.routing): the source starts at the
        lowest offsets committed over the tables, so a table ahead of the others takes each
        range from its own committed position on (`ranges_of`)."""
        if not tables:
            raise ValueError("a batch writes at least one table")
        self.tables = tuple(tables)
        self.skip_committed = skip_committed

    def ranges_of(self, table: BatchTable, ranges: Sequence[OffsetRange]) -> list[OffsetRange]:
        """The batch's ranges as `table` commits them: all of them; with `skip_committed`,
        less what the table committed already (a range wholly below its position dropped,
        one it is inside of starting there)."""
        if not self.skip_committed:
            return list(ranges)
        return ranges_after(table.coordinator.committed, ranges)

    def __getitem__(self, role: str) -> BatchTable:
        return next(t for t in self.tables if t.role == role)

    def __contains__(self, role: object) -> bool:
        return any(t.role == role for t in self.tables)

    def begin(self, batch_id: int, ranges: Sequence[OffsetRange]) -> dict[str, InstantTime | None]:
        """Begin every table's transaction for the batch; a table that has the batch's ranges
        committed already (or nothing to commit) gets None. If a begin fails, the ones begun
        before it are aborted."""
        instants: dict[str, InstantTime | None] = {}
        try:
            for table in self.tables:
                instants[table.role] = table.coordinator.begin_batch(
                    batch_id, self.ranges_of(table, ranges)
                )
        except BaseException:
            self.abort(batch_id, instants)
            raise
        if any(instants.values()):
            for table in self.tables:
                if instants[table.role] is None:
                    log.info(
                        "table %s writer %s: batch %s is committed there already (before a "
                        "restart): its records for that table are not written again",
                        table.coordinator.name,
                        table.coordinator.writer_id,
                        batch_id,
                    )
        return instants

    def commit(
        self,
        batch_id: int,
        ranges: Sequence[OffsetRange],
        instants: Instants,
        statuses: Mapping[str, Sequence[WriteStatus]],
        schema_of: Callable[[str, Sequence[WriteStatus]], TableSchema],
        *,
        lost: Sequence[OffsetRange] = (),
    ) -> dict[str, BatchOutcome]:
        """Commit the begun tables in order (`schema_of(role, statuses)`: the schema the
        table's commit records; `lost`: spans cut off the batch, recorded in the commits of
        the tables of rows); their outcomes by role. A failure aborts the table that failed
        (unless it is durably pre-committed) and the ones after it, then is raised."""
        several = len(self.tables) > 1
        if several:
            crash_point("before-table-commits")
        outcomes: dict[str, BatchOutcome] = {}
        for at, table in enumerate(self.tables):
            if at:
                crash_point("between-table-commits")
            instant = instants.get(table.role)
            if instant is None:
                continue
            written = statuses.get(table.role, ())
            try:
                outcomes[table.role] = self._commit_one(
                    table,
                    instant,
                    batch_id,
                    self.ranges_of(table, ranges),
                    written,
                    schema_of(table.role, written),
                    lost if table.role != DEAD_LETTERS else (),
                )
            except BaseException:
                # durable in the pending store: its committer or the next start publishes it
                durable = table.coordinator.is_precommitted(instant)
                undone = self.tables[at + 1 :] if durable else self.tables[at:]
                self.abort(batch_id, {t.role: instants.get(t.role) for t in undone})
                raise
        if several:
            crash_point("after-table-commits")
        return outcomes

    @staticmethod
    def _commit_one(
        table: BatchTable,
        instant: InstantTime,
        batch_id: int,
        ranges: Sequence[OffsetRange],
        statuses: Sequence[WriteStatus],
        schema: TableSchema,
        lost: Sequence[OffsetRange],
    ) -> BatchOutcome:
        coordinator = table.coordinator
        if table.committer is None:
            return coordinator.complete_batch(
                instant, batch_id, ranges, statuses, schema, lost=lost
            )
        prepared = coordinator.precommit(instant, batch_id, ranges, statuses, schema, lost=lost)
        return table.committer.submit(prepared)

    def abort(self, batch_id: int, instants: Instants) -> None:
        """Roll back the tables' begun instants (best effort: recovery at the next start
        repeats what fails here)."""
        for table in self.tables:
            instant = instants.get(table.role)
            if instant is not None:
                abort_instant(table.coordinator, instant, batch_id)


def abort_instant(coordinator: Coordinator, instant: InstantTime, batch_id: int) -> None:
    """Roll back one table's instant of a failed batch (best effort)."""
    # The failure itself reaches the caller (the driver re-raises it); its traceback here
    # only with debug logging, so the command line shows one line for it.
    log.info(
        "table %s writer %s: batch %s failed; rolling back instant %s",
        coordinator.name,
        coordinator.writer_id,
        batch_id,
        instant,
        exc_info=log.isEnabledFor(logging.DEBUG),
    )
    try:
        coordinator.abort(instant)
    except Exception:  # recovery at the next start rolls it back
        log.exception("rollback of %s failed; the next start will retry it", instant)


def ranges_after(committed: WriterOffsets, ranges: Sequence[OffsetRange]) -> list[OffsetRange]:
    """`ranges` less the offsets below each partition's committed position."""
    out = []
    for r in ranges:
        position = committed.get(r.partition)
        if position is None or position <= r.start:
            out.append(r)
        elif position < r.end:
            out.append(OffsetRange(r.partition, position, r.end))
    return out
