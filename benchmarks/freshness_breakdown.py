"""Where a record's freshness went (issue 33, item 1): the freshness benchmark's split of
(visible - appended) into the steps of the batch that carried the record, from lakesink's
progress lines (`(spark 0.05 s, begin 0.01 s, write 0.62 s, commit 0.03 s; published
07:01:02.345)`) and Spark's offset log (the batch's ranges).

For a record appended at `a`, in a batch planned at `planned`, that reached lakesink's sink at
`started`, began its instants at `begun`, had its files written at `written` and was published
at `published`, and first read by the reader at `visible`:

    kafka   = planned - a           waiting in Kafka for a batch to be planned
    spark   = started - planned     Spark between planning and running the batch
    begin   = begun - started       the instants begin (and, async, the wait for the last one)
    write   = written - begun       the batch's Spark job: read, decode, write the files
    commit  = published - written   reconcile, lock and publish
    reader  = visible - published   the reader's poll interval and its read

(a batch's `after` step, its inline table services after publishing, is on no record's path of
its own batch: the next batch waits for it, so it shows in that batch's records' `kafka`.)

whose sum is exactly visible - a. Pure logic, no I/O: unit-tested in
tests/unit/test_freshness_breakdown.py."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np

STEPS = ("kafka", "spark", "begin", "write", "commit", "reader")

_LINE = re.compile(
    r"batch (\d+): .*\+([\d,]+) rec .*\(((?:\w+ [\d.]+ s(?:, )?)+); published "
    r"(\d\d):(\d\d):(\d\d)\.(\d{3})\)"
)


@dataclass(frozen=True)
class Batch:
    """One batch's wall-clock step times and the offsets it carried: {partition: (from, to)},
    `to` exclusive."""

    batch_id: int
    records: int
    planned: float
    started: float
    begun: float
    written: float
    published: float
    ranges: Mapping[int, tuple[int, int]]
    after: float = 0.0  # seconds after publishing (inline table services): the next batch waits
    publish: float = 0.0  # of `commit`, the publish (lock, checks, write)

    def step_seconds(self) -> dict[str, float]:
        return {
            "spark": self.started - self.planned,
            "begin": self.begun - self.started,
            "write": self.written - self.begun,
            "commit": self.published - self.written,
        }


def parse_progress(line: str, near: float) -> tuple[int, int, dict[str, float], float] | None:
    """(batch id, records, seconds per step, published as epoch seconds) of a progress line,
    None for other lines. The published time of day is local time; `near` (an epoch time within
    12 hours of it) gives the day."""
    m = _LINE.search(line)
    if m is None:
        return None
    steps = {}
    for part in m.group(3).split(", "):
        name, secs, _ = part.split(" ")
        steps[name] = float(secs)
    hh, mm, ss, ms = (int(g) for g in m.group(4, 5, 6, 7))
    day = datetime.fromtimestamp(near).replace(hour=hh, minute=mm, second=ss, microsecond=0)
    candidates = [(day + timedelta(days=d)).timestamp() + ms / 1000 for d in (-1, 0, 1)]
    published = min(candidates, key=lambda t: abs(t - near))
    return int(m.group(1)), int(m.group(2).replace(",", "")), steps, published


def batch_from(
    batch_id: int,
    records: int,
    steps: Mapping[str, float],
    published: float,
    ranges: Mapping[int, tuple[int, int]],
    planned: float | None = None,
) -> Batch:
    """A Batch from a progress line's figures (rounded to 10 ms there), going back from its
    published time; `planned` (the offset log's time) when the line has no `spark` step."""
    written = published - steps["commit"]
    begun = written - steps["write"]
    started = begun - steps["begin"]
    if "spark" in steps:
        planned = started - steps["spark"]
    return Batch(
        batch_id,
        records,
        started if planned is None else planned,
        started,
        begun,
        written,
        published,
        dict(ranges),
        steps.get("after", 0.0),
        steps.get("publish", 0.0),
    )


def _quantile(ordered: Sequence[float], q: float) -> float:
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def batch_of(partitions: np.ndarray, offsets: np.ndarray, batches: Sequence[Batch]) -> np.ndarray:
    """For each (partition, offset), the index in `batches` of the batch whose ranges hold it,
    -1 where none does."""
    out = np.full(len(offsets), -1, dtype=np.int64)
    for p in np.unique(partitions):
        spans = sorted(
            (lo, hi, i)
            for i, b in enumerate(batches)
            for q, (lo, hi) in b.ranges.items()
            if q == p and hi > lo
        )
        if not spans:
            continue
        starts = np.array([s[0] for s in spans], dtype=np.int64)
        ends = np.array([s[1] for s in spans], dtype=np.int64)
        ids = np.array([s[2] for s in spans], dtype=np.int64)
        mask = partitions == p
        j = np.searchsorted(starts, offsets[mask], side="right") - 1
        ok = (j >= 0) & (offsets[mask] < ends[np.maximum(j, 0)])
        out[np.flatnonzero(mask)[ok]] = ids[j[ok]]
    return out


def summarize(
    partitions: np.ndarray,
    offsets: np.ndarray,
    appended: np.ndarray,
    visible: np.ndarray,
    batches: Sequence[Batch],
) -> dict[str, object]:
    """The breakdown of records (arrays: partition, offset, appended and visible epoch
    seconds): per step its p50, p99 and mean over all records, and its mean over the slowest 1%
    (freshness ≥ p99: what the tail is made of); records that no batch's ranges hold are
    counted apart."""
    which = batch_of(partitions, offsets, batches)
    ok = which >= 0
    out: dict[str, object] = {"records": int(ok.sum()), "unmatched": int((~ok).sum())}
    if not ok.any():
        return out
    b = which[ok]
    a, v = appended[ok], visible[ok]

    def per_batch(attr: str) -> np.ndarray:
        return np.array([getattr(x, attr) for x in batches], dtype=np.float64)[b]

    planned, started, begun = per_batch("planned"), per_batch("started"), per_batch("begun")
    written, published = per_batch("written"), per_batch("published")
    values = {
        "kafka": planned - a,
        "spark": started - planned,
        "begin": begun - started,
        "write": written - begun,
        "commit": published - written,
        "reader": v - published,
    }
    fresh = v - a
    order = np.argsort(fresh, kind="stable")
    tail = order[min(len(order) - 1, int(0.99 * len(order))) :]
    steps: dict[str, dict[str, float]] = {}
    for s in STEPS:
        ordered = np.sort(values[s])
        steps[s] = {
            "p50": _quantile(ordered, 0.50),  # type: ignore[arg-type]
            "p99": _quantile(ordered, 0.99),  # type: ignore[arg-type]
            "mean": float(values[s].mean()),
            "tail_mean": float(values[s][tail].mean()),
        }
    out["steps"] = steps
    out["freshness_p99"] = float(fresh[tail[0]])
    carried = [batches[i] for i in np.unique(b)]  # the batches that carried these records
    durations = sorted(x.published - x.planned for x in carried)
    sizes = sorted(x.records for x in carried)
    out["batches"] = len(carried)
    out["batch_s"] = {"p50": _quantile(durations, 0.5), "max": durations[-1]}
    out["batch_records"] = {"p50": int(_quantile(sizes, 0.5)), "max": sizes[-1]}
    pubs = sorted(x.publish for x in carried)
    rest = sorted(x.published - x.written - x.publish for x in carried)
    out["publish_s"] = {
        "p50": _quantile(pubs, 0.5),
        "max": pubs[-1],
        "rest_p50": _quantile(rest, 0.5),
        "rest_max": rest[-1],
    }
    after = sorted(x.after for x in carried)
    out["after_s"] = {
        "p50": _quantile(after, 0.5),
        "max": after[-1],
        "total": sum(after),
        "over_1s": sum(1 for x in after if x > 1.0),
    }
    return out


def format_summary(summary: Mapping[str, object]) -> str:
    """The breakdown as a few printed lines."""
    steps = summary.get("steps")
    if not isinstance(steps, dict):
        return f"breakdown: no record matched a batch ({summary.get('unmatched', 0)} unmatched)"
    lines = [
        f"breakdown of {summary['records']:,} records ({summary['unmatched']:,} unmatched), "
        f"{summary['batches']} batches, seconds: p50 / p99 / mean / mean over the slowest 1%"
    ]
    for s in STEPS:
        v = steps[s]
        lines.append(
            f"  {s:>7} {v['p50']:7.3f} {v['p99']:7.3f} {v['mean']:7.3f} {v['tail_mean']:7.3f}"
        )
    bs, br = summary.get("batch_s"), summary.get("batch_records")
    if isinstance(bs, dict) and isinstance(br, dict):
        lines.append(
            f"  a batch, planned to published: p50 {bs['p50']:.2f} s, max {bs['max']:.2f} s; "
            f"records a batch: p50 {br['p50']:,}, max {br['max']:,}"
        )
    pub = summary.get("publish_s")
    if isinstance(pub, dict):
        lines.append(
            f"  of a batch's commit, the publish (lock, checks, write): p50 {pub['p50']:.2f} s, "
            f"max {pub['max']:.2f} s; the rest (reconcile, schema): p50 {pub['rest_p50']:.2f} s, "
            f"max {pub['rest_max']:.2f} s"
        )
    af = summary.get("after_s")
    if isinstance(af, dict):
        lines.append(
            f"  after publishing (inline table services; the next batch waits): p50 "
            f"{af['p50']:.2f} s, max {af['max']:.2f} s, {af['total']:.1f} s in all, "
            f"{af['over_1s']} batches over 1 s"
        )
    return "\n".join(lines)
