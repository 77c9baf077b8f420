"""The freshness benchmark's breakdown of a record's wait by step
(benchmarks/freshness_breakdown.py) and the progress line it parses (`steps_text`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lakesink.cli.ingest import steps_text
from lakesink.spark.sink import BatchSteps

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from freshness_breakdown import (
    STEPS,
    Batch,
    batch_from,
    batch_of,
    parse_progress,
    summarize,
)


def _batch(i: int, t0: float, ranges: dict[int, tuple[int, int]]) -> Batch:
    # planned t0, sink at +0.1, begun +0.2, written +1.2, published +1.5
    return Batch(i, 0, t0, t0 + 0.1, t0 + 0.2, t0 + 1.2, t0 + 1.5, ranges)


def test_the_steps_add_up_to_each_records_freshness() -> None:
    batches = [_batch(0, 100.0, {0: (0, 10), 1: (0, 5)}), _batch(1, 102.0, {0: (10, 20)})]
    p = np.array([0, 1, 0, 0])
    o = np.array([3, 4, 10, 19])
    a = np.array([99.0, 99.5, 101.0, 101.9])
    v = np.array([101.6, 101.7, 103.8, 103.6])
    s = summarize(p, o, a, v, batches)
    assert s["records"] == 4 and s["unmatched"] == 0
    steps = s["steps"]
    assert isinstance(steps, dict)
    total_mean = sum(steps[k]["mean"] for k in STEPS)
    assert total_mean == pytest.approx(float((v - a).mean()))
    # the record at offset 10 of partition 0 is batch 1's: planned at 102, appended at 101
    assert steps["write"]["p50"] == pytest.approx(1.0)
    assert steps["kafka"]["mean"] == pytest.approx(((100 - 99) + (100 - 99.5) + 1 + 0.1) / 4)
    # the slowest record (freshness 2.8 s, offset 10) is the tail: its reader lag is 0.3 s
    assert s["freshness_p99"] == pytest.approx(2.8)
    assert steps["reader"]["tail_mean"] == pytest.approx(0.3)


def test_records_no_batch_holds_are_counted_apart() -> None:
    batches = [_batch(0, 100.0, {0: (5, 10)})]
    which = batch_of(np.array([0, 0, 0, 1]), np.array([4, 5, 10, 7]), batches)
    assert which.tolist() == [-1, 0, -1, -1]
    s = summarize(
        np.array([0, 1]),
        np.array([6, 0]),
        np.array([99.0, 99.0]),
        np.array([102.0, 102.0]),
        batches,
    )
    assert (s["records"], s["unmatched"]) == (1, 1)


def test_a_progress_line_gives_the_batch_back() -> None:
    published = time.time()
    steps = BatchSteps(
        planned=published - 1.58,
        started=published - 1.5,
        begun=published - 1.47,
        written=published - 0.2,
        published=published,
        finished=published + 2.5,
    )
    line = (
        f"batch 7: instant 20261128070102345  +50,000 rec  total 1,000  9 rec/s{steps_text(steps)}"
    )
    parsed = parse_progress(line, near=published + 3600)
    assert parsed is not None
    batch_id, records, secs, at = parsed
    assert (batch_id, records) == (7, 50_000)
    assert secs == pytest.approx(
        {"spark": 0.08, "begin": 0.03, "write": 1.27, "commit": 0.2, "publish": 0.0, "after": 2.5}
    )
    assert at == pytest.approx(published, abs=0.001)
    b = batch_from(batch_id, records, secs, at, {0: (0, 10)})
    assert b.planned == pytest.approx(steps.planned, abs=0.02)
    assert b.written == pytest.approx(steps.written, abs=0.011)
    assert b.after == pytest.approx(2.5)
    assert parse_progress("batch 1: instant 1  +3 rec  total 3  1 rec/s", near=published) is None


def test_an_unknown_planning_time_leaves_the_spark_step_out() -> None:
    steps = BatchSteps(
        planned=None, started=10.0, begun=10.5, written=12.0, published=12.25, finished=12.5
    )
    assert steps.durations() == {
        "begin": 0.5,
        "write": 1.5,
        "commit": 0.25,
        "publish": 0.0,
        "after": 0.25,
    }
    assert "spark" not in steps_text(steps) and "commit 0.25 s" in steps_text(steps)
    assert steps_text(None) == ""
