"""`lakesink status`: committed offset, high watermark and lag per partition; recent instants;
the offsets the writer passed over because Kafka deleted them before they were read; the
metrics (the partition gauges computed here, and what a running ingestion's endpoint serves
when `metrics.port` is set). `--watch` shows it live (lakesink.cli.watch)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from lakesink.cli.output import emit_json, say, table
from lakesink.config import LakesinkConfig
from lakesink.errors import TableNotFoundError
from lakesink.formats import plugin_of
from lakesink.formats.hudi.writer_state import LOST_KEY, SKIPPED_KEY
from lakesink.metrics import Snapshot


def collect_status(cfg: LakesinkConfig) -> dict[str, Any]:
    from lakesink.formats.hudi.table.archive import load_archived_view
    from lakesink.formats.hudi.table.hudi_table import HudiTable
    from lakesink.formats.hudi.table.view import FileSystemView
    from lakesink.formats.hudi.writer_state import committed_offsets_at
    from lakesink.spark.pipeline import high_watermarks

    committed = committed_offsets_at(cfg.table_storage, cfg.writer_id)
    marks = high_watermarks(cfg)
    partitions = []
    for tp in sorted(set(marks) | set(committed.next_offsets)):
        pos = committed.get(tp)
        hi = marks.get(tp)
        lag = None if hi is None else hi - (pos or 0)
        partitions.append(
            {"partition": tp.key(), "committed": pos, "high_watermark": hi, "lag": lag}
        )
    out: dict[str, Any] = {"writer_id": cfg.writer_id, "partitions": partitions}
    if cfg["commit.mode"] == "async":
        from lakesink.engine.async_commit import pending_summary
        from lakesink.spark.pipeline import pending_store_for

        store = pending_store_for(cfg)
        try:
            out["pending"] = pending_summary(store, cfg.writer_id)
        finally:
            store.close()
    out["metrics_source"], out["metrics"] = status_metrics(cfg, out)
    try:
        tbl = HudiTable.open(cfg.table_storage)
    except TableNotFoundError:
        out["table"] = None
        return out
    out["skipped"] = skipped_spans(tbl, cfg.writer_id)
    out["lost"] = skipped_spans(tbl, cfg.writer_id, key=LOST_KEY)
    timeline = tbl.timeline()
    files = FileSystemView(tbl).latest_base_files()
    archived = load_archived_view(tbl.storage)
    out["table"] = {
        "path": tbl.uri,
        "version": tbl.config.version,
        "files": len(files),
        "active_instants": len(timeline.instants),
        "archived_up_to": str(archived.upto) if archived is not None else None,
        "instants": [str(i) for i in timeline.instants[-10:]],
        "inflight": [str(i) for i in timeline.inflight_or_requested()],
    }
    return out


def collect_iceberg(cfg: LakesinkConfig) -> dict[str, Any]:
    """`collect_status` of an Iceberg table: its status and the metrics, as for Hudi."""
    from lakesink.formats.iceberg.inspection import collect_iceberg_status

    out = collect_iceberg_status(cfg)
    out["metrics_source"], out["metrics"] = status_metrics(cfg, out)
    return out


def metrics_url(cfg: LakesinkConfig) -> str | None:
    """Where a running ingestion of this configuration serves its metrics (None when
    `metrics.port` is unset or 0, a port only the ingestion knows)."""
    port = cfg["metrics.port"]
    if not port:
        return None
    host = cfg["metrics.host"]
    host = "127.0.0.1" if host in ("0.0.0.0", "") else "[::1]" if host == "::" else host
    return f"http://{host}:{port}/metrics"


def status_metrics(cfg: LakesinkConfig, st: dict[str, Any]) -> tuple[str | None, Snapshot]:
    """The metrics as the endpoint names them: the running ingestion's samples when its
    endpoint answers, with the partition gauges and pending epochs computed here (fresher)."""
    from lakesink.metrics import IngestionMetrics, scrape
    from lakesink.protocol.offsets import TopicPartition

    computed = IngestionMetrics(writer_id=cfg.writer_id, table=str(cfg["table.path"]))
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
    merged = {k: v for k, v in live.items() if k not in partition_gauges}
    merged.update({k: v for k, v in ours.items() if k in partition_gauges})
    return url, dict(sorted(merged.items()))


def skipped_spans(table: Any, writer_id: str, *, key: str = SKIPPED_KEY) -> list[dict[str, Any]]:
    """Every span of offsets the writer's commits passed over (kafka.fail.on.data.loss=false):
    deleted from Kafka before they were read (SKIPPED_KEY), or lost by the broker after a batch
    was planned over them (LOST_KEY)."""
    from lakesink.formats.hudi.audit import completed_commits
    from lakesink.formats.hudi.writer_state import WRITER_ID_KEY

    out: list[dict[str, Any]] = []
    for instant, metadata in completed_commits(table):
        extra = metadata.extra
        if extra.get(WRITER_ID_KEY) != writer_id or key not in extra:
            continue
        for partition, start, end in json.loads(extra[key]):
            out.append(
                {
                    "partition": partition,
                    "from": start,
                    "to": end,
                    "records": end - start,
                    "instant": instant.time.value,
                }
            )
    return out


def run_status(cfg: LakesinkConfig, *, as_json: bool, watch_s: float | None = None) -> int:
    collect, show = _STATUS_OF_FORMAT[plugin_of(cfg).name]
    if watch_s is not None:
        from lakesink.cli.watch import watch_status

        watch_status(cfg, interval_s=watch_s, collect=collect)
        return 0
    st = collect(cfg)
    if as_json:
        emit_json(st)
    else:
        show(st)
    return 0


def print_iceberg(st: dict[str, Any]) -> None:
    from lakesink.formats.iceberg.inspection import print_iceberg_status

    print_iceberg_status(st)


def print_status(st: dict[str, Any]) -> None:
    """`collect_status`'s status of a Hudi table as text."""
    say(f"writer {st['writer_id']}")
    rows = [
        [p["partition"], p["committed"], p["high_watermark"], p["lag"]] for p in st["partitions"]
    ]
    say(table(["partition", "committed", "high watermark", "lag"], rows))
    if "pending" in st:
        p = st["pending"]
        lag = "-" if p["commit_lag_s"] is None else f"{p['commit_lag_s']:.1f}s"
        say(
            f"async commit: {len(p['pending_epochs'])} pending epochs, commit lag {lag}, "
            f"last committed epoch {p['latest_committed_epoch']}"
        )
    if st["table"] is None:
        say("table: not created yet")
        return
    if st["skipped"]:
        say(f"\nskipped (deleted from Kafka before they were read): {len(st['skipped'])} spans")
        say(
            table(
                ["partition", "from", "to", "offsets", "instant"],
                [
                    [s["partition"], s["from"], s["to"], s["records"], s["instant"]]
                    for s in st["skipped"]
                ],
            )
        )
    if st["lost"]:
        say(
            f"\nlost (the broker's log end moved back below a planned batch): "
            f"{len(st['lost'])} spans"
        )
        say(
            table(
                ["partition", "from", "to", "offsets", "instant"],
                [
                    [s["partition"], s["from"], s["to"], s["records"], s["instant"]]
                    for s in st["lost"]
                ],
            )
        )
    t = st["table"]
    say(f"\ntable {t['path']} (version {t['version']}): {t['files']} files")
    archived = f", archived up to {t['archived_up_to']}" if t["archived_up_to"] else ""
    say(f"timeline: {t['active_instants']} active instants{archived}")
    say("last instants:")
    for i in t["instants"]:
        say(f"  {i}")
    if t["inflight"]:
        say("inflight: " + ", ".join(t["inflight"]))


# `lakesink status` per format (their collection still lives here and in
# formats/iceberg/inspection.py, which reads Kafka's high watermarks through spark/)
_STATUS_OF_FORMAT: dict[
    str, tuple[Callable[[LakesinkConfig], dict[str, Any]], Callable[[dict[str, Any]], None]]
] = {"hudi": (collect_status, print_status), "iceberg": (collect_iceberg, print_iceberg)}
