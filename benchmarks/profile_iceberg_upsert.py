"""Where the fixed cost of an Iceberg upsert batch goes (issue 30): one lakesink upsert run
(`bench_iceberg_upsert.py`'s lakesink variant, one key space) with

- the driver's steps timed in the process (wall ms per steady batch and calls per batch: the
  catalog loads, the snapshot planning, the Spark job, the commit and its parts);
- the process tree's CPU per steady batch by role (driver Python, JVM, Python workers).

    python benchmarks/profile_iceberg_upsert.py                     # copy-on-write, large
    python benchmarks/profile_iceberg_upsert.py --mode merge-on-read --space hot
    python benchmarks/profile_iceberg_upsert.py --per-batch 2500    # more, smaller batches
    python benchmarks/profile_iceberg_upsert.py --write-path dataframe
    python benchmarks/profile_iceberg_upsert.py --set spark.conf=spark.eventLog.enabled=true,...

Prints the table; nothing is kept but benchmarks/results/profile-iceberg-upsert-<time>.json.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import itertools
import json
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

# (module, class or "", function, label): inclusive wall time of each call, by batch
TIMED = [
    ("lakesink.spark.sink", "CommittingSink", "_run_batch", "batch (foreachBatch)"),
    ("lakesink.spark.batch", "BatchTables", "begin", "  begin (instant time)"),
    ("lakesink.spark.sink", "CommittingSink", "_write", "  write: target + Spark job"),
    ("lakesink.spark.sink", "", "write_direct_batch", "  write (direct): target + job"),
    ("lakesink.formats.iceberg.plugin", "IcebergPlugin", "task_target", "    task target"),
    ("lakesink.spark.sink", "", "parse_statuses", "    (statuses parsed)"),
    ("lakesink.spark.direct", "", "_run_keyed_tasks", "    Spark job (direct, by key)"),
    ("lakesink.spark.batch", "BatchTables", "commit", "  commit"),
    ("lakesink.formats.iceberg.coordinator", "IcebergCoordinator", "precommit", "    precommit"),
    ("lakesink.formats.iceberg.format", "IcebergFormat", "stage", "      files exist"),
    ("lakesink.formats.iceberg.format", "IcebergFormat", "view", "    view (refresh)"),
    ("lakesink.formats.iceberg.format", "IcebergFormat", "publish", "    publish"),
    ("lakesink.formats.iceberg.upsert", "BucketRewrite", "check", "      buckets check (CoW)"),
    ("lakesink.formats.iceberg.rowdelta", "RowDelta", "check", "      buckets check (MoR)"),
    ("lakesink.formats.iceberg.table", "IcebergTable", "_overwrite_on_base", "      snapshot"),
    ("pyiceberg.table", "Transaction", "commit_transaction", "        catalog commit"),
    ("lakesink.formats.iceberg.table", "IcebergTable", "refresh", "any: table load (refresh)"),
    ("lakesink.formats.iceberg.table", "IcebergTable", "write_context", "any: write context"),
    ("pyiceberg.table", "DataScan", "plan_files", "any: plan_files (manifests)"),
    ("pyiceberg.catalog.sql", "SqlCatalog", "load_table", "any: SQL catalog load_table"),
]


def install_timers(calls: list[tuple[str, float, float]]) -> None:
    for module, cls, func, label in TIMED:
        owner: Any = importlib.import_module(module)
        if cls:
            owner = getattr(owner, cls)
        original = getattr(owner, func, None)
        if original is None:  # a step of another version of lakesink
            continue

        def timed(*a: Any, __f: Any = original, __label: str = label, **k: Any) -> Any:
            t0 = time.time()
            try:
                return __f(*a, **k)
            finally:
                calls.append((__label, t0, time.time()))

        setattr(owner, func, functools.wraps(original)(timed))


def child(cfg: dict[str, Any], expected: int) -> None:
    calls: list[tuple[str, float, float]] = []
    install_timers(calls)
    from spark_runs import run_spark

    out = run_spark("lakesink", cfg, expected)
    out["calls"] = calls
    print("BENCH-RESULT " + json.dumps(out), flush=True)


def main() -> None:
    import bench_iceberg_upsert as bench
    from run import run_child
    from upsert import produce_space

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mode", choices=("copy-on-write", "merge-on-read"), default="copy-on-write")
    ap.add_argument("--space", choices=("large", "hot"), default="large")
    ap.add_argument("--per-batch", type=int, default=500_000)
    ap.add_argument("--write-path", choices=("auto", "direct", "dataframe"), default="auto")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a lakesink setting for the run (repeatable): spark.conf=spark.eventLog.enabled=true",
    )
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.child:
        return child(json.loads(args.child[0]), int(args.child[1]))
    bargs = bench.parser().parse_args(["--per-batch", str(args.per_batch), *rest])
    work = Path(tempfile.mkdtemp(prefix="lakesink-profile-upsert-"))
    from lakesink.kafka.kafka_server import local_broker

    broker = local_broker("kafka", data_dir=work / "broker")
    broker.start()
    try:
        topic, buckets, _ = produce_space(broker.bootstrap_servers, args.space, bargs)
        cfg = bench.lakesink_config(
            broker.bootstrap_servers, topic, work / "warehouse", buckets, args.mode, bargs
        )
        cfg["write.path"] = args.write_path
        for item in args.set:
            key, _, value = item.partition("=")
            cfg[key] = value
        (work / "warehouse").mkdir()
        cmd = [sys.executable, __file__, "--child", json.dumps(cfg), str(topic.records)]
        res, mon, _ = run_child(cmd, name="profile")
    finally:
        broker.close()
        shutil.rmtree(work, ignore_errors=True)
    report = summarize(res, mon, args, buckets)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = HERE / "results" / f"profile-iceberg-upsert-{stamp}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"results: {out}")


def summarize(res: Any, mon: Any, args: Any, buckets: int) -> dict[str, Any]:
    calls = res["calls"]
    windows = [(a, b) for label, a, b in calls if label == "batch (foreachBatch)"]
    steady = windows[1:]  # the first batch warms the JVM and the workers
    n = max(1, len(steady))
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for label, a, b in calls:
        if any(t0 <= a <= t1 for t0, t1 in steady):
            per[label][0] += b - a
            per[label][1] += 1
    gaps = [b0 - a1 for (_, a1), (b0, _) in itertools.pairwise(windows)]
    cpu = mon.cpu_by_role_between(steady[0][0], steady[-1][1]) if steady else {}
    size = res["records"] // max(1, len(windows))
    print(
        f"\n{args.mode}, {args.space}, write.path={args.write_path}: {len(windows)} batches "
        f"of {size:,} records, table.bucket.count {buckets}; per steady batch (after the first):"
    )
    for _, _, _, label in TIMED:
        if label in per:
            total, count = per[label]
            print(f"  {label:<34} {1000 * total / n:>8.0f} ms  {count / n:>5.1f} calls")
    between = 1000 * sum(gaps[1:]) / max(1, len(gaps) - 1)
    print(f"  {'between batches (Spark streaming)':<34} {between:>8.0f} ms")
    print(f"  CPU s in the steady batches by role: { {k: round(v, 2) for k, v in cpu.items()} }")
    return {
        "mode": args.mode,
        "space": args.space,
        "batches": len(windows),
        "steady_ms": {k: 1000 * v[0] / n for k, v in per.items()},
        "steady_calls": {k: v[1] / n for k, v in per.items()},
        "gaps_s": gaps,
        "cpu_by_role_s": cpu,
    }


if __name__ == "__main__":
    main()
