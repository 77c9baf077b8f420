"""The format's half of a backfill (`lakesink backfill`), format-neutral: what the Spark job
(lakesink.spark.backfill) needs of a table to write source files into it as one commit of a
backfill writer, beside the streaming ingestion (seed 003).

The job reads the source files as the rows `rows_schema()` describes, writes them in Spark
tasks through the `TaskTarget` that `begin()` returns (the one `TaskWriter` of the streaming
path), and hands the tasks' statuses to `commit()`; on any failure it calls `abort()`. A
backfill is identified by its backfill id (a digest of the source files): a rerun with the same
files finds it committed (`already_committed()`) and writes nothing twice. The plugin opens one
(`FormatPlugin.open_backfill`); the commit goes through the engine's `TableTransaction` with the
requirement that the backfill id is not committed yet (lakesink.engine.requirements).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from lakesink.errors import InternalError
from lakesink.protocol.instant import InstantTime

if TYPE_CHECKING:
    import pyarrow as pa

    from lakesink.engine.transaction import TableTransaction
    from lakesink.formats.task import TaskTarget
    from lakesink.protocol.write_status import WriteStatus

MAX_SOURCES_RECORDED = 100
"""How many source files a backfill's commit names (`lakesink.backfill.source`)."""


@dataclass(frozen=True, slots=True)
class BackfillResult:
    """What one backfill did: the Hudi instant or the Iceberg snapshot it committed, neither
    when it had been committed before."""

    writer_id: str
    backfill_id: str
    instant_time: InstantTime | None
    records: int = 0
    files: int = 0
    snapshot_id: int | None = None

    @property
    def already_committed(self) -> bool:
        return self.instant_time is None and self.snapshot_id is None

    def to_json(self) -> dict[str, Any]:
        return {
            "writer_id": self.writer_id,
            "backfill_id": self.backfill_id,
            "instant_time": self.instant_time.value if self.instant_time else None,
            **({"snapshot_id": self.snapshot_id} if self.snapshot_id is not None else {}),
            "records": self.records,
            "files": self.files,
            "already_committed": self.already_committed,
        }


class Backfill(Protocol):
    """One backfill into one table, on the driver: check, begin, commit or abort."""

    @property
    def writer_id(self) -> str:
        """The backfill's writer (`backfill-<backfill id>` unless given)."""
        ...

    @property
    def backfill_id(self) -> str:
        """The digest of the source files."""
        ...

    def already_committed(self) -> bool:
        """Whether a commit of this backfill id is on the table (history included)."""
        ...

    def rows_schema(self) -> pa.Schema | None:
        """The table's data columns, which the source rows are read as (cast to, in this
        order); None for a table that holds no rows yet (the rows are taken as they are)."""
        ...

    def required_columns(self) -> tuple[str, ...]:
        """The top-level columns the tasks must write without nulls (the source relaxes them)."""
        ...

    def begin(self) -> TaskTarget:
        """Begin the backfill's transaction; where the tasks write (pickled into them)."""
        ...

    def commit(self, statuses: Sequence[WriteStatus]) -> BackfillResult:
        """Commit what the tasks wrote (`statuses`) as one commit of the backfill writer,
        unless the backfill landed meanwhile (then its files go and nothing is committed)."""
        ...

    def abort(self, error: BaseException) -> None:
        """The job failed with `error` after `begin`: roll back what was written (never the
        files of a commit that may have landed)."""
        ...


class TransactionBackfill:
    """What both formats' backfills share: the ids, and the one engine transaction that `begin`
    opens (`_tx`), which `abort` ends as a failed block does."""

    def __init__(self, *, writer_id: str, backfill_id: str) -> None:
        self._writer_id = writer_id
        self._backfill_id = backfill_id
        self._tx: TableTransaction | None = None

    @property
    def writer_id(self) -> str:
        return self._writer_id

    @property
    def backfill_id(self) -> str:
        return self._backfill_id

    def abort(self, error: BaseException) -> None:
        """As the transaction's block ends with `error`: rolled back unless it may have landed
        (the format checks the table first)."""
        if self._tx is not None:
            self._tx.__exit__(type(error), error, error.__traceback__)

    def _transaction(self) -> TableTransaction:
        if self._tx is None:
            raise InternalError(f"backfill {self._backfill_id}: commit before begin")
        return self._tx
