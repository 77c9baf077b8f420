"""The Hudi format's plugin (lakesink.formats): what spark/ and cli/ ask of a Hudi table. Its
modules are imported when a method runs, so looking the plugin up costs nothing."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from lakesink.config import LakesinkConfig
    from lakesink.engine.coordinator import Coordinator
    from lakesink.engine.format import CommitControl
    from lakesink.formats.audit import DeadLetters, KeptByTransform
    from lakesink.formats.hudi.audit import AuditReport
    from lakesink.formats.hudi.coordinator import HudiCoordinator
    from lakesink.formats.hudi.format import HudiFormat
    from lakesink.formats.hudi.table.hudi_table import HudiTable
    from lakesink.formats.hudi.table.view import FileSystemView
    from lakesink.formats.hudi.table.writer import HudiTaskTarget
    from lakesink.metrics import IngestionMetrics
    from lakesink.protocol.offsets import TopicPartition, WriterOffsets
    from lakesink.storage import Storage


class HudiPlugin:
    """A Hudi table at table.path: base files with markers, the writer's state in the commit
    metadata of its timeline."""

    name = "hudi"
    tasks_write_data_files = False
    cli_commands: tuple[str, ...] = ()

    def check_options(self, cfg: LakesinkConfig) -> None:
        """Nothing beyond lakesink.config's own checks."""

    def record_key_columns(self, cfg: LakesinkConfig) -> tuple[str, ...]:
        return tuple(cfg["table.record.key.fields"])

    def liveness_key(self, cfg: LakesinkConfig) -> str:
        return f".hoodie/.lakesink/liveness/{cfg.writer_id}.json"

    def committed_offsets(self, cfg: LakesinkConfig) -> WriterOffsets:
        from lakesink.formats.hudi.writer_state import committed_offsets_at

        return committed_offsets_at(cfg.table_storage, cfg.writer_id)

    def committed_topic_ids(self, cfg: LakesinkConfig) -> dict[str, str]:
        from lakesink.formats.hudi.writer_state import committed_topic_ids_at

        return committed_topic_ids_at(cfg.table_storage, cfg.writer_id)

    def commit_schema(self, rows: pa.Schema, table_name: str) -> str:
        """The Avro schema of the rows with Hudi's meta columns, as Hudi's readers expect."""
        from lakesink.formats.hudi.table.avro_schema import avro_schema_for, with_meta_columns

        return avro_schema_for(with_meta_columns(rows), f"{table_name}_record")

    def dead_letter_table_records(self, cfg: LakesinkConfig) -> DeadLetters:
        from lakesink.formats.audit import DeadLetters
        from lakesink.formats.hudi.audit import dead_letter_table_coordinates

        table = cfg.storage_for(cfg["errors.deadletter.table"])
        return DeadLetters(tuple(dead_letter_table_coordinates(table)), exactly_once=True)

    def audit(
        self,
        cfg: LakesinkConfig,
        *,
        dead_letters: DeadLetters | None,
        kept_by_transform: KeptByTransform | None,
        spark: bool,
    ) -> AuditReport:
        """hudi-rs and lakesink's reader read the table (Spark is not needed)."""
        from lakesink.formats.hudi.audit import audit

        return audit(
            cfg.table_storage,
            cfg.writer_id,
            bootstrap=cfg["kafka.bootstrap.servers"],
            isolation_level=cfg["kafka.isolation.level"],
            consumer_config=cfg.consumer_config,
            dead_letters=dead_letters,
            kept_by_transform=kept_by_transform,
        )

    def audit_lines(self, report: AuditReport) -> list[str]:
        lines = [
            f"audit of writer {report.writer_id}: {report.commits} commits",
            f"  rows read by hudi-rs:          {report.rows_hudi_rs:,}",
            f"  rows read by lakesink reader:  {report.rows_lakesink:,}",
            f"  Kafka records in committed ranges: {report.kafka_records:,}",
        ]
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

    def read_back(self, cfg: LakesinkConfig) -> tuple[pa.Table, str, str]:
        """With hudi-rs, the reader the audit trusts besides lakesink's own."""
        import pyarrow as pa

        from lakesink.extras import require

        hudi = require("hudi", "lakesink demo (it reads the table back with hudi-rs)")
        path = str(cfg["table.path"])
        return (
            pa.Table.from_batches(hudi.HudiTableBuilder.from_base_uri(path).build().read()),
            "hudi-rs",
            "",
        )

    def table_format(self, table: object) -> HudiFormat:
        """`table`: a `HudiTable`."""
        from lakesink.formats.hudi.format import HudiFormat
        from lakesink.formats.hudi.table.hudi_table import HudiTable

        assert isinstance(table, HudiTable)
        return HudiFormat(table)

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
    ) -> HudiCoordinator:
        """`table`: the `HudiTable` created at table.path; `control`: a Hudi commit control."""
        from lakesink.formats.hudi.control import hudi_control
        from lakesink.formats.hudi.coordinator import HudiCoordinator
        from lakesink.formats.hudi.table.hudi_table import HudiTable

        assert isinstance(table, HudiTable)
        return HudiCoordinator.from_config(
            cfg,
            table,
            hudi_control(control),
            query_id=query_id,
            publish_delay_s=publish_delay_s,
            topic_ids=topic_ids,
            metrics=metrics,
        )

    def table_partition_fields(self, coordinator: Coordinator) -> tuple[str, ...]:
        from lakesink.formats.hudi.coordinator import HudiCoordinator

        assert isinstance(coordinator, HudiCoordinator)
        return coordinator.table.config.partition_fields

    def task_target(
        self, coordinator: Coordinator, instant_time: str, target_file_size: int
    ) -> HudiTaskTarget:
        """The table's storage and config: tasks write base files with markers."""
        from lakesink.formats.hudi.coordinator import HudiCoordinator
        from lakesink.formats.hudi.table.writer import HudiTaskTarget

        assert isinstance(coordinator, HudiCoordinator)
        table = coordinator.table
        return HudiTaskTarget(table.storage, table.config, instant_time, target_file_size)

    def snapshot_files(self, storage: Storage, as_of: str | None) -> list[str]:
        """The latest base files: never a file of an inflight, failed or rolled-back instant."""
        return [f.path for f in _table_and_view(storage, as_of)[1].latest_base_files()]

    def snapshot_schema(self, storage: Storage, as_of: str | None) -> pa.Schema:
        """The first latest base file's schema; of a table without one, its reader's."""
        import pyarrow.parquet as pq

        from lakesink.formats.hudi.table.reader import TableReader

        table, view = _table_and_view(storage, as_of)
        files = view.latest_base_files()
        if files:
            fs, root = table.storage.arrow()
            return pq.read_schema(f"{root}/{files[0].path}", filesystem=fs)
        return TableReader(table).snapshot().schema

    def add_cli_commands(
        self, sub: Any, add_config_args: Callable[[argparse.ArgumentParser], None]
    ) -> None:
        """None: Hudi's commands are the `table` commands (`run_table_command`)."""

    def run_cli(self, args: argparse.Namespace, cfg: LakesinkConfig) -> int:
        raise AssertionError(f"the Hudi plugin has no command {args.command!r}")

    def status(
        self,
        cfg: LakesinkConfig,
        *,
        high_watermarks: Callable[[], Mapping[TopicPartition, int]],
        add_metrics: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any]:
        """The table's files and timeline, and the offsets its commits passed over."""
        from lakesink.formats.hudi.status import collect_status

        return collect_status(cfg, high_watermarks=high_watermarks, add_metrics=add_metrics)

    def print_status(self, st: dict[str, Any]) -> None:
        from lakesink.formats.hudi.status import print_status

        print_status(st)

    def recognizes_table(self, path: str) -> bool:
        """False: Hudi is the default format, which takes the paths no format recognizes."""
        return False

    def run_table_command(self, args: argparse.Namespace) -> int:
        from lakesink.formats.hudi.cli import run_table_command

        return run_table_command(args)

    def backfill_control(self, args: argparse.Namespace, cfg: LakesinkConfig | None) -> Any:
        """The table's lock and heartbeat (of `cfg`, or of the lock options)."""
        from lakesink.formats.hudi.cli import backfill_control

        return backfill_control(args, cfg)


def _table_and_view(storage: Storage, as_of: str | None) -> tuple[HudiTable, FileSystemView]:
    from lakesink.formats.hudi.table.hudi_table import HudiTable
    from lakesink.formats.hudi.table.view import FileSystemView
    from lakesink.protocol.instant import InstantTime

    table = HudiTable.open(storage)
    return table, FileSystemView(table, InstantTime(as_of) if as_of else None)


PLUGIN = HudiPlugin()
