"""`lakesink status`: committed offset, high watermark and lag per partition; recent instants;
the offsets the writer passed over because Kafka deleted them before they were read; the
metrics (the partition gauges computed here, and what a running ingestion's endpoint serves
when `metrics.port` is set). `--watch` shows it live (lakesink.cli.watch)."""

from __future__ import annotations

from typing import Any

from lakesink.config import LakesinkConfig
from lakesink.console import emit_json, say
from lakesink.formats import plugin_of
from lakesink.metrics import Snapshot


def collect_status(cfg: LakesinkConfig, table: str | None = None) -> dict[str, Any]:
    """The status of the writer of `cfg` and its table (its format's plugin collects it), with
    the metrics of that table (`table`: its label, a name of the tables section; by default
    the table's name)."""
    from lakesink.spark.pipeline import high_watermarks

    def add_metrics(out: dict[str, Any]) -> None:
        out["metrics_source"], out["metrics"] = status_metrics(cfg, out, table)

    return plugin_of(cfg.settings).status(
        cfg.settings, high_watermarks=lambda: high_watermarks(cfg), add_metrics=add_metrics
    )


def metrics_url(cfg: LakesinkConfig) -> str | None:
    """Where a running ingestion of this configuration serves its metrics (None when
    `metrics.port` is unset or 0, a port only the ingestion knows)."""
    port = cfg["metrics.port"]
    if not port:
        return None
    host = cfg["metrics.host"]
    host = "127.0.0.1" if host in ("0.0.0.0", "") else "[::1]" if host == "::" else host
    return f"http://{host}:{port}/metrics"


def status_metrics(
    cfg: LakesinkConfig, st: dict[str, Any], table: str | None = None
) -> tuple[str | None, Snapshot]:
    """The metrics as the endpoint names them: the running ingestion's samples when its
    endpoint answers, with the partition gauges and pending epochs computed here (fresher).
    Of the samples with a `table` label, only those of `table` (default: the table's name):
    a many-table ingestion's endpoint serves every table's."""
    from lakesink.metrics import IngestionMetrics, scrape, table_samples
    from lakesink.protocol.offsets import TopicPartition

    label = table or cfg.table_name
    computed = IngestionMetrics(
        writer_id=cfg.writer_id, table=str(cfg["table.path"]), table_names=[label]
    )
    for p in st["partitions"]:
        tp = TopicPartition.parse(p["partition"])
        computed.set_partition(tp.topic, tp.partition, p["committed"], p["high_watermark"])
    if "pending" in st:
        computed.set_pending_epochs(len(st["pending"]["pending_epochs"]))
    ours = computed.snapshot()
    computed.close()
    url = metrics_url(cfg)
    live: Snapshot = {}
    if url is not None:
        try:
            live = scrape(url)
        except OSError:  # no ingestion running (or not reachable): computed values only
            url = None
    partition_gauges = {
        "lakesink_partition_committed_offset",
        "lakesink_partition_high_watermark",
        "lakesink_partition_lag",
    }
    if "pending" in st:
        partition_gauges.add("lakesink_pending_epochs")
    merged = {k: v for k, v in table_samples(live, label).items() if k not in partition_gauges}
    merged.update({k: v for k, v in ours.items() if k in partition_gauges})
    return url, dict(sorted(merged.items()))


def collect_tables_status(cfg: LakesinkConfig) -> dict[str, dict[str, Any]]:
    """Each table's status of a many-table ingestion by name (the tables section's, then the
    dynamic tables found so far), each with its own table's metrics."""
    from lakesink.spark.table_offsets import all_table_configs

    return {spec.name: collect_status(table, spec.name) for spec, table in all_table_configs(cfg)}


def run_status(cfg: LakesinkConfig, *, as_json: bool, watch_s: float | None = None) -> int:
    if cfg["tables"]:  # many tables: each one's status, by name
        if watch_s is not None:
            from lakesink.cli.watch import watch_tables

            watch_tables(cfg, interval_s=watch_s, collect=collect_tables_status)
            return 0
        from lakesink.spark.table_offsets import all_table_configs

        statuses = {
            spec.name: (table, collect_status(table, spec.name))
            for spec, table in all_table_configs(cfg)
        }
        if as_json:
            emit_json({name: st for name, (_table, st) in statuses.items()})
        else:
            for name, (table, st) in statuses.items():
                say(f"table {name}:")
                plugin_of(table.settings).print_status(st)
        return 0
    if watch_s is not None:
        from lakesink.cli.watch import watch_status

        watch_status(cfg, interval_s=watch_s, collect=collect_status)
        return 0
    st = collect_status(cfg)
    if as_json:
        emit_json(st)
    else:
        plugin_of(cfg.settings).print_status(st)
    return 0
