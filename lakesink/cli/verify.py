"""`lakesink verify`: the exactly-once audit; exits non-zero on any duplicate, gap or mismatch."""

from __future__ import annotations

from lakesink.config import LakesinkConfig
from lakesink.console import emit_json, say
from lakesink.formats import AuditResult, plugin_of
from lakesink.formats.audit import Coordinate, DeadLetters, FoldAudit, KeptByTransform
from lakesink.protocol.offsets import OffsetRange


def audit_tables(cfg: LakesinkConfig, *, spark: bool = False) -> list[tuple[str, AuditResult]]:
    """The audit of each table of a many-table ingestion (`tables.<name>.*`), by name: the
    records its route takes (lakesink.spark.routing.routed_coordinates) are expected in it,
    the others are accounted for."""
    from lakesink.spark.routing import routed_coordinates
    from lakesink.spark.table_offsets import all_table_configs

    out = []
    for spec, table in all_table_configs(cfg):

        def routed(ranges: list[OffsetRange], name: str = spec.name) -> set[Coordinate]:
            return routed_coordinates(cfg, name, ranges)

        out.append((spec.name, audit_config(table, spark=spark, route=routed)))
    return out


def audit_config(
    cfg: LakesinkConfig, *, spark: bool = False, route: KeptByTransform | None = None
) -> AuditResult:
    """The audit of this configuration's writer; records in the dead-letter topic count as
    accounted for (errors.tolerance=all), never as missing. `spark`: an Iceberg table is also
    read by Spark with Iceberg's Java runtime, in its own environment (a subprocess that starts
    Spark: seconds; `lakesink verify` and the demo ask for it). `route`: the records a table
    of many takes (`audit_tables`)."""
    plugin = plugin_of(cfg.settings)
    dead: DeadLetters | None = None
    if cfg["errors.deadletter.table"]:
        dead = plugin.dead_letter_table_records(cfg.settings)
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
    if route is not None:
        kept = route if kept is None else _both(kept, route)
    return plugin.audit(
        cfg.settings, dead_letters=dead, kept_by_transform=kept, spark=spark, fold=fold_audit(cfg)
    )


def fold_audit(cfg: LakesinkConfig) -> FoldAudit | None:
    """How a table whose rows change by key (write.operation upsert or cdc) is audited: the
    records decoded as the writer decodes them, folded by key under the ordering rule."""
    if cfg["write.operation"] == "append":
        return None
    from lakesink.protocol.mutation import SOURCE_POSITION_COLUMN
    from lakesink.spark.source import value_deserializer

    ordering = cfg["table.ordering.field"]
    if ordering is None and cfg["write.operation"] == "cdc" and cfg["cdc.format"] == "debezium":
        ordering = SOURCE_POSITION_COLUMN
    # values framed by a registry decode into the columns an ingestion would pin now, over the
    # topics it would read (a kafka.topic.pattern's too)
    from lakesink.spark.registry_columns import pin_registry_columns, uses_registry_columns

    pinned = cfg
    if uses_registry_columns(cfg):
        from lakesink.kafka.client import list_partitions

        partitions = list_partitions(
            cfg["kafka.bootstrap.servers"],
            topics=list(cfg["kafka.topics"]) or None,
            pattern=cfg["kafka.topic.pattern"],
            extra=cfg.kafka_client_config,
        )
        pinned = pin_registry_columns(cfg, {tp.topic for tp in partitions})
    return FoldAudit(value_deserializer(pinned), tuple(cfg["table.record.key.fields"]), ordering)


def _kept_by_transform(cfg: LakesinkConfig) -> KeptByTransform | None:
    """`transform.arrow` applied to the committed records (the records it filters out are
    consumed, not missing). transform.sql and transform.python need Spark: not applied."""
    if not cfg["transform.arrow"]:
        return None
    from lakesink.spark.arrow_transform import kept_coordinates

    return lambda ranges: kept_coordinates(cfg, ranges)


def _both(first: KeptByTransform, second: KeptByTransform) -> KeptByTransform:
    return lambda ranges: first(ranges) & second(ranges)


def _not_applied_transform(cfg: LakesinkConfig) -> str | None:
    return next((k for k in ("transform.sql", "transform.python") if cfg[k]), None)


def print_report(cfg: LakesinkConfig, report: AuditResult) -> None:
    for line in plugin_of(cfg.settings).audit_lines(report):
        say(line)


def run_verify(cfg: LakesinkConfig, *, as_json: bool) -> int:
    if cfg["tables"]:
        return _run_verify_tables(cfg, as_json=as_json)
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
        print_report(cfg, report)
    return 0 if report.ok else 10


def _run_verify_tables(cfg: LakesinkConfig, *, as_json: bool) -> int:
    """Every table of a many-table ingestion audited; non-zero if any audit fails."""
    reports = audit_tables(cfg, spark=True)
    if as_json:
        emit_json({name: report.to_json() for name, report in reports})
    else:
        from lakesink.spark.table_offsets import all_table_configs

        tables = all_table_configs(cfg)
        for (_spec, table), (name, report) in zip(tables, reports, strict=True):
            say(f"table {name}:")
            print_report(table, report)
    return 0 if all(report.ok for _, report in reports) else 10
