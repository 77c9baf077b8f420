"""The Iceberg format's plugin (lakesink.formats): what spark/ and cli/ ask of an Iceberg table.
Its modules (and pyiceberg) are imported when a method runs, so looking the plugin up costs
nothing and needs no `iceberg` extra."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from lakesink.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

    from lakesink.config import LakesinkConfig
    from lakesink.engine.coordinator import Coordinator
    from lakesink.engine.format import CommitControl
    from lakesink.formats.audit import DeadLetters, KeptByTransform
    from lakesink.formats.iceberg.audit import IcebergAuditReport
    from lakesink.formats.iceberg.coordinator import IcebergCoordinator
    from lakesink.formats.iceberg.datafiles import IcebergTarget
    from lakesink.formats.iceberg.format import IcebergFormat
    from lakesink.metrics import IngestionMetrics
    from lakesink.protocol.offsets import TopicPartition, WriterOffsets
    from lakesink.storage import Storage


class IcebergPlugin:
    """An Iceberg table `table.name` in a catalog whose warehouse is table.path: tasks write data
    files, each commit is one snapshot whose summary carries the writer's state."""

    name = "iceberg"
    tasks_write_data_files = True
    cli_commands = ("iceberg",)

    def check_options(self, cfg: LakesinkConfig) -> None:
        """A dead-letter table must be a table name (of the same catalog), not a path."""
        if cfg["errors.deadletter.table"]:
            from lakesink.formats.iceberg.format import dead_letter_identifier

            dead_letter_identifier(cfg)  # a table name in iceberg.namespace, not a path

    def record_key_columns(self, cfg: LakesinkConfig) -> tuple[str, ...]:
        """None: an Iceberg table is append-only, unkeyed."""
        return ()

    def liveness_key(self, cfg: LakesinkConfig) -> str:
        """Per table under the warehouse: one warehouse holds many tables."""
        namespace = str(cfg["iceberg.namespace"] or "lakesink")
        return f".lakesink/liveness/{namespace}.{cfg.table_name}/{cfg.writer_id}.json"

    def committed_offsets(self, cfg: LakesinkConfig) -> WriterOffsets:
        from lakesink.formats.iceberg.format import committed_offsets_of

        return committed_offsets_of(cfg)

    def committed_topic_ids(self, cfg: LakesinkConfig) -> dict[str, str]:
        """None: snapshots do not record topic ids."""
        return {}

    def commit_schema(self, rows: pa.Schema, table_name: str) -> str:
        """None (""): the table's metadata keeps its schema, with field ids."""
        return ""

    def dead_letter_table_records(self, cfg: LakesinkConfig) -> DeadLetters:
        from lakesink.formats.audit import DeadLetters
        from lakesink.formats.iceberg.format import dead_letter_coordinates_of

        return DeadLetters(tuple(dead_letter_coordinates_of(cfg)), exactly_once=True)

    def audit(
        self,
        cfg: LakesinkConfig,
        *,
        dead_letters: DeadLetters | None,
        kept_by_transform: KeptByTransform | None,
        spark: bool,
    ) -> IcebergAuditReport:
        """pyiceberg and DuckDB read the table; with `spark`, Spark with Iceberg's Java runtime
        too, in its own environment (a subprocess that starts Spark: seconds)."""
        from lakesink.formats.iceberg.audit import audit_iceberg, spark_reader
        from lakesink.formats.iceberg.format import catalog_settings_for, open_iceberg_table

        return audit_iceberg(
            open_iceberg_table(cfg, create=False),
            cfg.writer_id,
            bootstrap=cfg["kafka.bootstrap.servers"],
            isolation_level=cfg["kafka.isolation.level"],
            consumer_config=cfg.consumer_config,
            dead_letters=dead_letters,
            from_log_start=cfg["kafka.starting.offsets"] == "earliest",
            extra_readers=(
                {"spark": spark_reader(catalog_settings_for(cfg, create=False))} if spark else {}
            ),
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
        if report.dead_letters:
            lines.append(f"  dead-lettered records:         {report.dead_letters:,}")
        if report.filtered:
            lines.append(f"  filtered out by transform.arrow: {report.filtered:,}")
        readers = ", ".join(report.readers)
        if report.ok:
            lines.append(
                f"  PASS ({readers}): every record exactly once; no duplicates, no gaps, "
                "readers agree"
            )
        else:
            lines.append("  FAIL:")
            lines.extend(f"    - {p}" for p in report.problems)
        return lines

    def read_back(self, cfg: LakesinkConfig) -> tuple[pa.Table, str, str]:
        """With pyiceberg, from the current snapshot."""
        from lakesink.formats.iceberg.format import open_iceberg_table

        table = open_iceberg_table(cfg, create=False)
        rows = table.pyiceberg.scan().to_arrow()
        snapshots = len(table.pyiceberg.metadata.snapshots)
        return rows, "pyiceberg", f" of {table.name} ({snapshots} snapshots)"

    def table_format(self, table: object) -> IcebergFormat:
        """`table`: an `IcebergTable`."""
        from lakesink.formats.iceberg.format import IcebergFormat
        from lakesink.formats.iceberg.table import IcebergTable

        assert isinstance(table, IcebergTable)
        return IcebergFormat(table)

    def open_coordinator(
        self,
        cfg: LakesinkConfig,
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
        from lakesink.formats.iceberg.coordinator import IcebergCoordinator
        from lakesink.formats.iceberg.services import iceberg_maintenance_hook

        table_format = self.table_format(table)
        maintenance = iceberg_maintenance_hook(
            table_format.table, cfg, in_flight=table_format.in_flight_files
        )
        return IcebergCoordinator(
            table_format,
            cfg.writer_id,
            query_id=query_id,
            allow_data_loss=not cfg["kafka.fail.on.data.loss"],
            topic_ids=topic_ids,
            metrics=metrics,
            post_commit=(maintenance,),
            publish_delay_s=publish_delay_s,
        )

    def table_partition_fields(self, coordinator: Coordinator) -> None:
        """None: table.partition.by (and the date column) give them."""
        return None

    def task_target(
        self, coordinator: Coordinator, instant_time: str, target_file_size: int
    ) -> IcebergTarget:
        """The table's write context: tasks write data files the commit describes (the table's
        own properties give their size)."""
        from lakesink.formats.iceberg.coordinator import IcebergCoordinator
        from lakesink.formats.iceberg.datafiles import IcebergTarget

        assert isinstance(coordinator, IcebergCoordinator)
        return IcebergTarget(coordinator.format.table.write_context(), instant_time)

    def snapshot_files(self, storage: Storage, as_of: str | None) -> list[str]:
        raise ConfigError(_NOT_BY_PATH)

    def snapshot_schema(self, storage: Storage, as_of: str | None) -> pa.Schema:
        raise ConfigError(_NOT_BY_PATH)

    def add_cli_commands(
        self, sub: Any, add_config_args: Callable[[argparse.ArgumentParser], None]
    ) -> None:
        """`lakesink iceberg expire-snapshots | rewrite-data-files | remove-orphan-files`."""
        from lakesink.formats.iceberg import cli

        cli.add_parser(sub, add_config_args)

    def run_cli(self, args: argparse.Namespace, cfg: LakesinkConfig) -> int:
        from lakesink.formats.iceberg import cli

        return cli.run(args, cfg)

    def status(
        self,
        cfg: LakesinkConfig,
        *,
        high_watermarks: Callable[[], Mapping[TopicPartition, int]],
        add_metrics: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any]:
        """The recent snapshots, and the dead-letter table's state."""
        from lakesink.formats.iceberg.inspection import collect_iceberg_status

        return collect_iceberg_status(cfg, high_watermarks=high_watermarks, add_metrics=add_metrics)

    def print_status(self, st: dict[str, Any]) -> None:
        from lakesink.formats.iceberg.inspection import print_iceberg_status

        print_iceberg_status(st)

    def recognizes_table(self, path: str) -> bool:
        """An Iceberg table location (local or on an object store), or a local warehouse."""
        from lakesink.formats.iceberg.inspection import iceberg_kind

        return iceberg_kind(path) is not None

    def run_table_command(self, args: argparse.Namespace) -> int:
        """`show`, `timeline` and `files`; the Hudi table services refuse, naming Iceberg's."""
        from lakesink.formats.iceberg.inspection import refuse_iceberg, run_table_command

        if args.table_command in ("clean", "cluster", "archive", "rollback"):
            raise refuse_iceberg(f"table {args.table_command}")
        return run_table_command(args.table_command, args.path, args.json)

    def backfill_control(self, args: argparse.Namespace, cfg: LakesinkConfig | None) -> None:
        """None: the catalog orders the commits; the lock options are refused."""
        if args.lock_provider is not None or args.postgres_dsn:
            raise ConfigError(
                "backfill: --lock-provider and --postgres-dsn are for Hudi tables; an Iceberg "
                "table's catalog orders its commits"
            )


_NOT_BY_PATH = (
    'spark.read.format("lakesink") reads Hudi tables by path; read an Iceberg table through '
    "its catalog with Spark's Iceberg runtime"
)

PLUGIN = IcebergPlugin()
