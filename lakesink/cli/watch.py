"""`lakesink status --watch`: a live terminal view of lag per partition, rates and recent
instants (Hudi) or snapshots (Iceberg) with their UTC times, refreshed every few seconds (rich).

Rates are smoothed over about `SMOOTHING_S` seconds: a micro-batch writer commits in steps, and
a refresh that caught a commit next to one that did not would otherwise swing between thousands
and 0. A writer whose committed offsets have not moved for more than `STALLED_TRIGGERS` trigger
intervals while there is lag is flagged (stopped, crashed or stuck)."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from lakesink.config import LakesinkConfig
from lakesink.metrics import value_of

RECENT_INSTANTS = 8
SMOOTHING_S = 10.0
"""Time constant of the rates' exponential average, in seconds."""
STALLED_TRIGGERS = 3
"""Flag a writer with lag whose offsets have not moved for more than this many triggers."""

_INSTANT = re.compile(r"^(\d{17})\.(\w+) \[(\w+)(?: done (\d{17}))?\]$")


def _smoothed(previous: float | None, current: float, dt: float) -> float:
    if previous is None:
        return current
    return previous + (1 - math.exp(-dt / SMOOTHING_S)) * (current - previous)


@dataclass
class WatchState:
    """What the view remembers between refreshes: smoothed rates, and when the writer's
    committed offsets last moved."""

    refreshes: int = 0
    at: float | None = None
    committed: dict[str, int] = field(default_factory=dict)
    records: float | None = None
    rates: dict[str, float] = field(default_factory=dict)
    records_per_s: float | None = None
    moved_at: float | None = None
    """When the committed offsets last changed (or the first refresh)."""

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
                k: _smoothed(self.rates.get(k), max(0, v - self.committed.get(k, v)) / dt, dt)
                for k, v in committed.items()
            }
            self.records_per_s = (
                None
                if records is None or self.records is None
                else _smoothed(self.records_per_s, max(0.0, records - self.records) / dt, dt)
            )
        if self.moved_at is None or committed != self.committed:
            self.moved_at = now
        self.at, self.committed, self.records = now, committed, records
        self.refreshes += 1

    def quiet_s(self) -> float:
        """Seconds the committed offsets have not moved, as far as this view saw."""
        return 0.0 if self.at is None or self.moved_at is None else self.at - self.moved_at


def utc_time(instant_time: str, today: str | None = None) -> str:
    """`yyyyMMddHHmmssSSS` as `HH:MM:SS.mmm`, with the date in front when it is not `today`
    (`YYYY-MM-DD`, default: now's)."""
    t = instant_time
    day = f"{t[0:4]}-{t[4:6]}-{t[6:8]}"
    clock = f"{t[8:10]}:{t[10:12]}:{t[12:14]}.{t[14:17]}"
    today = today or datetime.now(UTC).strftime("%Y-%m-%d")
    return clock if day == today else f"{day} {clock}"


def instant_columns(text: str, today: str | None = None) -> tuple[str, str, str, str]:
    """A timeline instant as status lists it (`20261127133112345.commit [completed done ...]`):
    its UTC time, action, state (with the completion time) and the raw instant time, which
    `lakesink table` commands take. Text of another shape comes back as it is."""
    m = _INSTANT.match(text)
    if m is None:
        return "", "", text, ""
    t, action, state, done = m.groups()
    state_text = state if done is None else f"{state} at {utc_time(done, today)}"
    return utc_time(t, today), action, state_text, t


def render(
    st: dict[str, Any], state: WatchState, interval_s: float, trigger_s: float | None = None
) -> Group:
    """One frame of the view; `trigger_s`: the writer's trigger interval (flags it stalled)."""
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
    quiet = state.quiet_s()
    if trigger_s is not None and total_lag > 0 and quiet > STALLED_TRIGGERS * trigger_s:
        body.append(
            Text(
                f"writer {st['writer_id']}: no commit for {quiet:,.0f}s (more than "
                f"{STALLED_TRIGGERS} triggers of {trigger_s:g}s) with {total_lag:,} offsets "
                "to ingest: is it stopped or stuck? See its log.",
                style="bold red",
            )
        )
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
        for column in ("time (UTC)", "snapshot", "operation", "writer", "records", "files"):
            snapshots.add_column(
                column, justify="right" if column in ("records", "files") else "left"
            )
        for r in table["recent"][-RECENT_INSTANTS:][::-1]:
            ms = r.get("timestamp_ms")
            when = "" if ms is None else utc_time(_instant_of_ms(int(ms)))
            snapshots.add_row(
                when,
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
        for column in ("time (UTC)", "action", "state", "instant"):
            instants.add_column(column)
        for name in table["instants"][-RECENT_INSTANTS:][::-1]:
            when, action, st_text, raw = instant_columns(name)
            # Text: no rich markup in what the table names
            instants.add_row(when, action, Text(st_text), Text(raw, style="dim"))
        body.append(instants)
        if table["inflight"]:
            body.append(Text("inflight: " + ", ".join(table["inflight"]), style="yellow"))
    return Group(*body)


def _instant_of_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y%m%d%H%M%S%f")[:17]


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
    trigger_s = float(cfg["trigger.interval.s"])
    try:
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while True:
                st = collect(cfg)
                state.update(st, time.monotonic())
                live.update(render(st, state, interval_s, trigger_s), refresh=True)
                if refreshes is not None and state.refreshes >= refreshes:
                    break
                time.sleep(interval_s)
    except KeyboardInterrupt:
        pass
    return state.refreshes
