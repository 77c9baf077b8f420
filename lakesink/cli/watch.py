"""`lakesink status --watch`: a live terminal view of lag per partition, rates and recent
instants (Hudi) or snapshots (Iceberg) with their UTC times, refreshed every few seconds (rich);
for a many-table ingestion, a row per table (`render_tables`).

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
STALLED_MIN_S = 5.0  # trigger.interval.s=0 (or tiny): a batch itself takes a second or more
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
    if stalled(state, total_lag, trigger_s):
        assert trigger_s is not None
        body.append(
            Text(
                f"writer {st['writer_id']}: no commit for {quiet:,.0f}s "
                f"({_stall_limit(trigger_s)}) with {total_lag:,} offsets "
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


def last_commit_unix_s(st: dict[str, Any]) -> float | None:
    """When the table's last commit completed (Unix seconds; None: none, or no table yet):
    the completion time of the last completed Hudi instant listed, or the time of the
    latest Iceberg snapshot."""
    table = st.get("table")
    if not table:
        return None
    if st.get("format") == "iceberg":
        stamps = [r["timestamp_ms"] for r in table.get("recent", ()) if r.get("timestamp_ms")]
        return max(stamps) / 1000 if stamps else None
    for text in reversed(table.get("instants", ())):
        m = _INSTANT.match(text)
        if m is not None and m.group(3) == "completed":
            return _unix_s(m.group(4) or m.group(1))
    return None


def _unix_s(instant_time: str) -> float:
    at = datetime.strptime(instant_time[:14], "%Y%m%d%H%M%S").replace(tzinfo=UTC)
    return at.timestamp() + int(instant_time[14:17]) / 1000


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:,.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:,.0f}m ago"
    return f"{seconds / 3600:,.1f}h ago"


def stalled(state: WatchState, lag: int, trigger_s: float | None) -> bool:
    """Whether a writer with `lag` offsets to ingest has not moved its committed offsets for
    more than STALLED_TRIGGERS triggers, and at least STALLED_MIN_S seconds (stopped, crashed
    or stuck)."""
    if trigger_s is None or lag <= 0:
        return False
    return state.quiet_s() > stall_after_s(trigger_s)


def stall_after_s(trigger_s: float) -> float:
    return max(STALLED_TRIGGERS * trigger_s, STALLED_MIN_S)


def _stall_limit(trigger_s: float | None) -> str:
    if trigger_s is None:  # stalled() flags nothing without a trigger
        return ""
    return (
        f"more than {stall_after_s(trigger_s):g}s: {STALLED_TRIGGERS} triggers of "
        f"{trigger_s:g}s, at least {STALLED_MIN_S:g}s"
    )


def render_tables(
    statuses: dict[str, dict[str, Any]],
    states: dict[str, WatchState],
    interval_s: float,
    trigger_s: float | None = None,
    now_unix_s: float | None = None,
) -> Group:
    """One frame of the view of a many-table ingestion: a row per table (its format, lag,
    offsets and records per second, the age of its last commit), a table whose offsets
    stopped moving while it has lag flagged (`stalled`)."""
    now = time.time() if now_unix_s is None else now_unix_s
    clock = time.strftime("%H:%M:%S", time.gmtime(now))
    writer = next((st["writer_id"] for st in statuses.values()), "")
    title = Text.assemble(
        ("lakesink status", "bold"),
        Text(f"  writer {writer}  {len(statuses)} tables  "),
        (f"{clock} UTC, every {interval_s:g}s, refresh {_refreshes(states)}", "dim"),
    )
    rows = Table(title="tables", title_justify="left", expand=False)
    for column in ("table", "format", "lag", "offsets/s", "records/s", "last commit", "state"):
        rows.add_column(column, justify="left" if column in ("table", "format") else "right")
    flagged: list[Text] = []
    total_lag = 0
    for name, st in statuses.items():
        state = states.get(name) or WatchState()
        lag = sum(p["lag"] or 0 for p in st["partitions"])
        total_lag += lag
        rate = sum(state.rates.values()) if state.rates else None
        last = last_commit_unix_s(st)
        if st.get("table") is None:
            condition = Text("not created yet", style="dim")
        elif stalled(state, lag, trigger_s):
            condition = Text("stopped?", style="bold red")
            flagged.append(
                Text(
                    f"table {name}: no commit for {state.quiet_s():,.0f}s "
                    f"({_stall_limit(trigger_s)}) with {lag:,} offsets "
                    "to ingest: is the ingestion stopped or stuck? See its log.",
                    style="bold red",
                )
            )
        else:
            condition = Text("ok", style="green")
        rows.add_row(
            Text(name),
            st.get("format") or "hudi",
            Text(f"{lag:,}", style="yellow" if lag else "green"),
            "-" if rate is None else f"{rate:,.0f}",
            "-" if state.records_per_s is None else f"{state.records_per_s:,.0f}",
            "-" if last is None else _age(now - last),
            condition,
        )
    summary = [f"total lag {total_lag:,}"]
    rates = [sum(s.rates.values()) for s in states.values() if s.rates]
    if rates:
        summary.append(f"{sum(rates):,.0f} offsets/s over the tables")
    body: list[Any] = [title, rows, Text("  ".join(summary)), *flagged]
    with_dead = [st for st in statuses.values() if "dead_letter_table" in st]
    if with_dead:  # one dead-letter table for the ingestion
        dead = with_dead[0]["dead_letter_table"]
        body.append(
            Text("dead-letter table: not created yet", style="dim")
            if dead is None
            else Text(f"dead-letter table {dead['name']}: {dead['records']:,} records")
        )
    return Group(*body)


def _refreshes(states: dict[str, WatchState]) -> int:
    return max((s.refreshes for s in states.values()), default=0)


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


def watch_tables(
    cfg: LakesinkConfig,
    *,
    interval_s: float,
    collect: Callable[[LakesinkConfig], dict[str, dict[str, Any]]],
    console: Console | None = None,
    refreshes: int | None = None,
) -> int:
    """`watch_status` for a many-table ingestion: `collect` gathers every table's status by
    name (the tables section's, then the dynamic ones found so far), a row per table."""
    states: dict[str, WatchState] = {}
    trigger_s = float(cfg["trigger.interval.s"])
    shown = 0
    try:
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while True:
                statuses = collect(cfg)
                now = time.monotonic()
                for name, st in statuses.items():
                    states.setdefault(name, WatchState()).update(st, now)
                live.update(render_tables(statuses, states, interval_s, trigger_s), refresh=True)
                shown += 1
                if refreshes is not None and shown >= refreshes:
                    break
                time.sleep(interval_s)
    except KeyboardInterrupt:
        pass
    return shown
