"""Hudi and Iceberg side by side, in one run: the same topic of one local broker ingested once
into a Hudi table and once into an Iceberg table (`table.format`), each by `lakesink ingest`'s
pipeline in a child process of its own (Spark local[N], the direct task path, sync commits), then
the recovery after kill -9 of the driver mid-batch for each format.

    python benchmarks/bench_formats.py                         # 200,000 events, 4 batches
    python benchmarks/bench_formats.py --events 50000 --recovery-events 40000
    python benchmarks/bench_formats.py --skip recovery

Printed per format: records/s end to end (query start to the last commit) and in steady state
(after the first batch, which warms the JVM and the workers), and CPU microseconds per record in
steady state: the process CPU time (user + system) of the whole tree, driver, Spark JVM and
Python workers (benchmarks/procmon.py); then the Iceberg/Hudi ratios. Every run must write all
events (checked). Recovery: seconds from the kill until the restart's next commit (a completed
instant for Hudi, a snapshot for Iceberg) and until it caught up (benchmarks/recovery.py).
Writes benchmarks/results/formats-<time>.json.
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

FORMATS = ("hudi", "iceberg")


def ingest_both(
    bootstrap: str, topic: str, events: int, work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Each format's run of the same topic, one after the other, with its figures."""
    rows: dict[str, Any] = {}
    for fmt in FORMATS:
        cfg = lakesink_config(bootstrap, topic, work / f"{fmt}-table", 250, events, args)
        cfg["table.format"] = fmt
        cfg["table.name"] = "events"
        cfg["writer.id"] = f"bench-{fmt}"
        res, mon, _ = run_child(_child_cmd("spark", "lakesink", json.dumps(cfg), str(events)))
        r = spark_row(res, mon)
        steady_n = r["steady_records"]
        r["rec_s"] = r["records"] / r["wall_s"]
        r["steady_rec_s"] = steady_n / r["steady_s"] if r["steady_s"] == r["steady_s"] else None
        r["cpu_us_per_rec"] = 1e6 * r["steady_cpu_s"] / max(1, steady_n)
        r["cpu_us_per_rec_all"] = 1e6 * r["cpu_s"] / max(1, r["records"])
        if r["records"] != events:
            raise RuntimeError(f"{fmt}: wrote {r['records']} of {events} records")
        rows[fmt] = r
    hudi, ice = rows["hudi"], rows["iceberg"]
    ratios = {
        "iceberg/hudi records/s (steady)": _ratio(ice["steady_rec_s"], hudi["steady_rec_s"]),
        "iceberg/hudi records/s (end-to-end)": _ratio(ice["rec_s"], hudi["rec_s"]),
        "iceberg/hudi cpu per record (steady)": _ratio(
            ice["cpu_us_per_rec"], hudi["cpu_us_per_rec"]
        ),
        "iceberg/hudi cpu per record (whole run)": _ratio(
            ice["cpu_us_per_rec_all"], hudi["cpu_us_per_rec_all"]
        ),
    }
    return {"events": events, "runs": rows, "ratios": ratios}


def _num(v: float | None, fmt: str) -> str:
    return format(v, fmt) if v is not None and v == v else "-"


def print_ingest(result: dict[str, Any]) -> None:
    runs = result["runs"]
    print(f"\n{result['events']:,} events of ~250 B, same topic, one run")
    head = ("", "rec/s e2e", "rec/s steady", "cpu us/rec steady", "cpu us/rec all", "batches")
    print("{:<10}{:>12}{:>14}{:>19}{:>16}{:>9}".format(*head))
    for fmt in FORMATS:
        r = runs[fmt]
        print(
            f"{fmt:<10}{_num(r['rec_s'], ',.0f'):>12}{_num(r['steady_rec_s'], ',.0f'):>14}"
            f"{_num(r['cpu_us_per_rec'], ',.1f'):>19}{_num(r['cpu_us_per_rec_all'], ',.1f'):>16}"
            f"{r['batches']:>9}"
        )
    for name, v in result["ratios"].items():
        print(f"  {name}: {_num(v, '.2f')}")


def print_recovery(rows: dict[str, Any]) -> None:
    print("\nrecovery after kill -9 of the driver at after-write (batch 2 written, not committed)")
    for fmt, r in rows.items():
        print(
            f"  {fmt:<8} next commit {r['kill_to_next_commit_s']:.1f}s after the kill, caught up "
            f"after {r['kill_to_caught_up_s']:.1f}s ({r['events']:,} events, "
            f"{r['records_per_batch']:,} per batch, {r['rolled_back']} rollback)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000, help="~250-byte events")
    ap.add_argument("--per-batch", type=int, default=50_000, help="kafka.max.records.per.batch")
    ap.add_argument("--cores", type=int, default=2, help="Spark local[N]")
    ap.add_argument("--recovery-events", type=int, default=100_000)
    ap.add_argument("--recovery-per-batch", type=int, default=25_000)
    ap.add_argument("--broker", choices=("kafka", "noida"), default="kafka")
    ap.add_argument("--skip", default="", help="comma-separated: ingest,recovery")
    ap.add_argument("--spark-conf", default="", help="extra Spark settings 'k=v,k=v'")
    ap.add_argument("--out", default=None, help="JSON file (default benchmarks/results/...)")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else HERE / "results" / f"formats-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cores": args.cores,
        "cpus": os.cpu_count(),
        "load_avg_at_start": os.getloadavg(),
    }
    work = Path(tempfile.mkdtemp(prefix="lakesink-formats-"))
    from lakesink.kafka.kafka_server import local_broker

    broker = local_broker(args.broker, data_dir=work / "broker")
    broker.start()
    try:
        bs = broker.bootstrap_servers
        if "ingest" not in skip:
            t0 = time.perf_counter()
            produce(bs, "bench-formats", args.events, 250)
            print(f"produced {args.events:,} events in {time.perf_counter() - t0:.1f}s", flush=True)
            report["ingest"] = ingest_both(bs, "bench-formats", args.events, work, args)
            print_ingest(report["ingest"])
            out.write_text(json.dumps(report, indent=2))
        if "recovery" not in skip:
            from recovery import run_recovery

            report["recovery"] = {
                fmt: run_recovery(
                    bs,
                    work / f"recovery-{fmt}",
                    args.cores,
                    fmt=fmt,
                    events=args.recovery_events,
                    per_batch=args.recovery_per_batch,
                    topic=f"bench-recovery-{fmt}",
                )
                for fmt in FORMATS
            }
            print_recovery(report["recovery"])
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
