"""A transformation as `transform.arrow` on the direct task path against the same one as
`transform.python` on Spark's DataFrame path, side by side in one run: the same topic of one
local broker ingested by `lakesink ingest`'s pipeline (Spark local[N], Hudi, sync commits) in a
child process per variant, one after the other:

- `none, direct`: no transformation (the direct path's floor);
- `arrow, direct`: `transform.arrow` applied in the tasks that read and write (no JVM rows);
- `arrow, dataframe`: the same function with `write.path=dataframe` (`mapInArrow`);
- `python, dataframe`: the DataFrame equivalent, `transform.python` (withColumn).

    python benchmarks/bench_transforms.py                       # 200,000 events, 4 batches
    python benchmarks/bench_transforms.py --events 50000 --variants arrow-direct,python-dataframe

Printed per variant: records/s end to end and in steady state (after the first batch, which
warms the JVM and the workers) and CPU microseconds per record in steady state and over the
whole run (the process tree: driver, Spark JVM, Python workers; benchmarks/procmon.py), then
each variant's steady CPU per record against `python, dataframe`. The transformation keeps every
record, so every run must write all events (checked). Writes
benchmarks/results/transforms-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from run import _child_cmd, _ratio, lakesink_config, produce, run_child, spark_row  # noqa: E402
from transform_functions import ARROW, DATAFRAME  # noqa: E402

VARIANTS: dict[str, dict[str, str]] = {
    "none-direct": {"write.path": "direct"},
    "arrow-direct": {"transform.arrow": ARROW, "write.path": "direct"},
    "arrow-dataframe": {"transform.arrow": ARROW, "write.path": "dataframe"},
    "python-dataframe": {"transform.python": DATAFRAME, "write.path": "dataframe"},
}
BASELINE = "python-dataframe"


def ingest_each(
    bootstrap: str, topic: str, events: int, work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Each variant's run of the same topic, one after the other, with its figures."""
    rows: dict[str, Any] = {}
    for name in args.variants.split(","):
        cfg = lakesink_config(bootstrap, topic, work / f"{name}-table", 250, events, args)
        cfg.update(VARIANTS[name])
        cfg["writer.id"] = f"bench-{name}"
        res, mon, _ = run_child(_child_cmd("spark", "lakesink", json.dumps(cfg), str(events)))
        r = spark_row(res, mon)
        steady_n = r["steady_records"]
        r["rec_s"] = r["records"] / r["wall_s"]
        r["steady_rec_s"] = steady_n / r["steady_s"] if r["steady_s"] == r["steady_s"] else None
        r["cpu_us_per_rec"] = 1e6 * r["steady_cpu_s"] / max(1, steady_n)
        r["cpu_us_per_rec_all"] = 1e6 * r["cpu_s"] / max(1, r["records"])
        if r["records"] != events:
            raise RuntimeError(f"{name}: wrote {r['records']} of {events} records")
        rows[name] = r
        print(f"{name}: {r['cpu_us_per_rec']:.1f} us/rec steady", flush=True)
    base = rows.get(BASELINE)
    ratios = {
        f"{name}/{BASELINE} cpu per record (steady)": _ratio(
            r["cpu_us_per_rec"], base["cpu_us_per_rec"]
        )
        for name, r in rows.items()
        if base is not None and name != BASELINE
    }
    return {"events": events, "runs": rows, "ratios": ratios}


def _num(v: float | None, fmt: str) -> str:
    return format(v, fmt) if v is not None and v == v else "-"


def print_result(result: dict[str, Any]) -> None:
    print(f"\n{result['events']:,} events of ~250 B, same topic, one run")
    head = ("", "rec/s e2e", "rec/s steady", "cpu us/rec steady", "cpu us/rec all", "batches")
    print("{:<18}{:>12}{:>14}{:>19}{:>16}{:>9}".format(*head))
    for name, r in result["runs"].items():
        print(
            f"{name:<18}{_num(r['rec_s'], ',.0f'):>12}{_num(r['steady_rec_s'], ',.0f'):>14}"
            f"{_num(r['cpu_us_per_rec'], ',.1f'):>19}{_num(r['cpu_us_per_rec_all'], ',.1f'):>16}"
            f"{r['batches']:>9}"
        )
    for name, v in result["ratios"].items():
        print(f"  {name}: {_num(v, '.2f')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000, help="~250-byte events")
    ap.add_argument("--per-batch", type=int, default=50_000, help="kafka.max.records.per.batch")
    ap.add_argument("--cores", type=int, default=2, help="Spark local[N]")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, in order")
    ap.add_argument("--broker", choices=("kafka", "noida"), default="kafka")
    ap.add_argument("--spark-conf", default="", help="extra Spark settings 'k=v,k=v'")
    ap.add_argument("--out", default=None, help="JSON file (default benchmarks/results/...)")
    args = ap.parse_args()
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(sorted(unknown))}; valid: {', '.join(VARIANTS)}")
    # the children's Spark workers import the transformation functions from here
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else HERE / "results" / f"transforms-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cores": args.cores,
        "cpus": os.cpu_count(),
        "load_avg_at_start": os.getloadavg(),
    }
    work = Path(tempfile.mkdtemp(prefix="lakesink-transforms-"))
    from lakesink.kafka.kafka_server import local_broker

    broker = local_broker(args.broker, data_dir=work / "broker")
    broker.start()
    try:
        bs = broker.bootstrap_servers
        t0 = time.perf_counter()
        produce(bs, "bench-transforms", args.events, 250)
        print(f"produced {args.events:,} events in {time.perf_counter() - t0:.1f}s", flush=True)
        report["ingest"] = ingest_each(bs, "bench-transforms", args.events, work, args)
        print_result(report["ingest"])
    finally:
        broker.close()
        shutil.rmtree(work, ignore_errors=True)
    report["load_avg_at_end"] = os.getloadavg()
    out.write_text(json.dumps(report, indent=2))
    print(
        f"\nload average at start {report['load_avg_at_start']}, at end {report['load_avg_at_end']}"
    )
    print(f"results: {out}")


if __name__ == "__main__":
    main()
