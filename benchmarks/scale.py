"""How lakesink scales with Spark's cores: local[N] for each N, the same data per core.

    python benchmarks/scale.py                                  # local[1] and local[2]
    python benchmarks/scale.py --cores 1,2,4,8,16 --events-per-core 300000
    python benchmarks/scale.py --print benchmarks/results/scale-<time>.json

One local broker (Apache Kafka; `--broker noida` for noida-db) serves a topic per N of
N x `--events-per-core` ~250-byte events over max(`--partitions`, N) partitions (every core has
a task). Each N runs the raw limit (N processes), lakesink's direct path and
the variants asked for (run.py's), a batch being a quarter of the topic, so every N does the same
work per core per batch. Prints records/s per core and CPU per record against N, and writes
benchmarks/results/scale-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from run import SPARK_VARIANTS, throughput  # noqa: E402
from run import parser as run_parser  # noqa: E402

SIZE = 250


def _produce_slice(args: tuple[str, str, int, int, int]) -> dict[int, int]:
    from lakesink.kafka.producer import produce_sample_events

    bootstrap, topic, first, count, partitions = args
    counts = produce_sample_events(
        bootstrap,
        topic,
        count,
        partitions,
        payload_bytes=SIZE,
        first_event_id=first,
        create=False,
        timeout_s=600,
    )
    return {tp.partition: n for tp, n in counts.items()}


def produce_parallel(
    bootstrap: str, topic: str, events: int, partitions: int, procs: int
) -> dict[int, int]:
    """`events` sample events from `procs` producer processes (ids dealt in slices): a 16-core
    topic is millions of events, more than one Python producer makes quickly."""
    from lakesink.kafka.client import create_topic

    create_topic(bootstrap, topic, partitions)
    step = -(-events // procs)
    slices = [
        (bootstrap, topic, first, min(step, events - first), partitions)
        for first in range(0, events, step)
    ]
    with mp.get_context("spawn").Pool(len(slices)) as pool:
        parts = pool.map(_produce_slice, slices)
    total: Counter[int] = Counter()
    for p in parts:
        total.update(p)
    return dict(total)


def run_scale(args: argparse.Namespace) -> dict[str, Any]:
    from lakesink.kafka.kafka_server import local_broker

    cores = [int(c) for c in args.cores.split(",") if c]
    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine_cores": os.cpu_count(),
        "cores": cores,
        "partitions": {n: max(args.partitions, n) for n in cores},
        "events_per_core": args.events_per_core,
        "broker": args.broker,
        "load_avg_at_start": os.getloadavg(),
        "by_cores": {},
    }
    work = Path(tempfile.mkdtemp(prefix="lakesink-scale-"))
    broker = local_broker(args.broker, data_dir=work / "broker")
    broker.start()
    try:
        bs = broker.bootstrap_servers
        for n in cores:
            events = n * args.events_per_core
            topic = f"scale-{n}"
            partitions = max(args.partitions, n)
            t0 = time.perf_counter()
            ends = produce_parallel(bs, topic, events, partitions, min(n, os.cpu_count() or 1))
            print(f"local[{n}]: produced {events:,} events in {time.perf_counter() - t0:.1f}s")
            sets = [a for item in args.set or [] for a in ("--set", item)]
            run_args = run_parser().parse_args(
                [
                    *("--cores", str(n), "--per-batch", str(max(1000, events // 4))),
                    *("--variants", args.variants, "--spark-conf", args.spark_conf),
                    *("--no-peers", *sets),
                ]
            )
            entry = throughput(bs, topic, ends, SIZE, work / f"n{n}", run_args)
            report["by_cores"][str(n)] = entry
            print_scale(report)
            sys.stdout.flush()
            args.out.write_text(json.dumps(report, indent=2))  # a cut run keeps this much
    finally:
        broker.close()
        shutil.rmtree(work, ignore_errors=True)
    report["load_avg_at_end"] = os.getloadavg()
    args.out.write_text(json.dumps(report, indent=2))
    return report


def print_scale(report: dict[str, Any]) -> None:
    by = report["by_cores"]
    if not by:
        return
    base = by[min(by, key=int)]["runs"]
    base_n = int(min(by, key=int))
    print(
        f"\n{'cores':>5} {'variant':<19} {'records':>10} {'steady rec/s':>12} "
        f"{'per core':>9} {'x vs ' + str(base_n):>7} {'cpu us/rec':>10} {'vs raw':>6} "
        f"{'end-to-end s':>12}"
    )
    for n, entry in sorted(by.items(), key=lambda kv: int(kv[0])):
        raw = entry["runs"]["raw"]
        for name, r in entry["runs"].items():
            if "failed" in r or not r.get("steady_rec_s"):
                print(f"{n:>5} {name:<19} failed or no steady state")
                continue
            rate = r["steady_rec_s"]
            first = base.get(name, {}).get("steady_rec_s")
            print(
                f"{n:>5} {name:<19} {r['records']:>10,} {rate:>12,.0f} {rate / int(n):>9,.0f} "
                f"{(rate / first if first else float('nan')):>7.2f} "
                f"{r['cpu_us_per_rec']:>10.1f} {rate / raw['steady_rec_s']:>6.2f} "
                f"{r['wall_s']:>12.1f}" + (f"  ERROR {r['error']}" if "error" in r else "")
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cores", default="1,2", help="comma-separated N of Spark local[N]")
    ap.add_argument("--events-per-core", type=int, default=300_000)
    ap.add_argument(
        "--partitions", type=int, default=8, help="Kafka partitions of a topic (at least N)"
    )
    ap.add_argument(
        "--variants",
        default="lakesink,alo",
        help=f"Spark variants beside the raw limit, of {','.join(SPARK_VARIANTS)}",
    )
    ap.add_argument("--broker", choices=("kafka", "noida"), default="kafka")
    ap.add_argument("--spark-conf", default="", help="extra Spark settings 'k=v,k=v'")
    ap.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="a lakesink key (repeatable)"
    )
    ap.add_argument("--out", type=Path, default=None, help="JSON file")
    ap.add_argument("--print", dest="print_json", help="print the table of a results JSON")
    args = ap.parse_args()
    if args.print_json:
        return print_scale(json.loads(Path(args.print_json).read_text()))
    if args.out is None:
        args.out = HERE / "results" / f"scale-{time.strftime('%Y%m%d-%H%M%S')}.json"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "lakesink.spark.prepare"], check=True)
    report = run_scale(args)
    loads = report["load_avg_at_start"], report["load_avg_at_end"]
    print(f"\nload average at start {loads[0]}, at end {loads[1]}")
    print(f"machine cores {report['machine_cores']}; results: {args.out}")


if __name__ == "__main__":
    main()
