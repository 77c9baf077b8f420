"""`lakesink status --watch`'s view without a table or broker: instants as UTC times, rates
smoothed across refreshes, a writer with lag and no commit for several triggers flagged."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from lakesink.cli.watch import (
    SMOOTHING_S,
    STALLED_TRIGGERS,
    WatchState,
    instant_columns,
    render,
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
