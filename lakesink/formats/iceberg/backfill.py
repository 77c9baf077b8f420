"""The Iceberg half of a backfill (lakesink.formats.backfill): one snapshot of a backfill writer,
beside the streaming ingestion.

The writer id is `backfill-<id>` (or the one given) and the snapshot's commit id is the
backfill id, a digest of the source files; the summary also carries `lakesink.backfill-id` and
`lakesink.backfill-source`. The append is one `TableTransaction` over the table's
`IcebergFormat`, requiring that no snapshot of the same backfill is on the table: a rerun finds
it first and appends nothing, a run of the same writer that landed meanwhile is recognised as
the commit already on the table (its files go), another writer's run of it fails the
requirement (its files go too). Tasks write data files with the table's field ids, the rows
cast to the table's Arrow schema first; files of failed task attempts are in no status and stay
unreferenced until `remove-orphan-files`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from lakesink.engine import writer_state as keys
from lakesink.engine.change import TableChange
from lakesink.engine.requirements import BackfillNotCommitted
from lakesink.engine.transaction import TableTransaction
from lakesink.errors import CommitError, ConfigError
from lakesink.formats.backfill import MAX_SOURCES_RECORDED, BackfillResult, TransactionBackfill
from lakesink.formats.iceberg.coordinator import CatalogControl
from lakesink.formats.iceberg.datafiles import FILES_KEY, DataFileDescription, IcebergTarget
from lakesink.formats.iceberg.format import IcebergFormat, open_iceberg_table
from lakesink.formats.iceberg.snapshots import (
    KEY_BACKFILL_ID,
    KEY_BACKFILL_SOURCE,
    AppendRequirement,
)
from lakesink.formats.iceberg.table import AppendResult, CommitOutcome, IcebergTable
from lakesink.settings import Settings

if TYPE_CHECKING:
    from lakesink.formats.task import TableWriter, TaskAttempt
    from lakesink.protocol.instant import Action, InstantTime
    from lakesink.protocol.write_status import FileWrite, WriteStatus

log = logging.getLogger(__name__)


def catalog_settings(table: str, settings: Settings | None) -> Settings:
    """`settings`, when they configure an Iceberg table (its catalog); ConfigError otherwise:
    the path alone does not say which catalog commits to the table at `table`."""
    if settings is None or settings.table.format != "iceberg":
        raise ConfigError(
            f"backfill: {table} is an Iceberg table; give the configuration of its catalog "
            "(--config with table.format=iceberg, --table the warehouse)"
        )
    return settings


@dataclass(frozen=True, slots=True)
class TableRowsTarget:
    """An `IcebergTarget` whose writers first cast the rows to the table's Arrow schema: Spark
    reads the source files with every nested field nullable, the cast restores the table's
    required fields (and fails naming the field when one holds a null)."""

    target: IcebergTarget
    schema: pa.Schema

    @property
    def instant_time(self) -> str:
        return self.target.instant_time

    def open(self, attempt: TaskAttempt) -> TableWriter:
        return _CastingWriter(self.target.open(attempt), self.schema)


class _CastingWriter:
    def __init__(self, writer: TableWriter, schema: pa.Schema) -> None:
        self.writer = writer
        self.schema = schema

    def write(self, batch: pa.RecordBatch) -> None:
        self.writer.write(batch if batch.schema == self.schema else batch.cast(self.schema))

    def close(self) -> tuple[list[FileWrite], dict[str, object]]:
        return self.writer.close()


class BackfillAppendFormat(IcebergFormat):
    """The table as a backfill's transaction commits to it: its one append has the backfill id
    as its commit id, so "published" means that the writer's newest commit is this backfill."""

    def __init__(self, table: IcebergTable, writer_id: str, backfill_id: str) -> None:
        super().__init__(table)
        self.backfill_writer = writer_id
        self.backfill_id = backfill_id
        self.appended: AppendResult | None = None  # what the append did, once it returned

    def is_published(self, instant_time: InstantTime, commit_id: str = "") -> bool:
        # the backfill id is this append's commit id, whatever the engine's `commit_id`
        last = self.table.last_commit(self.backfill_writer)
        return last is not None and last.commit_id == self.backfill_id

    def publish(
        self, action: Action, instant_time: InstantTime, change: TableChange
    ) -> AppendResult:
        """One fast append with the backfill's summary keys. An append that finds this
        backfill landed before it was sent (a run of the same writer) deletes its own files
        and fails; one that finds it landed after an attempt of its own went out (a lost
        response) is that attempt, and keeps them."""
        files = self.files(instant_time)
        result = self.table.commit_append(
            files,
            AppendRequirement(self.backfill_writer, self.backfill_id, ()),
            extra_summary={
                KEY_BACKFILL_ID: self.backfill_id,
                KEY_BACKFILL_SOURCE: change.extra.get(keys.BACKFILL_SOURCE_KEY, "[]"),
            },
        )
        if result.outcome is not CommitOutcome.COMMITTED and result.attempts == 1:
            self.table.abort(files)
            raise CommitError(
                f"backfill {self.backfill_id} was committed concurrently by another run"
            )
        self.appended = result
        return result


class IcebergBackfill(TransactionBackfill):
    """A backfill into the Iceberg table of a configuration."""

    def __init__(
        self, table: IcebergTable, *, writer_id: str, backfill_id: str, sources: Sequence[str]
    ) -> None:
        self.table = table
        super().__init__(writer_id=writer_id, backfill_id=backfill_id)
        self.sources = tuple(sources)
        self.format = BackfillAppendFormat(table, writer_id, backfill_id)

    @classmethod
    def open(
        cls,
        settings: Settings | None,
        table: str,
        *,
        writer_id: str | None,
        backfill_id: str,
        sources: Sequence[str],
    ) -> IcebergBackfill:
        """The backfill into the table of `settings` (`table`: its warehouse, as table.path).
        A table of keys is refused: a backfill appends, which would duplicate its keys."""
        from lakesink.formats.iceberg.keyed import layout_of

        opened = open_iceberg_table(catalog_settings(table, settings), create=False)
        if layout_of(opened.pyiceberg.metadata, opened.name) is not None:
            raise ConfigError(
                f"Iceberg table {opened.name} is a table of keys (write.operation upsert or "
                "cdc): a backfill appends its rows, which would duplicate keys; backfill into "
                "a table of keys is not available"
            )
        return cls(
            opened,
            writer_id=writer_id or f"backfill-{backfill_id}",
            backfill_id=backfill_id,
            sources=sources,
        )

    def already_committed(self) -> bool:
        """Whether a retained snapshot carries this backfill id."""
        earlier = self.table.backfill_snapshot(self._backfill_id)
        if earlier is not None:
            log.info(
                "table %s: backfill %s was committed before (snapshot %s)",
                self.table.name, self._backfill_id, earlier,
            )  # fmt: skip
        return earlier is not None

    def rows_schema(self) -> pa.Schema:
        """The table's schema: the tasks write exactly its columns and types."""
        return self.table.schema()

    def required_columns(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.table.schema() if not f.nullable)

    def begin(self) -> TableRowsTarget:
        self._tx = TableTransaction(
            self.format, CatalogControl(self._writer_id), writer_id=self._writer_id
        )
        t = self._tx.begin()
        target = IcebergTarget(self.table.write_context(), t.value)
        return TableRowsTarget(target, self.rows_schema())

    def commit(self, statuses: Sequence[WriteStatus]) -> BackfillResult:
        tx = self._transaction()
        t = tx.instant_time
        described = [
            DataFileDescription.from_json(d) for s in statuses for d in s.extra.get(FILES_KEY, ())
        ]
        self.format.add_files(t, described)
        writes = tuple(f for s in statuses for f in s.files)
        tx.stage({w.path for w in writes})
        change = TableChange(
            "INSERT",
            writes,
            extra={
                keys.WRITER_ID_KEY: self._writer_id,
                keys.COMMIT_ID_KEY: self._backfill_id,
                keys.BACKFILL_ID_KEY: self._backfill_id,
                keys.BACKFILL_SOURCE_KEY: json.dumps(list(self.sources[:MAX_SOURCES_RECORDED])),
            },
        )
        done = tx.commit(change, (BackfillNotCommitted(self._backfill_id),))
        if not done.published:  # a run of the same writer landed first: ours is unreferenced
            self.table.abort(self.format.files(t))
            self.format.finish(t)
            log.info(
                "table %s: backfill %s landed earlier; nothing appended",
                self.table.name, self._backfill_id,
            )  # fmt: skip
            return BackfillResult(self._writer_id, self._backfill_id, None)
        appended = self.format.appended  # None: an unknown outcome the table showed landed
        snapshot = (
            appended.snapshot_id
            if appended is not None
            else self.table.backfill_snapshot(self._backfill_id)
        )
        records = sum(d.record_count for d in described)
        log.info(
            "table %s: backfill %s committed snapshot %s (%d records, %d files)",
            self.table.name, self._backfill_id, snapshot, records, len(described),
        )  # fmt: skip
        return BackfillResult(
            self._writer_id, self._backfill_id, None, records, len(described), snapshot
        )


if TYPE_CHECKING:  # mypy proves the Iceberg side implements the format-neutral backfill
    from lakesink.formats.backfill import Backfill

    _BACKFILL: type[Backfill] = IcebergBackfill
