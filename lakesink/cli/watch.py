"""`lakesink status --watch`: a live terminal view of lag per partition, rates and recent
instants (Hudi) or snapshots (Iceberg), refreshed every few seconds (rich)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from lakesink.config import LakesinkConfig
from lakesink.metrics import value_of

RECENT_INSTANTS = 8


@dataclass
class WatchState:
    """What the view remembers between refreshes to show rates."""

    refreshes: int = 0
    at: float | None = None
    committed: dict[str, int] = field(default_factory=dict)
    records: float | None = None
    rates: dict[str, float] = field(default_factory=dict)
    records_per_s: float | None = None

    def update(self, st: dict[str, Any], now: float) -> None:
        committed = {p["partition"]: p["committed"] or 0 for p in st["partitions"]}
        records = (
            value_of(st["metrics"], "lakesink_records_ingested_total")
            if "lakesink_records_ingested_total" in st.get("metrics", {})
            else None
        )
        if self.at is not None and now > self.at:
            dt = now - self.at
            self.rates = {
                k: max(0, v - self.committed.get(k, v)) / dt for k, v in committed.items()
            }
            self.records_per_s = (
                None
                if records is None or self.records is None
                else max(0.0, records - self.records) / dt
            )
        self.at, self.committed, self.records = now, committed, records
        self.refreshes += 1


def render(st: dict[str, Any], state: WatchState, interval_s: float) -> Group:
    """One frame of the view."""
    clock = time.strftime("%H:%M:%S", time.gmtime())
    title = Text.assemble(
        ("lakesink status", "bold"),
        Text(f"  writer {st['writer_id']}  "),
        (f"{clock} UTC, every {interval_s:g}s, refresh {state.refreshes}", "dim"),
    )
    parts: Table = Table(title="partitions", title_justify="left", expand=False)
    for column in ("partition", "committed", "high watermark", "lag", "offsets/s"):
        parts.add_column(column, justify="left" if column == "partition" else "right")
    total_lag = 0
    for p in st["partitions"]:
        lag = p["lag"]
        total_lag += lag or 0
        rate = state.rates.get(p["partition"])
        parts.add_row(
            Text(p["partition"]),
            _num(p["committed"]),
            _num(p["high_watermark"]),
            Text(_num(lag), style="yellow" if lag else "green"),
            "-" if rate is None else f"{rate:,.0f}",
        )
    summary = [f"total lag {total_lag:,}"]
    if state.rates:
        summary.append(f"{sum(state.rates.values()):,.0f} offsets/s")
    metrics = st.get("metrics", {})
    if st.get("metrics_source"):
        summary.append(
            f"{value_of(metrics, 'lakesink_records_ingested_total'):,.0f} records ingested"
        )
        if state.records_per_s is not None:
            summary.append(f"{state.records_per_s:,.0f} records/s")
        errors = value_of(metrics, "lakesink_errors_total")
        if errors:
            summary.append(f"{errors:,.0f} errors")
    if "pending" in st:
        summary.append(f"{len(st['pending']['pending_epochs'])} pending epochs")
    body: list[Any] = [title, parts, Text("  ".join(summary))]
    table = st.get("table")
    if "dead_letter_table" in st:
        dead = st["dead_letter_table"]
        body.append(
            Text("dead-letter table: not created yet", style="dim")
            if dead is None
            else Text(f"dead-letter table {dead['name']}: {dead['records']:,} records")
        )
    if table is None:
        body.append(Text("table: not created yet", style="dim"))
    elif st.get("format") == "iceberg":
        snapshots = Table(title="recent snapshots", title_justify="left", expand=False)
        for column in ("snapshot", "operation", "writer", "records", "files"):
            snapshots.add_column(
                column, justify="right" if column in ("records", "files") else "left"
            )
        for r in table["recent"][-RECENT_INSTANTS:][::-1]:
            snapshots.add_row(
                str(r["snapshot_id"]),
                r["operation"],
                Text(r["writer"]),
                _num(r["added_records"]),
                _num(r["added_files"]),
            )
        body.append(snapshots)
        files = table["files"]
        body.append(
            Text(f"{table['records']:,} records in {files:,} data file{'' if files == 1 else 's'}")
        )
    else:
        instants = Table(title="recent instants", title_justify="left", expand=False)
        instants.add_column("instant")
        for name in table["instants"][-RECENT_INSTANTS:][::-1]:
            instants.add_row(Text(name))  # Text: no rich markup in "[completed ...]"
        body.append(instants)
        if table["inflight"]:
            body.append(Text("inflight: " + ", ".join(table["inflight"]), style="yellow"))
    return Group(*body)


def _num(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def watch_status(
    cfg: LakesinkConfig,
    *,
    interval_s: float,
    collect: Callable[[LakesinkConfig], dict[str, Any]],
    console: Console | None = None,
    refreshes: int | None = None,
) -> int:
    """Show the live view until Ctrl-C (or `refreshes` frames); returns the frames shown.
    `collect` gathers one frame's status (the status command hands in its `collect_status`)."""
    state = WatchState()
    try:
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while True:
                st = collect(cfg)
                state.update(st, time.monotonic())
                live.update(render(st, state, interval_s), refresh=True)
                if refreshes is not None and state.refreshes >= refreshes:
                    break
                time.sleep(interval_s)
    except KeyboardInterrupt:
        pass
    return state.refreshes
