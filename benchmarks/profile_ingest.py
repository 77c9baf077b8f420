"""Where lakesink's CPU per record goes: one `Ingestion.run(once=True)` (the benchmark's lakesink
child) under py-spy (`--subprocesses`: the driver and Spark's Python workers), the process tree's
CPU split by role (driver Python, JVM, Python workers) with procmon, and py-spy's samples grouped
into stages by the frames they pass through.

    python benchmarks/profile_ingest.py --events 200000 --size 250
    python benchmarks/profile_ingest.py --events 60000 --size 1024 --broker kafka
    python benchmarks/profile_ingest.py --events 200000 --write-path dataframe

Writes benchmarks/results/profile-<size>-<time>.{txt,json}: the collapsed stacks (flamegraph.pl /
speedscope read them) and the table this prints. The JVM's own time is not sampled by py-spy: it
is the `jvm` role's CPU seconds (`jit`: its JIT compiler threads).
"""

from __future__ import annotations

import argparse
import json
import re
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

from procmon import TreeMonitor  # noqa: E402

# Ordered: a sample belongs to the first stage one of whose patterns a frame of its stack
# matches, searched from the innermost frame outwards, so the most specific work wins.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    (
        "start-up (imports, session)",
        # not `<module>`: a forked worker's stack starts in the daemon's module code
        (
            r"_find_and_load",
            r"zipimport",
            r"_call_with_frames_removed",
            r"getOrCreate",
            r"get_spark",
        ),
    ),
    ("gc (PySpark daemon, after each task)", (r"daemon\.py:275\)", r"freeze_worker_heap")),
    (
        "Parquet write",
        (
            r"pyarrow/parquet",
            r"write_table",
            r"ParquetWriter",
            r"_flush \(.*lakesink/formats/hudi/table/writer",
        ),
    ),
    (
        "meta columns",
        (
            r"record_keys",
            r"_key_strings",
            r"_with_meta_placeholder",
            r"_seqnos",
            r"check_utf8",
            r"_has_strings",
        ),
    ),
    (
        "decode",
        (
            r"lakesink/kafka/json_bulk",
            r"lakesink/kafka/json_values",
            r"lakesink/kafka/decoded",
            r"lakesink/kafka/deserializers",
            r"lakesink/kafka/avro",
            r"pyarrow/json",
        ),
    ),
    ("Kafka fetch", (r"lakesink/kafka/reader", r"lakesink/kafka/client", r"confluent_kafka")),
    (
        "commit",
        (
            r"lakesink/engine/",
            r"lakesink/commitlog",
            r"lakesink/concurrency",
            r"lakesink/formats/hudi/table/timeline",
            r"lakesink/formats/hudi/table/markers",
            r"lakesink/formats/hudi/table/metadata",
            r"lakesink/services",
        ),
    ),
    (
        "JVM round trip (Arrow/pickle serde, py4j)",
        (
            # py-spy names pyspark's files from the package root: serializers.py, worker.py
            r"\(sql/pandas/serializers\.py",
            r"\(serializers\.py",
            r"\(sql/worker/plan_data_source_read\.py",
            r"\(sql/conversion\.py",
            r"\(worker\.py",
            r"py4j/",
            r"pyarrow/ipc",
        ),
    ),
    ("lakesink, other", (r"lakesink/",)),
]


def stage_of(frames: list[str]) -> str:
    for name, patterns in STAGES:
        for frame in reversed(frames):
            if any(re.search(p, frame) for p in patterns):
                return name
    return "other (pyspark/daemon, stdlib)"


def summarize(collapsed: Path) -> dict[str, Any]:
    """Samples per stage, apart for the driver process (the benchmark's `--child`) and Spark's
    Python workers; py-spy's first frame names the process and its command line."""
    by_role: dict[str, Counter[str]] = {"driver": Counter(), "pyworkers": Counter()}
    top: Counter[str] = Counter()
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        # subprocesses' stacks start with their ancestors: the last `process` frame is the one
        procs = [i for i, f in enumerate(frames) if re.match(r"process \d+:", f)]
        own = procs[-1] if procs else 0
        role = "driver" if "--child" in frames[own] else "pyworkers"
        frames = frames[own + 1 :]
        by_role[role][stage_of(frames)] += int(count)
        if frames:
            top[frames[-1]] += int(count)
    return {
        "samples": {r: dict(c.most_common()) for r, c in by_role.items()},
        "top_frames": top.most_common(25),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=250, help="event size in bytes")
    ap.add_argument("--batches", type=int, default=5, help="micro-batches (the first is warm-up)")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--rate", type=int, default=50, help="py-spy samples per second")
    ap.add_argument("--broker", choices=("kafka", "noida"), default="kafka")
    ap.add_argument(
        "--write-path",
        choices=("auto", "direct", "dataframe"),
        default="auto",
        help="write.path: the direct task path (auto here) or the DataFrame path",
    )
    ap.add_argument("--resummarize", help="a report JSON: group its collapsed stacks again")
    args = ap.parse_args()
    if args.resummarize:
        path = Path(args.resummarize)
        report = json.loads(path.read_text()) | summarize(path.with_suffix(".txt"))
        path.write_text(json.dumps(report, indent=2))
        print_report(report)
        return
    if shutil.which("py-spy") is None:
        raise SystemExit("py-spy is missing: pip install -e '.[bench]'")
    from run import produce

    from lakesink.kafka.kafka_server import local_broker
    from lakesink.kafka.producer import SAMPLE_EVENT_DDL

    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = HERE / "results"
    out_dir.mkdir(exist_ok=True)
    collapsed = out_dir / f"profile-{args.size}-{stamp}.txt"
    work = Path(tempfile.mkdtemp(prefix="lakesink-profile-"))
    broker = local_broker(args.broker, data_dir=work / "broker")
    broker.start()
    try:
        produce(broker.bootstrap_servers, "profile", args.events, args.size)
        cfg = {
            "kafka.bootstrap.servers": broker.bootstrap_servers,
            "kafka.topics": "profile",
            "value.format": "json",
            "value.schema": SAMPLE_EVENT_DDL,
            "table.path": str(work / "table"),
            "kafka.max.records.per.batch": max(1000, args.events // args.batches),
            "writer.id": "profile",
            "lock.provider": "filesystem",
            "spark.master": f"local[{args.cores}]",
            "write.path": args.write_path,
        }
        child = [sys.executable, str(HERE / "run.py"), "--child", "spark", "lakesink"]
        child += [json.dumps(cfg), str(args.events)]
        cmd = ["py-spy", "record", "--subprocesses", "--nonblocking", "--format", "raw"]
        cmd += ["--rate", str(args.rate), "-o", str(collapsed), "--", *child]
        with tempfile.TemporaryFile("w+") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            with TreeMonitor(proc.pid) as mon:
                code = proc.wait()
            log.seek(0)
            text = log.read()
        if code != 0:
            raise SystemExit(f"profiled run failed ({code}):\n{text[-4000:]}")
        result = next(
            json.loads(line[len("BENCH-RESULT ") :])
            for line in text.splitlines()
            if line.startswith("BENCH-RESULT ")
        )
    finally:
        broker.close()
        shutil.rmtree(work, ignore_errors=True)
    cpu = mon.stats.cpu_s
    first_t = result["batches"][0][0]
    steady = _role_cpu_at(mon, result["t_end"])
    warm = _role_cpu_at(mon, first_t)
    steady_cpu = {k: round(v - warm.get(k, 0.0), 1) for k, v in steady.items()}
    report = {
        "events": args.events,
        "size": args.size,
        "records": result["records"],
        "batches": len(result["batches"]),
        "wall_s": round(result["t_end"] - result["t_start"], 1),
        # procmon's roles, seen from py-spy as the root: "driver" is py-spy itself, "other"
        # the lakesink driver Python
        "cpu_s": {
            "py-spy (profiler)": round(cpu.get("driver", 0.0), 1),
            "lakesink driver (Python)": round(cpu.get("other", 0.0), 1),
            "JVM": round(cpu.get("jvm", 0.0), 1),
            "JVM JIT compiler threads": round(cpu.get("jit", 0.0), 1),
            "Python workers": round(cpu.get("pyworkers", 0.0), 1),
            "source planning (Python)": round(cpu.get("source", 0.0), 1),
        },
        "steady_records": result["records"] - result["batches"][0][1],
        "steady_cpu_s": {
            "lakesink driver (Python)": steady_cpu.get("other", 0.0),
            "JVM": steady_cpu.get("jvm", 0.0),
            "JVM JIT compiler threads": steady_cpu.get("jit", 0.0),
            "Python workers": steady_cpu.get("pyworkers", 0.0),
            "source planning (Python)": steady_cpu.get("source", 0.0),
        },
        **summarize(collapsed),
    }
    (out_dir / f"profile-{args.size}-{stamp}.json").write_text(json.dumps(report, indent=2))
    print_report(report)
    print(f"collapsed stacks: {collapsed}")


def _role_cpu_at(mon: TreeMonitor, t: float) -> dict[str, float]:
    return min(mon.timeline, key=lambda s: abs(s[0] - t), default=(0.0, {}))[1]


def print_report(r: dict[str, Any]) -> None:
    n = max(1, r["records"])
    print(
        f"\n{r['records']:,} records of ~{r['size']} B, {r['batches']} batches, "
        f"{r['wall_s']}s from query start"
    )
    total_cpu = sum(v for k, v in r["cpu_s"].items() if k != "py-spy (profiler)")
    for k, v in r["cpu_s"].items():
        print(f"  {k:<26} {v:>7.1f} s CPU  {1e6 * v / n:>7.1f} us/rec")
    print(f"  {'all but py-spy':<26} {total_cpu:>7.1f} s CPU  {1e6 * total_cpu / n:>7.1f} us/rec")
    if "steady_cpu_s" in r:
        sn = max(1, r["steady_records"])
        print(f"  steady (after the first batch, {sn:,} records):")
        for k, v in r["steady_cpu_s"].items():
            print(f"    {k:<24} {v:>7.1f} s CPU  {1e6 * v / sn:>7.1f} us/rec")
        tot = sum(r["steady_cpu_s"].values())
        print(f"    {'all':<24} {tot:>7.1f} s CPU  {1e6 * tot / sn:>7.1f} us/rec")
    print("\n  py-spy samples (share of all, and of all but start-up)")
    for role, stages in r["samples"].items():
        total = sum(stages.values()) or 1
        work = sum(c for s, c in stages.items() if not s.startswith("start-up")) or 1
        print(f"  {role}: {total:,} samples")
        for stage, c in stages.items():
            rest = "" if stage.startswith("start-up") else f" {100 * c / work:>5.1f} %"
            print(f"    {stage:<44} {c:>7,} {100 * c / total:>5.1f} %{rest}")


if __name__ == "__main__":
    main()
