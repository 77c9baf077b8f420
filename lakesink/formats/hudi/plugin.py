"""The Hudi format's plugin (lakesink.formats): what spark/ and cli/ ask of a Hudi table. Its
modules are imported when a method runs, so looking the plugin up costs nothing."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from lakesink.config import LakesinkConfig
    from lakesink.formats.audit import DeadLetters, KeptByTransform
    from lakesink.formats.hudi.audit import AuditReport
    from lakesink.protocol.offsets import WriterOffsets


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

    def add_cli_commands(
        self, sub: Any, add_config_args: Callable[[argparse.ArgumentParser], None]
    ) -> None:
        """None yet: the `table` commands (lakesink.cli.table_commands) serve Hudi."""

    def run_cli(self, args: argparse.Namespace, cfg: LakesinkConfig) -> int:
        raise AssertionError(f"the Hudi plugin has no command {args.command!r}")


PLUGIN = HudiPlugin()
