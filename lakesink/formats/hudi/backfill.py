"""The Hudi half of a backfill (lakesink.formats.backfill): one more writer of the table.

Its own writer id (`backfill-<id>`), its own instant begun under the table lock with a
heartbeat, tasks writing base files with markers, the markers reconciled before publishing
(files of failed task attempts are deleted), the conflict check and the publish under the lock,
and commit metadata naming the writer and the backfill (`lakesink.backfill.id`, a digest of the
source files: a rerun commits nothing twice, also once the commit was archived).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from lakesink.engine.requirements import BackfillNotCommitted, NoConflicts, WriterStillLive
from lakesink.engine.schema import TableSchema
from lakesink.engine.transaction import TableTransaction
from lakesink.errors import InternalError
from lakesink.formats.backfill import MAX_SOURCES_RECORDED, BackfillResult, TransactionBackfill
from lakesink.formats.hudi import writer_state as keys
from lakesink.formats.hudi.conflicts import file_groups_of_paths
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.format import HudiFormat
from lakesink.formats.hudi.services.lazy_rollback import rollback_failed_writes
from lakesink.formats.hudi.table.avro_schema import META_COLUMNS
from lakesink.formats.hudi.table.evolution import commit_schema_text
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.view import FileSystemView
from lakesink.formats.hudi.table.writer import DEFAULT_TARGET_FILE_SIZE, HudiTaskTarget
from lakesink.protocol.conflicts import (
    ConflictStrategy,
    FileGroupOverlap,
    Operation,
    OperationKind,
    Phase,
    strategy_named,
)
from lakesink.settings import Settings

if TYPE_CHECKING:
    import pyarrow as pa

    from lakesink.protocol.write_status import WriteStatus

log = logging.getLogger(__name__)


class HudiBackfill(TransactionBackfill):
    """A backfill into the Hudi table `table` under `control` (its lock and heartbeat)."""

    def __init__(
        self,
        table: HudiTable,
        control: CommitControl,
        *,
        writer_id: str,
        backfill_id: str,
        sources: Sequence[str],
        target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
        strategy: ConflictStrategy | None = None,
    ) -> None:
        self.table = table
        self.control = control
        super().__init__(writer_id=writer_id, backfill_id=backfill_id)
        self.sources = tuple(sources)
        self.target_file_size = target_file_size
        self.strategy = strategy or FileGroupOverlap()

    @classmethod
    def open(
        cls,
        settings: Settings | None,
        table_path: str,
        control: object,
        *,
        writer_id: str | None,
        backfill_id: str,
        sources: Sequence[str],
    ) -> HudiBackfill:
        """The backfill into the table at `table_path`, with the storage options, the target
        file size and the conflict rules of `settings` (defaults without them)."""
        if not isinstance(control, CommitControl):
            raise InternalError(
                f"a backfill into a Hudi table needs Hudi's commit control (the plugin's "
                f"backfill_control), not {control!r}"
            )
        writer = writer_id or f"backfill-{backfill_id}"
        if settings is None:
            return cls(
                HudiTable.open(table_path),
                control,
                writer_id=writer,
                backfill_id=backfill_id,
                sources=sources,
            )
        return cls(
            HudiTable.open(settings.storage_for(table_path)),
            control,
            writer_id=writer,
            backfill_id=backfill_id,
            sources=sources,
            target_file_size=settings.table.target_file_size_bytes,
            strategy=strategy_named(settings.services.conflict_strategy),
        )

    def already_committed(self) -> bool:
        """Looked up in the active timeline and in the archive's backfill index."""
        return keys.backfill_committed(self.table, self._backfill_id)

    def rows_schema(self) -> pa.Schema | None:
        """The data columns of one of the table's latest base files."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        files = FileSystemView(self.table).latest_base_files()
        if not files:
            return None
        fs, root = self.table.storage.arrow()
        schema = pq.read_schema(f"{root}/{files[-1].path}", filesystem=fs)
        return pa.schema([f for f in schema if f.name not in META_COLUMNS])

    def required_columns(self) -> tuple[str, ...]:
        """None: the base files take the rows as Spark read them."""
        return ()

    def begin(self) -> HudiTaskTarget:
        """Roll back this writer's failed writes, then begin its instant under the lock (the
        heartbeat beats from then on)."""
        rollback_failed_writes(self.table, self.control, writer_id=self._writer_id)
        self._tx = TableTransaction(HudiFormat(self.table), self.control, writer_id=self._writer_id)
        t = self._tx.begin()
        log.info(
            "table %s: backfill %s (writer %s) began %s",
            self.table.config.name, self._backfill_id, self._writer_id, t,
        )  # fmt: skip
        return HudiTaskTarget(self.table.storage, self.table.config, t.value, self.target_file_size)

    def commit(self, statuses: Sequence[WriteStatus]) -> BackfillResult:
        """Reconcile the markers, then publish under the lock if the writer is still live, no
        run of this backfill committed meanwhile and the conflict rules allow it."""
        tx = self._transaction()
        t = tx.instant_time
        writes = tuple(f for s in statuses for f in s.files)
        kept = tx.stage({w.path for w in writes})
        schema = commit_schema_text(str(s.extra.get("schema") or "") for s in statuses) or ""
        metadata = CommitMetadata(
            operation_type="BULK_INSERT",
            writes=writes,
            schema=TableSchema.from_text(schema or (tx.format.schema() or "")),
            extra={
                keys.WRITER_ID_KEY: self._writer_id,
                keys.COMMIT_ID_KEY: str(uuid.uuid4()),
                keys.BACKFILL_ID_KEY: self._backfill_id,
                keys.BACKFILL_SOURCE_KEY: json.dumps(list(self.sources[:MAX_SOURCES_RECORDED])),
            },
        )
        written = Operation(
            t,
            OperationKind.INGESTION,
            file_groups_of_paths(kept),
            phase=Phase.PENDING,
            writer=self._writer_id,
        )
        tx.commit(
            metadata,
            (
                WriterStillLive(self.control, t),
                BackfillNotCommitted(self._backfill_id),
                NoConflicts(written, self.strategy),
            ),
        )
        tx.__exit__(None, None, None)  # the heartbeat stops
        records = sum(w.num_writes for w in writes)
        log.info(
            "table %s: backfill %s committed %s (%d records, %d files)",
            self.table.config.name, self._backfill_id, t, records, len(writes),
        )  # fmt: skip
        return BackfillResult(self._writer_id, self._backfill_id, t, records, len(writes))


if TYPE_CHECKING:  # mypy proves the Hudi side implements the format-neutral backfill
    from lakesink.formats.backfill import Backfill

    _BACKFILL: type[Backfill] = HudiBackfill
