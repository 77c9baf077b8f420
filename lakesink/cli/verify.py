"""`lakesink verify`: the exactly-once audit; exits non-zero on any duplicate, gap or mismatch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakesink.cli.output import emit_json, say
from lakesink.config import LakesinkConfig
from lakesink.formats.hudi.audit import AuditReport, DeadLetters, KeptByTransform, audit

if TYPE_CHECKING:
    from lakesink.formats.iceberg.audit import IcebergAuditReport


def audit_config(cfg: LakesinkConfig, *, spark: bool = False) -> AuditReport | IcebergAuditReport:
    """The audit of this configuration's writer; records in the dead-letter topic count as
    accounted for (errors.tolerance=all), never as missing. `spark`: an Iceberg table is also
    read by Spark with Iceberg's Java runtime, in its own environment (a subprocess that starts
    Spark: seconds; `lakesink verify` and the demo ask for it)."""
    dead: DeadLetters | None = None
    if cfg["errors.deadletter.table"] and cfg["table.format"] == "iceberg":
        from lakesink.formats.iceberg.format import dead_letter_coordinates_of

        dead = DeadLetters(tuple(dead_letter_coordinates_of(cfg)), exactly_once=True)
    elif cfg["errors.deadletter.table"]:
        from lakesink.formats.hudi.audit import dead_letter_table_coordinates

        table = cfg.storage_for(cfg["errors.deadletter.table"])
        dead = DeadLetters(tuple(dead_letter_table_coordinates(table)), exactly_once=True)
    elif cfg["errors.deadletter.topic"]:
        from lakesink.errors import (
            KafkaAuthenticationError,
            KafkaAuthorizationError,
            KafkaError,
        )
        from lakesink.kafka.dead_letter_reader import dead_letter_sources

        try:
            sent = dead_letter_sources(
                cfg["kafka.bootstrap.servers"],
                cfg["errors.deadletter.topic"],
                cfg.consumer_config,
                admin_config=cfg.kafka_client_config,
            )
        except (KafkaAuthenticationError, KafkaAuthorizationError):
            raise
        except KafkaError:
            sent = set()  # no dead-letter topic yet: nothing was dead-lettered
        dead = DeadLetters(tuple(sorted(sent)), exactly_once=False)
    kept = _kept_by_transform(cfg)
    if cfg["table.format"] == "iceberg":
        from lakesink.formats.iceberg.audit import audit_iceberg, spark_reader
        from lakesink.formats.iceberg.format import catalog_settings_for, open_iceberg_table

        return audit_iceberg(
            open_iceberg_table(cfg, create=False),
            cfg.writer_id,
            bootstrap=cfg["kafka.bootstrap.servers"],
            isolation_level=cfg["kafka.isolation.level"],
            consumer_config=cfg.consumer_config,
            dead_letters=dead,
            from_log_start=cfg["kafka.starting.offsets"] == "earliest",
            extra_readers=(
                {"spark": spark_reader(catalog_settings_for(cfg, create=False))} if spark else {}
            ),
            kept_by_transform=kept,
        )
    return audit(
        cfg.table_storage,
        cfg.writer_id,
        bootstrap=cfg["kafka.bootstrap.servers"],
        isolation_level=cfg["kafka.isolation.level"],
        consumer_config=cfg.consumer_config,
        dead_letters=dead,
        kept_by_transform=kept,
    )


def _kept_by_transform(cfg: LakesinkConfig) -> KeptByTransform | None:
    """`transform.arrow` applied to the committed records (the records it filters out are
    consumed, not missing). transform.sql and transform.python need Spark: not applied."""
    if not cfg["transform.arrow"]:
        return None
    from lakesink.spark.arrow_transform import kept_coordinates

    return lambda ranges: kept_coordinates(cfg, ranges)


def _not_applied_transform(cfg: LakesinkConfig) -> str | None:
    return next((k for k in ("transform.sql", "transform.python") if cfg[k]), None)


def print_report(report: AuditReport | IcebergAuditReport) -> None:
    if not isinstance(report, AuditReport):
        print_iceberg_report(report)
        return
    say(f"audit of writer {report.writer_id}: {report.commits} commits")
    say(f"  rows read by hudi-rs:          {report.rows_hudi_rs:,}")
    say(f"  rows read by lakesink reader:  {report.rows_lakesink:,}")
    say(f"  Kafka records in committed ranges: {report.kafka_records:,}")
    if report.dead_letters:
        say(f"  dead-lettered records:         {report.dead_letters:,}")
    if report.filtered:
        say(f"  filtered out by transform.arrow: {report.filtered:,}")
    if report.ok:
        say("  PASS: every record exactly once; no duplicates, no gaps, readers agree")
    else:
        say("  FAIL:")
        for p in report.problems:
            say(f"    - {p}")


def print_iceberg_report(report: IcebergAuditReport) -> None:
    say(
        f"audit of writer {report.writer_id} on Iceberg table {report.table}: "
        f"{report.commits} commits in {report.snapshots} snapshots"
    )
    for name, n in report.readers.items():
        say(f"  rows read by {name + ':':<22} {n:,}")
    for why in report.not_run:
        say(f"  not run: {why}")
    say(f"  Kafka records in committed ranges: {report.kafka_records:,}")
    if report.dead_letters:
        say(f"  dead-lettered records:         {report.dead_letters:,}")
    if report.filtered:
        say(f"  filtered out by transform.arrow: {report.filtered:,}")
    readers = ", ".join(report.readers)
    if report.ok:
        say(f"  PASS ({readers}): every record exactly once; no duplicates, no gaps, readers agree")
    else:
        say("  FAIL:")
        for p in report.problems:
            say(f"    - {p}")


def run_verify(cfg: LakesinkConfig, *, as_json: bool) -> int:
    report = audit_config(cfg, spark=True)
    unapplied = _not_applied_transform(cfg)
    if unapplied and not report.ok:
        report.problems.append(
            f"{unapplied} is set and verify cannot apply it (it needs Spark): records it filters "
            "out are counted as not in the table above; transform.arrow is applied"
        )
    if as_json:
        emit_json(report.to_json())
    else:
        print_report(report)
    return 0 if report.ok else 10
