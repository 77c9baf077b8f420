"""`lakesink verify`: the exactly-once audit; exits non-zero on any duplicate, gap or mismatch."""

from __future__ import annotations

from lakesink.audit import AuditReport, audit
from lakesink.cli.output import emit_json, say
from lakesink.config import LakesinkConfig


def audit_config(cfg: LakesinkConfig) -> AuditReport:
    """The audit of this configuration's writer; records in the dead-letter topic count as
    accounted for (errors.tolerance=all), never as missing."""
    dead: set[tuple[str, int, int]] | None = None
    if cfg["errors.deadletter.table"]:
        from lakesink.audit import dead_letter_table_coordinates

        dead = dead_letter_table_coordinates(cfg.storage_for(cfg["errors.deadletter.table"]))
    elif cfg["errors.deadletter.topic"]:
        from lakesink.errors import (
            KafkaAuthenticationError,
            KafkaAuthorizationError,
            KafkaError,
        )
        from lakesink.kafka.dead_letter_reader import dead_letter_sources

        try:
            dead = dead_letter_sources(
                cfg["kafka.bootstrap.servers"],
                cfg["errors.deadletter.topic"],
                cfg.consumer_config,
                admin_config=cfg.kafka_client_config,
            )
        except (KafkaAuthenticationError, KafkaAuthorizationError):
            raise
        except KafkaError:
            dead = set()  # no dead-letter topic yet: nothing was dead-lettered
    return audit(
        cfg.table_storage,
        cfg.writer_id,
        bootstrap=cfg["kafka.bootstrap.servers"],
        isolation_level=cfg["kafka.isolation.level"],
        consumer_config=cfg.consumer_config,
        dead_letter_coordinates=dead,
    )


def print_report(report: AuditReport) -> None:
    say(f"audit of writer {report.writer_id}: {report.commits} commits")
    say(f"  rows read by hudi-rs:          {report.rows_hudi_rs:,}")
    say(f"  rows read by lakesink reader:  {report.rows_lakesink:,}")
    say(f"  Kafka records in committed ranges: {report.kafka_records:,}")
    if report.dead_letters:
        say(f"  dead-lettered records:         {report.dead_letters:,}")
    if report.ok:
        say("  PASS: every record exactly once; no duplicates, no gaps, readers agree")
    else:
        say("  FAIL:")
        for p in report.problems:
            say(f"    - {p}")


def run_verify(cfg: LakesinkConfig, *, as_json: bool) -> int:
    report = audit_config(cfg)
    if as_json:
        emit_json(report.to_json())
    else:
        print_report(report)
    return 0 if report.ok else 10
