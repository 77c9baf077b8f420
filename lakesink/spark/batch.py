"""One micro-batch over the tables it writes, the tables committed concurrently.

A batch writes the main table's rows and, with `errors.deadletter.table`, the records that
failed to decode into the dead-letter table; a many-table ingestion (lakesink.spark.routing)
writes each routed table. Each table has its own coordinator and commits the batch's ranges
under its own writer's offsets requirement, so each is exactly once on its own, and the batch
runs the same steps over every table:

    begin every table's transaction (a table that committed these ranges already — a batch
    replayed after a crash between two tables' commits — begins none and is not written)
    → the writers (direct task path or DataFrame path) write every begun table's files
    → commit the first table (the dead letters, else the first by name) alone, then the
      others concurrently on a bounded pool of driver threads (`commit.tables.parallelism`):
      they are independent (own coordinator, lock, control, timeline and metrics view), and
      a commit waits on storage and the lock for much of its time, an object store's
      requests most of all

The crash points: `before-table-commits` (every table's files written, none committed),
`between-table-commits` (once per batch: the first table committed, no other table's commit
begun) and `after-table-commits` (every table committed). The first table goes alone so that
these points are deterministic; a crash while the others commit leaves each of them committed
or not, which is recovered the same way, per table: the replay finishes the tables that are not
and writes nothing twice.
A failure aborts the tables not committed (each failed one, unless durably pre-committed —
async mode: its committer or the next start publishes it — and those not started); the tables
that committed stay committed, and the first failure in commit order is raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed, wait
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
DEFAULT_PARALLELISM = 8  # commit.tables.parallelism


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

    def __init__(
        self,
        tables: Sequence[BatchTable],
        *,
        skip_committed: bool = False,
        parallelism: int = DEFAULT_PARALLELISM,
    ) -> None:
        """`parallelism` (commit.tables.parallelism): the most tables committing at once.
        `skip_committed` (many tables, lakesink.spark.routing): the source starts at the
        lowest offsets committed over the tables, so a table ahead of the others takes each
        range from its own committed position on (`ranges_of`)."""
        if not tables:
            raise ValueError("a batch writes at least one table")
        self.tables = tuple(tables)
        self.skip_committed = skip_committed
        if parallelism < 1:
            raise ValueError("commit.tables.parallelism is at least 1")
        self.parallelism = parallelism

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
        """Commit the begun tables: the first alone, then the others concurrently
        (`schema_of(role, statuses)`: the schema the table's commit records; `lost`: spans cut
        off the batch, recorded in the commits of the tables of rows); their outcomes by role.
        A failure aborts every table not committed (unless durably pre-committed), then the
        first in commit order is raised."""
        several = len(self.tables) > 1
        if several:
            crash_point("before-table-commits")
        begun = [t for t in self.tables if instants.get(t.role) is not None]
        outcomes: dict[str, BatchOutcome] = {}
        try:
            work = [
                (table, self._commit_call(table, batch_id, ranges, instants, statuses, lost))
                for table in begun
            ]
            # the schemas first, in this thread (they may ask Spark for the rows' schema)
            schemas = {t.role: schema_of(t.role, statuses.get(t.role, ())) for t in begun}
        except BaseException:
            self.abort(batch_id, instants)
            raise
        if instants.get(self.tables[0].role) is not None:
            try:
                self._run_commits(batch_id, instants, work[:1], schemas, outcomes, 1)
            except BaseException:  # the first table is aborted (unless durable); the others
                self.abort(batch_id, {t.role: instants[t.role] for t, _ in work[1:]})
                raise
            work = work[1:]
        if several:
            crash_point("between-table-commits")
        self._run_commits(batch_id, instants, work, schemas, outcomes, self.parallelism)
        if several:
            crash_point("after-table-commits")
        return outcomes

    def _commit_call(
        self,
        table: BatchTable,
        batch_id: int,
        ranges: Sequence[OffsetRange],
        instants: Instants,
        statuses: Mapping[str, Sequence[WriteStatus]],
        lost: Sequence[OffsetRange],
    ) -> Callable[[TableSchema], BatchOutcome]:
        instant = instants[table.role]
        assert instant is not None
        written = statuses.get(table.role, ())
        mine = self.ranges_of(table, ranges)
        spans = lost if table.role != DEAD_LETTERS else ()
        return lambda schema: self._commit_one(
            table, instant, batch_id, mine, written, schema, spans
        )

    def _run_commits(
        self,
        batch_id: int,
        instants: Instants,
        work: Sequence[tuple[BatchTable, Callable[[TableSchema], BatchOutcome]]],
        schemas: Mapping[str, TableSchema],
        outcomes: dict[str, BatchOutcome],
        parallelism: int,
    ) -> None:
        """Run the tables' commits, at most `parallelism` at once, into `outcomes`. If any
        fails, the ones not started are not started; once the running ones are over, every
        table of `work` that did not commit is aborted (a failed one unless durably
        pre-committed), and the first failure in commit order is raised."""
        if not work:
            return
        failures: dict[str, BaseException] = {}
        if parallelism <= 1 or len(work) == 1:
            for table, call in work:
                try:
                    outcomes[table.role] = call(schemas[table.role])
                except BaseException as e:
                    failures[table.role] = e
                    break
        else:
            self._run_pooled(work, schemas, outcomes, failures, parallelism)
        if not failures:
            return
        undone = {}
        for table, _ in work:
            instant = instants.get(table.role)
            if table.role in outcomes or instant is None:
                continue
            # durable in the pending store: its committer or the next start publishes it
            if table.role in failures and table.coordinator.is_precommitted(instant):
                continue
            undone[table.role] = instant
        first, *others = failures.items()
        for role, error in others:
            log.error("batch %s: table %s failed to commit too: %s", batch_id, role, error)
        self.abort(batch_id, undone)
        raise first[1]

    @staticmethod
    def _run_pooled(
        work: Sequence[tuple[BatchTable, Callable[[TableSchema], BatchOutcome]]],
        schemas: Mapping[str, TableSchema],
        outcomes: dict[str, BatchOutcome],
        failures: dict[str, BaseException],
        parallelism: int,
    ) -> None:
        """The commits on a pool of driver threads; `failures` in commit order."""
        order = {table.role: at for at, (table, _) in enumerate(work)}
        failed: dict[str, BaseException] = {}
        with ThreadPoolExecutor(
            max_workers=min(parallelism, len(work)), thread_name_prefix="lakesink-commit"
        ) as pool:
            futures = {pool.submit(call, schemas[t.role]): t.role for t, call in work}
            try:
                for future in as_completed(futures):
                    if not future.cancelled():
                        _take(future, futures[future], outcomes, failed, futures)
            except BaseException as e:  # in this thread (an interrupt): start no more
                for f in futures:
                    f.cancel()
                failed[""] = e
                wait(futures)
                for future, role in futures.items():
                    if not future.cancelled() and role not in outcomes and role not in failed:
                        _take(future, role, outcomes, failed, ())
        for role in sorted(failed, key=lambda r: order.get(r, -1)):
            failures[role] = failed[role]

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


def _take(
    future: Future[BatchOutcome],
    role: str,
    outcomes: dict[str, BatchOutcome],
    failed: dict[str, BaseException],
    others: Iterable[Future[BatchOutcome]],
) -> None:
    """A finished commit's outcome or failure; the first failure cancels the commits of
    `others` not started."""
    e = future.exception()
    if e is None:
        outcomes[role] = future.result()
        return
    if not failed:
        for f in others:
            f.cancel()
    failed[role] = e


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
