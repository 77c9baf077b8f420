"""The Iceberg format's plugin (lakesink.formats): what spark/ and cli/ ask of an Iceberg table.
Its modules (and pyiceberg) are imported when a method runs, so looking the plugin up costs
nothing and needs no `iceberg` extra."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lakesink.errors import ConfigError, InternalError

if TYPE_CHECKING:
    import pyarrow as pa

    from lakesink.engine.coordinator import Coordinator
    from lakesink.engine.format import CommitControl
    from lakesink.engine.schema import TableSchema
    from lakesink.formats.audit import DeadLetters, FoldAudit, KeptByTransform
    from lakesink.formats.iceberg.audit import IcebergAuditReport
    from lakesink.formats.iceberg.backfill import IcebergBackfill
    from lakesink.formats.iceberg.coordinator import CatalogControl, IcebergCoordinator
    from lakesink.formats.iceberg.datafiles import IcebergTarget
    from lakesink.formats.iceberg.format import IcebergFormat
    from lakesink.formats.iceberg.rowdelta import IcebergRowDeltaTarget
    from lakesink.formats.iceberg.table import IcebergTable
    from lakesink.formats.iceberg.upsert import IcebergUpsertTarget
    from lakesink.metrics import IngestionMetrics
    from lakesink.protocol.offsets import TopicPartition, WriterOffsets
    from lakesink.settings import Settings, StorageAccess
    from lakesink.storage import Storage


class IcebergPlugin:
    """An Iceberg table `table.name` in a catalog whose warehouse is table.path: tasks write data
    files, each commit is one snapshot whose summary carries the writer's state."""

    name = "iceberg"
    tasks_write_data_files = True
    keyed_writes_by_task = True
    cli_commands = ("iceberg",)
    # the writers of IcebergTarget and IcebergUpsertTarget; the table metadata's parser (a
    # task's first `parsed_metadata`) and pandas, which pyarrow imports at a task's first
    # ChunkedArray.to_numpy (the key checks of rows written by key): each 0.2-0.5 s of a
    # worker's first batch, inside the timed batches of a run whose batches are one task each
    task_modules = (
        "lakesink.formats.iceberg.datafiles",
        "lakesink.formats.iceberg.upsert",
        "pyiceberg.table.metadata",
        "pandas",
    )

    def check_options(self, settings: Settings) -> None:
        """A dead-letter table must be a table name (of the same catalog), not a path."""
        if settings.dead_letters.table:
            from lakesink.formats.iceberg.format import dead_letter_identifier

            dead_letter_identifier(settings)  # a table name in iceberg.namespace, not a path

    def record_key_columns(self, settings: Settings) -> tuple[str, ...]:
        """A table of keys' (write.operation upsert or cdc: its identifier fields); none for
        an append table, which is unkeyed."""
        if settings.mutation.mutates:
            return tuple(settings.table.record_key_fields)
        return ()

    def liveness_key(self, settings: Settings) -> str:
        """Per table under the warehouse: one warehouse holds many tables."""
        table = f"{settings.iceberg.namespace}.{settings.table.name}"
        return f".lakesink/liveness/{table}/{settings.writer_id}.json"

    def committed_offsets(self, settings: Settings) -> WriterOffsets:
        from lakesink.formats.iceberg.format import committed_offsets_of

        return committed_offsets_of(settings)

    def table_identity(self, settings: Settings) -> tuple[str, ...]:
        """The warehouse (table.path), the namespace and the table's name."""
        return (
            str(settings.table.path).rstrip("/"),
            settings.iceberg.namespace,
            settings.table.name,
        )

    def table_names(self, settings: Settings) -> list[str]:
        """The catalog's tables in iceberg.namespace (table.path: the warehouse)."""
        from lakesink.formats.iceberg.format import iceberg_table_names

        return iceberg_table_names(settings)

    def committed_topic_ids(self, settings: Settings) -> dict[str, str]:
        """None: snapshots do not record topic ids."""
        return {}

    def commit_schema(self, rows: pa.Schema, table_name: str) -> TableSchema:
        """The rows' schema with no text (the table's metadata keeps its schema); the field
        ids are the table's, added by its coordinator (IcebergCoordinator.precommit)."""
        from lakesink.engine.schema import TableSchema

        return TableSchema("", rows)

    def written_schema(self, texts: Sequence[str]) -> str | None:
        """None: an Iceberg commit takes its schema from the table's metadata, not the tasks."""
        return None

    def dead_letter_table_records(self, settings: Settings) -> DeadLetters:
        from lakesink.formats.audit import DeadLetters
        from lakesink.formats.iceberg.format import dead_letter_coordinates_of

        return DeadLetters(tuple(dead_letter_coordinates_of(settings)), exactly_once=True)

    def audit(
        self,
        settings: Settings,
        *,
        dead_letters: DeadLetters | None,
        kept_by_transform: KeptByTransform | None,
        spark: bool,
        fold: FoldAudit | None = None,
    ) -> IcebergAuditReport:
        """pyiceberg and DuckDB read the table; with `spark`, Spark with Iceberg's Java runtime
        too, in its own environment (a subprocess that starts Spark: seconds)."""
        from lakesink.formats.iceberg.audit import audit_iceberg, spark_reader
        from lakesink.formats.iceberg.format import catalog_settings_for, open_iceberg_table

        extra_readers = (
            {"spark": spark_reader(catalog_settings_for(settings, create=False))} if spark else {}
        )
        if fold is not None:  # a table of keys: it must equal the fold of its records by key
            from lakesink.formats.iceberg.fold_audit import audit_iceberg_fold

            return audit_iceberg_fold(
                open_iceberg_table(settings, create=False),
                settings.writer_id,
                fold,
                bootstrap=settings.kafka.bootstrap_servers,
                isolation_level=settings.kafka.isolation_level,
                consumer_config=settings.kafka.consumer_config,
                extra_readers=extra_readers,
            )
        return audit_iceberg(
            open_iceberg_table(settings, create=False),
            settings.writer_id,
            bootstrap=settings.kafka.bootstrap_servers,
            isolation_level=settings.kafka.isolation_level,
            consumer_config=settings.kafka.consumer_config,
            dead_letters=dead_letters,
            from_log_start=settings.kafka.starting_offsets == "earliest",
            extra_readers=extra_readers,
            kept_by_transform=kept_by_transform,
        )

    def audit_lines(self, report: IcebergAuditReport) -> list[str]:
        lines = [
            f"audit of writer {report.writer_id} on Iceberg table {report.table}: "
            f"{report.commits} commits in {report.snapshots} snapshots"
        ]
        lines.extend(f"  rows read by {name + ':':<22} {n:,}" for name, n in report.readers.items())
        lines.extend(f"  not run: {why}" for why in report.not_run)
        lines.append(f"  Kafka records in committed ranges: {report.kafka_records:,}")
        readers = ", ".join(report.readers)
        if report.keys is not None:  # a table of keys (write.operation upsert or cdc)
            lines.append(f"  keys in the fold of those records: {report.keys:,}")
            if report.ok:
                lines.append(
                    f"  PASS ({readers}): the table equals the fold of the committed records "
                    "by key; readers agree"
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
            lines.append(
                f"  PASS ({readers}): every record exactly once; no duplicates, no gaps, "
                "readers agree"
            )
        else:
            lines.append("  FAIL:")
            lines.extend(f"    - {p}" for p in report.problems)
        return lines

    def read_back(self, settings: Settings) -> tuple[pa.Table, str, str]:
        """With pyiceberg, from the current snapshot."""
        from lakesink.formats.iceberg.format import open_iceberg_table

        table = open_iceberg_table(settings, create=False)
        rows = table.pyiceberg.scan().to_arrow()
        snapshots = len(table.pyiceberg.metadata.snapshots)
        return rows, "pyiceberg", f" of {table.name} ({snapshots} snapshots)"

    def table_format(self, table: object) -> IcebergFormat:
        """`table`: an `IcebergTable`."""
        from lakesink.formats.iceberg.format import IcebergFormat
        from lakesink.formats.iceberg.table import IcebergTable

        if not isinstance(table, IcebergTable):
            raise InternalError(f"the Iceberg plugin was handed {table!r}, not an IcebergTable")
        return IcebergFormat(table)

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
    ) -> IcebergCoordinator:
        """`table`: the opened `IcebergTable`. `control` goes unused: the catalog's commit is
        the fence. Inline maintenance runs after commits; orphan removal spares the writer's
        batches in flight."""
        from lakesink.engine.services import ServicesRunner
        from lakesink.formats.iceberg.coordinator import IcebergCoordinator
        from lakesink.formats.iceberg.keyed import layout_of
        from lakesink.formats.iceberg.services import iceberg_maintenance_hook

        table_format = self.table_format(table)
        keyed = layout_of(table_format.table.pyiceberg.metadata, table_format.name) is not None
        # beside the next batch for appends only: a table of keys' rewrite racing its row
        # deltas would make batches conflict (their buckets), so its services stay before
        runner = (
            ServicesRunner(table_format.name, metrics=metrics)
            if settings.services.run == "beside" and not keyed
            else None
        )
        maintenance = iceberg_maintenance_hook(
            table_format.table, settings, in_flight=table_format.in_flight_files, runner=runner
        )
        coordinator = IcebergCoordinator(
            table_format,
            settings.writer_id,
            query_id=query_id,
            allow_data_loss=not settings.kafka.fail_on_data_loss,
            topic_ids=topic_ids,
            metrics=metrics,
            post_commit=(maintenance,),
            publish_delay_s=publish_delay_s,
        )
        coordinator.schema_evolution = settings.table.evolution
        coordinator.services = runner
        if keyed:
            # a table of keys: each batch overwrites the buckets it touches; one that lost a
            # bucket to a concurrent commit is written again (the sink's conflict retry)
            coordinator.operation_type = "UPSERT"
            coordinator.schema_evolution = None
        return coordinator

    def table_partition_fields(self, coordinator: Coordinator) -> None:
        """None: table.partition.by (and the date column) give them."""
        return None

    def task_target(
        self, coordinator: Coordinator, instant_time: str, target_file_size: int
    ) -> IcebergTarget | IcebergUpsertTarget | IcebergRowDeltaTarget:
        """The table's write context: tasks write data files the commit describes (the table's
        own properties give their size), with the field ids of the schema change the batch's
        commit makes, if any (`schema.evolution`). A table of keys gets a keyed target: each
        task rewrites whole buckets over their files as of now."""
        from lakesink.formats.iceberg.coordinator import IcebergCoordinator
        from lakesink.formats.iceberg.datafiles import IcebergTarget

        if not isinstance(coordinator, IcebergCoordinator):
            raise InternalError(
                f"the Iceberg plugin was handed {coordinator!r}, not an IcebergCoordinator"
            )
        from lakesink.protocol.instant import InstantTime

        table_format = coordinator.format
        if coordinator.operation_type == "UPSERT":  # a table of keys: whole buckets rewritten
            from lakesink.formats.iceberg.keyed import MERGE_ON_READ, layout_of
            from lakesink.formats.iceberg.rowdelta import IcebergRowDeltaTarget
            from lakesink.formats.iceberg.upsert import IcebergUpsertTarget

            table = table_format.table
            table.refresh()  # the buckets' files as of now
            layout = layout_of(table.pyiceberg.metadata, table_format.name)
            if layout is not None and layout.mode == MERGE_ON_READ:  # position deletes
                return IcebergRowDeltaTarget.for_table(
                    table.pyiceberg, table.write_context(), instant_time
                )
            return IcebergUpsertTarget.for_table(
                table.pyiceberg, table.write_context(), instant_time
            )
        mode = coordinator.schema_evolution
        plan = table_format.plan_evolution(InstantTime(instant_time), mode)
        # add-and-widen takes rows narrower than the table too: widened as they are written
        widen = mode == "add-and-widen"
        context = table_format.table.write_context(plan, widen_rows=widen)
        return IcebergTarget(context, instant_time)

    def snapshot_files(self, storage: Storage, as_of: str | None) -> list[str]:
        raise ConfigError(_NOT_BY_PATH)

    def snapshot_schema(self, storage: Storage, as_of: str | None) -> pa.Schema:
        raise ConfigError(_NOT_BY_PATH)

    def snapshot_slices(self, storage: Storage, as_of: str | None) -> list[tuple[str, ...]]:
        raise ConfigError(_NOT_BY_PATH)

    def read_slice(self, storage: Storage, files: tuple[str, ...]) -> pa.Table:
        raise ConfigError(_NOT_BY_PATH)

    def add_cli_commands(
        self, sub: Any, add_config_args: Callable[[argparse.ArgumentParser], None]
    ) -> None:
        """`lakesink iceberg expire-snapshots | rewrite-data-files | remove-orphan-files`."""
        from lakesink.formats.iceberg import cli

        cli.add_parser(sub, add_config_args)

    def run_cli(self, args: argparse.Namespace, settings: Settings) -> int:
        from lakesink.formats.iceberg import cli

        return cli.run(args, settings)

    def status(
        self,
        settings: Settings,
        *,
        high_watermarks: Callable[[], Mapping[TopicPartition, int]],
        add_metrics: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any]:
        """The recent snapshots, and the dead-letter table's state."""
        from lakesink.formats.iceberg.inspection import collect_iceberg_status

        return collect_iceberg_status(
            settings, high_watermarks=high_watermarks, add_metrics=add_metrics
        )

    def print_status(self, st: dict[str, Any]) -> None:
        from lakesink.formats.iceberg.inspection import print_iceberg_status

        print_iceberg_status(st)

    def recognizes_table(self, path: str, access: StorageAccess) -> bool:
        """An Iceberg table location (local or on an object store), or a local warehouse."""
        from lakesink.formats.iceberg.inspection import iceberg_kind

        return iceberg_kind(path, access) is not None

    def run_table_command(self, args: argparse.Namespace, access: StorageAccess) -> int:
        """`show`, `timeline` and `files`; the Hudi table services refuse, naming Iceberg's."""
        from lakesink.formats.iceberg.inspection import refuse_iceberg, run_table_command

        if args.table_command in ("clean", "cluster", "archive", "rollback"):
            raise refuse_iceberg(f"table {args.table_command}")
        return run_table_command(args.table_command, args.path, args.json, access)

    def backfill_control(
        self, args: argparse.Namespace, settings: Settings | None, access: StorageAccess
    ) -> None:
        """None: the catalog orders the commits. Refused: a backfill without the catalog's
        configuration, and the lock options."""
        from lakesink.formats.iceberg.backfill import catalog_settings

        catalog_settings(args.table, settings)
        if args.lock_provider is not None or args.postgres_dsn:
            raise ConfigError(
                "backfill: --lock-provider and --postgres-dsn are for Hudi tables; an Iceberg "
                "table's catalog orders its commits"
            )

    def open_backfill(
        self,
        settings: Settings | None,
        table: str,
        control: object,
        *,
        writer_id: str | None,
        backfill_id: str,
        sources: Sequence[str],
    ) -> IcebergBackfill:
        """A backfill into the Iceberg table of `settings` (`table`: its warehouse); `control` goes
        unused: the catalog's commit is the fence."""
        from lakesink.formats.iceberg.backfill import IcebergBackfill

        return IcebergBackfill.open(
            settings,
            table,
            writer_id=writer_id,
            backfill_id=backfill_id,
            sources=sources,
        )

    def writer_control(self, settings: Settings) -> CatalogControl:
        """None of its own: the catalog's commit is the fence (the coordinator claims the
        writer's incarnation in the table)."""
        from lakesink.formats.iceberg.coordinator import CatalogControl

        return CatalogControl(settings.writer_id)

    def open_table(
        self,
        settings: Settings,
        *,
        partition_fields: Sequence[str],
        rows: Callable[[], pa.Schema],
    ) -> IcebergTable:
        """The table `table.name` of the catalog, created from the `rows` schema with the
        partition fields of iceberg.partition.spec (or table.partition.by); for
        write.operation upsert or cdc a table of keys (`open_keyed_table`). An append into a
        table of keys is refused: its rows would duplicate keys."""
        from lakesink.errors import TableNotFoundError
        from lakesink.formats.iceberg.errors import CatalogNotFoundError
        from lakesink.formats.iceberg.format import open_iceberg_table, open_keyed_table
        from lakesink.formats.iceberg.keyed import layout_of

        if settings.mutation.mutates:
            return open_keyed_table(settings, rows())
        try:  # looked at before the rows are checked against it (its key columns are required)
            existing = open_iceberg_table(settings, create=False)
        except (CatalogNotFoundError, TableNotFoundError):
            existing = None
        if (
            existing is not None
            and layout_of(existing.pyiceberg.metadata, existing.name) is not None
        ):
            raise ConfigError(
                f"Iceberg table {existing.name} is a table of keys (written with "
                "write.operation upsert or cdc): appending would duplicate its keys; set "
                "write.operation=upsert or cdc with its record key, or write another table.name"
            )
        return open_iceberg_table(settings, rows())

    def open_dead_letter_coordinator(
        self, settings: Settings, *, rows: Callable[[], pa.Schema], query_id: str
    ) -> IcebergCoordinator:
        """The dead-letter table (same catalog, iceberg.namespace), created from the `rows`
        schema, committed by its own writer `<writer.id>.deadletters` with the main table's
        ranges: its snapshots carry that writer's offsets, so a replayed batch appends no dead
        letter twice."""
        from lakesink.formats.iceberg.coordinator import IcebergCoordinator
        from lakesink.formats.iceberg.format import IcebergFormat, open_dead_letter_table

        return IcebergCoordinator(
            IcebergFormat(open_dead_letter_table(settings, rows())),
            settings.dead_letters.writer_id,
            query_id=query_id,
            allow_data_loss=not settings.kafka.fail_on_data_loss,
        )


_NOT_BY_PATH = (
    'spark.read.format("lakesink") reads Hudi tables by path; read an Iceberg table through '
    "its catalog with Spark's Iceberg runtime"
)

PLUGIN = IcebergPlugin()
