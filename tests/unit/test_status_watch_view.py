"""`lakesink status --watch`'s view without a table or broker: instants as UTC times, rates
smoothed across refreshes, a writer with lag and no commit for several triggers flagged; with
many tables, a row per table."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from lakesink.cli.watch import (
    SMOOTHING_S,
    STALLED_MIN_S,
    STALLED_TRIGGERS,
    WatchState,
    instant_columns,
    last_commit_unix_s,
    render,
    render_tables,
    utc_time,
)


def status(committed: int, high: int, *, instants: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "writer_id": "w1",
        "partitions": [
            {"partition": "events:0", "committed": committed, "high_watermark": high,
             "lag": high - committed},
        ],
        "table": {"instants": list(instants), "inflight": []},
    }  # fmt: skip


def shown(st: dict[str, Any], state: WatchState, trigger_s: float | None = 1.0) -> str:
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(render(st, state, 1.0, trigger_s))
    return out.getvalue()


def test_instants_read_as_utc_times_and_keep_their_raw_time() -> None:
    done = "20261127133112345.commit [completed done 20261127133113002]"
    assert instant_columns(done, today="2026-11-27") == (
        "13:31:12.345",
        "commit",
        "completed at 13:31:13.002",
        "20261127133112345",
    )
    assert utc_time("20261126235959999", today="2026-11-27") == "2026-11-26 23:59:59.999"
    # a shape it does not know is shown as it is
    assert instant_columns("something else") == ("", "", "something else", "")
    text = shown(status(5, 5, instants=(done,)), WatchState())
    assert "13:31:12.345" in text and "commit" in text and "20261127133112345" in text


def test_rates_are_smoothed_over_refreshes() -> None:
    state = WatchState()
    state.update(status(0, 1000), 0.0)
    state.update(status(600, 1000), 2.0)  # a commit landed: 300 offsets/s
    first = state.rates["events:0"]
    assert first == 300
    state.update(status(600, 1000), 4.0)  # none between these two refreshes
    dropped = state.rates["events:0"]
    assert 0 < dropped < first  # eased towards 0, not a swing to it
    for t in range(6, 6 + int(10 * SMOOTHING_S), 2):
        state.update(status(600, 1000), float(t))
    assert state.rates["events:0"] < dropped / 10  # and it does get there


def test_a_writer_with_lag_and_no_commit_for_several_triggers_is_flagged() -> None:
    trigger = 2.0
    state = WatchState()
    state.update(status(100, 500), 0.0)
    state.update(status(100, 500), STALLED_TRIGGERS * trigger - 0.5)
    assert "no commit for" not in shown(status(100, 500), state, trigger)
    state.update(status(100, 500), STALLED_TRIGGERS * trigger + 0.5)
    flagged = shown(status(100, 500), state, trigger)
    assert "writer w1: no commit for" in flagged and "400 offsets to ingest" in flagged
    # it commits again: no flag
    state.update(status(200, 500), STALLED_TRIGGERS * trigger + 1.5)
    assert "no commit for" not in shown(status(200, 500), state, trigger)
    # caught up, nothing to commit: an idle writer is not a stalled one
    idle = WatchState()
    idle.update(status(500, 500), 0.0)
    idle.update(status(500, 500), 10 * STALLED_TRIGGERS * trigger)
    assert "no commit for" not in shown(status(500, 500), idle, trigger)


def test_back_to_back_triggers_flag_a_stall_only_after_the_floor() -> None:
    # trigger.interval.s=0: "3 triggers" would be no time at all
    state = WatchState()
    state.update(status(100, 500), 0.0)
    state.update(status(100, 500), STALLED_MIN_S - 0.5)
    assert "no commit for" not in shown(status(100, 500), state, 0.0)
    state.update(status(100, 500), STALLED_MIN_S + 0.5)
    flagged = shown(status(100, 500), state, 0.0)
    assert "writer w1: no commit for 6s (more than 5s: 3 triggers of 0s, at least 5s)" in flagged


def iceberg_status(
    committed: int, high: int, snapshot_ms: int | None, records: int
) -> dict[str, Any]:
    st = status(committed, high)
    st["format"] = "iceberg"
    st["table"] = {"recent": [{"timestamp_ms": snapshot_ms}] if snapshot_ms else []}
    # the table's metrics, as status_metrics keeps them (its own table's samples)
    ingested = {"labels": {"table": "europe", "topic": "events"}, "value": records}
    st["metrics"] = {"lakesink_records_ingested_total": [ingested]}
    return st


def row_of(text: str, name: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.replace("│", " ").split()[:1] == [name])
    return line.replace("│", " ").split()


def test_many_tables_show_a_row_each_with_lag_rates_last_commit_and_a_stopped_flag() -> None:
    now = 1_795_824_300.0  # 2026-11-28 00:05:00 UTC
    hudi_done = "20261128000440000.commit [completed done 20261128000445500]"  # 14.5 s before
    trigger = 2.0
    statuses = {
        "orders": status(100, 500, instants=(hudi_done, "20261128000450000.commit [inflight]")),
        "europe": iceberg_status(300, 300, int((now - 600) * 1000), 0),
        "later": {**status(0, 0), "table": None},
    }
    assert last_commit_unix_s(statuses["orders"]) == now - 14.5  # the completed one's end
    assert last_commit_unix_s(statuses["europe"]) == now - 600
    assert last_commit_unix_s(statuses["later"]) is None
    states = {name: WatchState() for name in statuses}
    for name, st in statuses.items():
        states[name].update(st, 0.0)
    moved = dict(statuses, europe=iceberg_status(400, 400, int((now - 600) * 1000), 70))
    for name, st in moved.items():
        states[name].update(st, STALLED_TRIGGERS * trigger + 1.0)  # 7 s: 100 offsets in
    out = io.StringIO()
    frame = render_tables(moved, states, 1.0, trigger, now_unix_s=now)
    Console(file=out, width=160, color_system=None).print(frame)
    text = out.getvalue()
    assert "3 tables" in text and "refresh 2" in text
    # table, format, lag, offsets/s, records/s, last commit, state
    assert row_of(text, "orders") == ["orders", "hudi", "400", "0", "-", "14s", "ago", "stopped?"]
    assert row_of(text, "europe") == ["europe", "iceberg", "0", "14", "10", "10m", "ago", "ok"]
    assert row_of(text, "later") == ["later", "hudi", "0", "0", "-", "-", "not", "created", "yet"]
    assert "table orders: no commit for 7s" in text and "400 offsets to ingest" in text
    assert "table europe: no commit" not in text  # it moved; and "later" has no lag
    assert "total lag 400" in text
