"""The Hudi format's plugin (lakesink.formats): what spark/ and cli/ ask of a Hudi table. Its
modules are imported when a method runs, so looking the plugin up costs nothing."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lakesink.errors import InternalError

if TYPE_CHECKING:
    import pyarrow as pa

    from lakesink.engine.coordinator import Coordinator
    from lakesink.engine.format import CommitControl
    from lakesink.engine.schema import TableSchema
    from lakesink.formats.audit import DeadLetters, FoldAudit, KeptByTransform
    from lakesink.formats.hudi.audit import AuditReport
    from lakesink.formats.hudi.backfill import HudiBackfill
    from lakesink.formats.hudi.control import WriterCommitControl
    from lakesink.formats.hudi.coordinator import HudiCoordinator
    from lakesink.formats.hudi.format import HudiFormat
    from lakesink.formats.hudi.table.hudi_table import HudiTable
    from lakesink.formats.hudi.table.view import FileSystemView
    from lakesink.formats.task import TaskTarget
    from lakesink.metrics import IngestionMetrics
    from lakesink.protocol.offsets import TopicPartition, WriterOffsets
    from lakesink.settings import Settings, StorageAccess
    from lakesink.storage import Storage


class HudiPlugin:
    """A Hudi table at table.path: base files with markers, the writer's state in the commit
    metadata of its timeline."""

    name = "hudi"
    tasks_write_data_files = False
    keyed_writes_by_task = False
    cli_commands: tuple[str, ...] = ()
    task_modules = ("lakesink.formats.hudi.table.writer",)  # HudiTaskTarget's writer

    def check_options(self, settings: Settings) -> None:
        """Nothing beyond the configuration's own checks."""

    def record_key_columns(self, settings: Settings) -> tuple[str, ...]:
        return tuple(settings.table.record_key_fields)

    def liveness_key(self, settings: Settings) -> str:
        return f".hoodie/.lakesink/liveness/{settings.writer_id}.json"

    def committed_offsets(self, settings: Settings) -> WriterOffsets:
        from lakesink.formats.hudi.writer_state import committed_offsets_at

        return committed_offsets_at(settings.table_storage(), settings.writer_id)

    def table_identity(self, settings: Settings) -> tuple[str, ...]:
        return (str(settings.table.path).rstrip("/"),)

    def table_names(self, settings: Settings) -> list[str]:
        """The folders of table.path that hold a Hudi table (one LIST, one HEAD per folder)."""
        from lakesink.formats.hudi.table.hudi_table import PROPERTIES_FILE

        root = settings.table_storage()
        try:
            folders = root.list_folder("").folders
        except FileNotFoundError:  # no table yet
            return []
        return sorted(name for name in folders if root.exists(f"{name}/{PROPERTIES_FILE}"))

    def committed_topic_ids(self, settings: Settings) -> dict[str, str]:
        from lakesink.formats.hudi.writer_state import committed_topic_ids_at

        return committed_topic_ids_at(settings.table_storage(), settings.writer_id)

    def commit_schema(self, rows: pa.Schema, table_name: str) -> TableSchema:
        """The rows' schema, encoded as Hudi's readers expect it: the Avro schema with Hudi's
        meta columns (Hudi has no field ids)."""
        from lakesink.engine.schema import TableSchema
        from lakesink.formats.hudi.table.avro_schema import avro_schema_for, with_meta_columns

        return TableSchema(avro_schema_for(with_meta_columns(rows), f"{table_name}_record"), rows)

    def written_schema(self, texts: Sequence[str]) -> str | None:
        """The tasks' Avro schemas unified (`commit_schema_text`): a task that resolved the
        table's schema after another writer's evolution committed keeps that writer's columns."""
        from lakesink.formats.hudi.table.evolution import commit_schema_text

        return commit_schema_text(texts)

    def dead_letter_table_records(self, settings: Settings) -> DeadLetters:
        from lakesink.formats.audit import DeadLetters
        from lakesink.formats.hudi.audit import dead_letter_table_coordinates

        table = settings.storage_for(str(settings.dead_letters.table))
        return DeadLetters(tuple(dead_letter_table_coordinates(table)), exactly_once=True)

    def audit(
        self,
        settings: Settings,
        *,
        dead_letters: DeadLetters | None,
        kept_by_transform: KeptByTransform | None,
        spark: bool,
        fold: FoldAudit | None = None,
    ) -> AuditReport:
        """hudi-rs and lakesink's reader read the table (Spark is not needed)."""
        from lakesink.formats.hudi.audit import audit

        return audit(
            settings.table_storage(),
            settings.writer_id,
            bootstrap=settings.kafka.bootstrap_servers,
            isolation_level=settings.kafka.isolation_level,
            consumer_config=settings.kafka.consumer_config,
            dead_letters=dead_letters,
            kept_by_transform=kept_by_transform,
            fold=fold,
        )

    def audit_lines(self, report: AuditReport) -> list[str]:
        lines = [
            f"audit of writer {report.writer_id}: {report.commits} commits",
            f"  rows read by hudi-rs:          {report.rows_hudi_rs:,}",
            f"  rows read by lakesink reader:  {report.rows_lakesink:,}",
            f"  Kafka records in committed ranges: {report.kafka_records:,}",
        ]
        if report.keys is not None:  # a table of keys (write.operation upsert or cdc)
            lines.append(f"  keys in the fold of those records: {report.keys:,}")
            if report.ok:
                lines.append(
                    "  PASS: the table equals the fold of the committed records by key; "
                    "readers agree"
                )
            else:
                lines.append("  FAIL:")
                lines.extend(f"    - {p}" for p in report.problems)
            return lines
        if report.dead_letters:
            lines.append(f"  dead-lettered records:         {report.dead_letters:,}")
        if report.filtered:
            lines.append(f"  filtered out by transform.arrow: {report.filtered:,}")
        if report.ok:
            lines.append("  PASS: every record exactly once; no duplicates, no gaps, readers agree")
        else:
            lines.append("  FAIL:")
            lines.extend(f"    - {p}" for p in report.problems)
        return lines

    def read_back(self, settings: Settings) -> tuple[pa.Table, str, str]:
        """With hudi-rs, the reader the audit trusts besides lakesink's own."""
        import pyarrow as pa

        from lakesink.engine.evolution import concat_unified
        from lakesink.extras import require

        hudi = require("hudi", "lakesink demo (it reads the table back with hudi-rs)")
        path = str(settings.table.path)
        batches = hudi.HudiTableBuilder.from_base_uri(path).build().read()
        # hudi-rs (0.5.0) hands every slice in the latest commit's schema; unified by name as
        # a safeguard should a slice come in its own file's (written before a schema change)
        return (
            concat_unified(batches) if batches else pa.Table.from_batches(batches),
            "hudi-rs",
            "",
        )

    def table_format(self, table: object) -> HudiFormat:
        """`table`: a `HudiTable`."""
        from lakesink.formats.hudi.format import HudiFormat

        return HudiFormat(_hudi_table(table))

    def open_coordinator(
        self,
        settings: Settings,
        table: object,
        control: CommitControl,
        *,
        query_id: str,
        publish_delay_s: float = 0.0,
        topic_ids: Callable[[Iterable[str]], Mapping[str, str]] | None = None,
        metrics: IngestionMetrics | None = None,
    ) -> HudiCoordinator:
        """`table`: the `HudiTable` created at table.path; `control`: a Hudi commit control."""
        from lakesink.formats.hudi.control import hudi_control
        from lakesink.formats.hudi.coordinator import HudiCoordinator

        hudi_table = _hudi_table(table)
        coordinator = HudiCoordinator.from_settings(
            settings,
            hudi_table,
            hudi_control(control),
            query_id=query_id,
            publish_delay_s=publish_delay_s,
            topic_ids=topic_ids,
            metrics=metrics,
        )
        coordinator.schema_evolution = settings.table.evolution
        if hudi_table.config.bucket_count is not None:  # rows change by key (write.operation)
            coordinator.operation_type = "UPSERT"
        if hudi_table.config.table_type == "MERGE_ON_READ":
            from lakesink.protocol.instant import Action

            coordinator.action = Action.DELTA_COMMIT  # each batch adds log files
        return coordinator

    def table_partition_fields(self, coordinator: Coordinator) -> tuple[str, ...]:
        return _hudi_coordinator(coordinator).table.config.partition_fields

    def task_target(
        self, coordinator: Coordinator, instant_time: str, target_file_size: int
    ) -> TaskTarget:
        """The table's storage and config: tasks write base files with markers. A table with a
        bucket index (write.operation upsert or cdc) gets a keyed target: each task rewrites
        whole buckets over the latest base files as of now; on a merge-on-read table it adds a
        log file of the changes to each bucket instead."""
        from lakesink.formats.hudi.table.delta_upsert import HudiDeltaTaskTarget
        from lakesink.formats.hudi.table.upsert import HudiUpsertTaskTarget
        from lakesink.formats.hudi.table.writer import HudiTaskTarget
        from lakesink.protocol.instant import InstantTime

        table = _hudi_coordinator(coordinator).table
        if table.config.bucket_count is not None and table.config.table_type == "MERGE_ON_READ":
            return HudiDeltaTaskTarget.for_table(table, instant_time, target_file_size)
        if table.config.bucket_count is not None:
            return HudiUpsertTaskTarget.for_table(table, instant_time, target_file_size)
        hudi = _hudi_coordinator(coordinator)
        known, schema = hudi.task_schema(InstantTime(instant_time))
        return HudiTaskTarget(
            table.storage,
            table.config,
            instant_time,
            target_file_size,
            hudi.schema_evolution,
            table_schema=schema,
            schema_known=known,
            known_partitions=hudi.task_partitions(InstantTime(instant_time)),
        )

    def snapshot_files(self, storage: Storage, as_of: str | None) -> list[str]:
        """The latest base files: never a file of an inflight, failed or rolled-back instant."""
        return [f.path for f in _table_and_view(storage, as_of)[1].latest_base_files()]

    def snapshot_schema(self, storage: Storage, as_of: str | None) -> pa.Schema:
        """The schema lakesink's reader reads the snapshot in: the latest base files' schemas
        unified, oldest instant first (files written before a schema change keep theirs; every
        slice is conformed to this one); of a table without base files, its reader's."""
        from concurrent.futures import ThreadPoolExecutor

        import pyarrow.parquet as pq

        from lakesink.engine.evolution import unify
        from lakesink.formats.hudi.table.reader import TableReader

        table, view = _table_and_view(storage, as_of, merge_on_read=True)
        # every footer, not one per instant: tasks of one instant that resolved the table's
        # schema on either side of another writer's evolution wrote in two schemas
        files = sorted(
            (f.instant_time.value, f.path) for f in view.latest_base_files() if f.has_base_file
        )
        if files:
            fs, root = table.storage.arrow()
            with ThreadPoolExecutor(max_workers=8) as pool:  # footers are small reads
                found = pool.map(lambda f: pq.read_schema(f"{root}/{f[1]}", filesystem=fs), files)
                schemas: list[pa.Schema] = []
                for s in found:
                    if not any(s == known for known in schemas):
                        schemas.append(s)
            return unify(schemas)
        return TableReader(table).snapshot().schema

    def snapshot_slices(self, storage: Storage, as_of: str | None) -> list[tuple[str, ...]]:
        """The latest file slices: the base file ("" for a slice of log files only) then the
        log files, which `read_slice` merges over it."""
        view = _table_and_view(storage, as_of, merge_on_read=True)[1]
        return [(s.path, *s.log_paths) for s in view.latest_base_files()]

    def read_slice(self, storage: Storage, files: tuple[str, ...]) -> pa.Table:
        """The rows of a slice, its log files merged over its base file by lakesink's reader."""
        import pyarrow.parquet as pq

        from lakesink.formats.hudi.table.hudi_table import HudiTable
        from lakesink.formats.hudi.table.merge_on_read import merge_slice

        table = HudiTable.open(storage)
        base = None
        if files[0]:
            fs, root = storage.arrow()
            base = pq.read_table(f"{root}/{files[0]}", filesystem=fs, partitioning=None)
        return merge_slice(table, base, files[1:])

    def add_cli_commands(
        self, sub: Any, add_config_args: Callable[[argparse.ArgumentParser], None]
    ) -> None:
        """None: Hudi's commands are the `table` commands (`run_table_command`)."""

    def run_cli(self, args: argparse.Namespace, settings: Settings) -> int:
        raise InternalError(f"the Hudi plugin has no command {args.command!r}")

    def status(
        self,
        settings: Settings,
        *,
        high_watermarks: Callable[[], Mapping[TopicPartition, int]],
        add_metrics: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any]:
        """The table's files and timeline, and the offsets its commits passed over."""
        from lakesink.formats.hudi.status import collect_status

        return collect_status(settings, high_watermarks=high_watermarks, add_metrics=add_metrics)

    def print_status(self, st: dict[str, Any]) -> None:
        from lakesink.formats.hudi.status import print_status

        print_status(st)

    def recognizes_table(self, path: str, access: StorageAccess) -> bool:
        """False: Hudi is the default format, which takes the paths no format recognizes."""
        return False

    def run_table_command(self, args: argparse.Namespace, access: StorageAccess) -> int:
        from lakesink.formats.hudi.cli import run_table_command

        return run_table_command(args, access)

    def backfill_control(
        self, args: argparse.Namespace, settings: Settings | None, access: StorageAccess
    ) -> Any:
        """The table's lock and heartbeat (of `settings`, or of the lock options)."""
        from lakesink.formats.hudi.cli import backfill_control

        return backfill_control(args, settings, access)

    def open_backfill(
        self,
        settings: Settings | None,
        table: str,
        control: object,
        *,
        writer_id: str | None,
        backfill_id: str,
        sources: Sequence[str],
    ) -> HudiBackfill:
        """A backfill into the Hudi table at `table` under `control` (`backfill_control`'s)."""
        from lakesink.formats.hudi.backfill import HudiBackfill

        return HudiBackfill.open(
            settings,
            table,
            control,
            writer_id=writer_id,
            backfill_id=backfill_id,
            sources=sources,
        )

    def writer_control(self, settings: Settings) -> WriterCommitControl:
        """The table lock, heartbeats and the writer's fencing, as configured."""
        from lakesink.formats.hudi.control import WriterCommitControl

        return WriterCommitControl.for_writer(settings)

    def open_table(
        self,
        settings: Settings,
        *,
        partition_fields: Sequence[str],
        rows: Callable[[], pa.Schema],
    ) -> HudiTable:
        """The table at table.path, created partitioned by `partition_fields` (an existing
        table keeps its own config); `rows` goes unused: each commit records its schema."""
        from lakesink.formats.hudi.tables import create_writer_table

        return create_writer_table(settings, partition_fields)

    def open_dead_letter_coordinator(
        self, settings: Settings, *, rows: Callable[[], pa.Schema], query_id: str
    ) -> HudiCoordinator:
        """The Hudi table at errors.deadletter.table (keyed by the Kafka coordinates), written
        by `<writer.id>.deadletters` under its own lock, heartbeats and fencing."""
        from lakesink.formats.hudi.tables import create_dead_letter_table

        dead = settings.dead_letters.table_settings
        if dead is None:
            raise InternalError("no Hudi dead-letter table is configured (errors.deadletter.table)")
        table = create_dead_letter_table(dead)
        return self.open_coordinator(dead, table, self.writer_control(dead), query_id=query_id)


def _hudi_table(table: object) -> HudiTable:
    from lakesink.formats.hudi.table.hudi_table import HudiTable

    if not isinstance(table, HudiTable):
        raise InternalError(f"the Hudi plugin was handed {table!r}, not a HudiTable")
    return table


def _hudi_coordinator(coordinator: Coordinator) -> HudiCoordinator:
    from lakesink.formats.hudi.coordinator import HudiCoordinator

    if not isinstance(coordinator, HudiCoordinator):
        raise InternalError(f"the Hudi plugin was handed {coordinator!r}, not a HudiCoordinator")
    return coordinator


def _table_and_view(
    storage: Storage, as_of: str | None, *, merge_on_read: bool = False
) -> tuple[HudiTable, FileSystemView]:
    """The table and its view as of `as_of`; UnsupportedTableError for a merge-on-read table
    unless the caller reads log files too (`merge_on_read`)."""
    from lakesink.formats.hudi.table.hudi_table import HudiTable
    from lakesink.formats.hudi.table.view import FileSystemView
    from lakesink.protocol.instant import InstantTime

    table = HudiTable.open(storage)
    if table.config.table_type == "MERGE_ON_READ" and not merge_on_read:
        from lakesink.errors import UnsupportedTableError

        # base files alone miss a merge-on-read slice's log files (see snapshot_slices)
        raise UnsupportedTableError(
            f"table {table.uri} is merge-on-read: its base files alone miss the rows of its log "
            "files; read its slices merged (snapshot_slices, read_slice)"
        )
    return table, FileSystemView(table, InstantTime(as_of) if as_of else None)


PLUGIN = HudiPlugin()
