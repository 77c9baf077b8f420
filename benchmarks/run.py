"""lakesink benchmarks, one command: throughput against the raw limit, at-least-once Spark and
the peers (Spark Structured Streaming into Delta Lake and Parquet, Hudi's streaming sink), a
correctness column (each writer SIGKILLed mid-batch, restarted, its table audited against
Kafka), commit cost as the table grows, recovery after kill -9, peak memory.

    python benchmarks/run.py                       # everything, peers included
    python benchmarks/run.py --no-peers --skip correctness   # lakesink, raw, at-least-once
    python benchmarks/run.py --events 200000 --events-1k 50000 --skip commit,recovery
    python benchmarks/run.py --print benchmarks/results/<time>.json

The peers run in their own environments, which scripts/setup-peers.sh builds once (cached under
$LAKESINK_CACHE, default .cache/; the first run calls it).

Prints a table and writes benchmarks/results/<time>.json. Every variant runs on the same topic
of one local broker (Apache Kafka; `--broker noida` for noida-db), in the same run, on the same
cores (Spark local[N] and N raw processes). See benchmarks/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

try:
    from procmon import TreeMonitor, run_monitored
except ImportError as e:  # psutil
    raise SystemExit(f"benchmarks need the 'bench' extra: pip install -e '.[bench]' ({e})") from e

TOPIC_PARTITIONS = 8


def produce(
    bootstrap: str, topic: str, events: int, size: int, partitions: int = TOPIC_PARTITIONS
) -> dict[int, int]:
    from lakesink.kafka.producer import produce_sample_events

    counts = produce_sample_events(
        bootstrap, topic, events, partitions, payload_bytes=size, timeout_s=600
    )
    return {tp.partition: n for tp, n in counts.items()}


def _child_cmd(kind: str, *args: str) -> list[str]:
    return [sys.executable, str(HERE / "run.py"), "--child", kind, *args]


def _parse_result(out: str) -> dict[str, Any]:
    # the marker is looked for anywhere in a line: the child's output is merged with its Python
    # workers', and one that died mid-line (a traceback at shutdown) leaves no newline before it
    for line in out.splitlines():
        at = line.find("BENCH-RESULT ")
        if at >= 0:
            return json.loads(line[at + len("BENCH-RESULT ") :])  # type: ignore[no-any-return]
    raise RuntimeError(f"child printed no result:\n{out[-3000:]}")


def run_child(cmd: list[str], name: str = "") -> tuple[dict[str, Any], TreeMonitor, float]:
    with tempfile.TemporaryFile("w+") as out:
        code, mon, wall = run_monitored(cmd, stdout=out, stderr=subprocess.STDOUT)
        out.seek(0)
        text = out.read()
    if code != 0:
        raise RuntimeError(f"{name or cmd[3]} run failed with exit code {code}:\n{text[-4000:]}")
    return _parse_result(text), mon, wall


def throughput(
    bootstrap: str,
    topic: str,
    ends: dict[int, int],
    size: int,
    work: Path,
    args: argparse.Namespace,
) -> dict[str, Any]:
    events = sum(ends.values())
    rows: dict[str, Any] = {}
    # raw limit
    res, mon, _ = run_child(
        _child_cmd(
            "raw", bootstrap, topic, json.dumps(ends), str(work / f"raw-{size}"), str(args.cores)
        )
    )
    value_bytes = res["value_bytes"]
    rows["raw"] = {
        "records": res["records"],
        "wall_s": res["wall_s"],
        "steady_s": res["steady_s"],
        "cpu_s": sum(mon.stats.cpu_s.values()),
        "steady_cpu_s": sum(mon.stats.cpu_s.values()),
        "memory": mon.stats.as_json(),
    }
    for mode in variants(args):
        # lakesink takes the direct task path (no transformation); lakesink-dataframe forces
        # the rows through Spark's DataFrame, the path of transform.sql and transform.python
        cfg = lakesink_config(bootstrap, topic, work / f"{mode}-{size}", size, events, args)
        child = "alo" if mode == "alo" else "lakesink"
        if mode == "lakesink-dataframe":
            cfg["write.path"] = "dataframe"
        res, mon, _ = run_child(_child_cmd("spark", child, json.dumps(cfg), str(events)))
        rows[mode] = spark_row(res, mon)
    for mode in peers_to_run(args):
        from peers import peer_cmd, peer_config

        pcfg = peer_config(
            mode,
            bootstrap,
            topic,
            ends,
            batch_size(events, args),
            args.cores,
            work / f"{mode}-{size}",
        )
        try:
            res, mon, _ = run_child(peer_cmd(mode, pcfg), name=mode)
        except RuntimeError as e:  # one peer failing leaves the others' figures
            print(f"peer {mode} failed: {e}", flush=True)
            rows[mode] = {"failed": str(e)[-2000:]}
            continue
        rows[mode] = spark_row(res, mon)
        rows[mode]["spark"] = res["spark"]
    per_record = value_bytes / max(1, rows["raw"]["records"])
    for r in rows.values():
        if "failed" in r:
            continue
        steady_n = r.get("steady_records", r["records"])
        r["rec_s"] = r["records"] / r["wall_s"]
        r["steady_rec_s"] = steady_n / r["steady_s"] if r["steady_s"] == r["steady_s"] else None
        r["steady_mb_s"] = (r["steady_rec_s"] or 0) * per_record / 1e6
        r["cpu_us_per_rec"] = 1e6 * r["steady_cpu_s"] / max(1, steady_n)
        if r["records"] != events:
            r["error"] = f"wrote {r['records']} of {events} records"
    ls, raw = rows["lakesink"], rows["raw"]
    ratios = {
        "lakesink/raw": _ratio(ls["steady_rec_s"], raw["steady_rec_s"]),
        "lakesink/raw (end-to-end)": _ratio(ls["rec_s"], raw["rec_s"]),
    }
    if "alo" in rows:
        alo = rows["alo"]
        ratios["lakesink/alo"] = _ratio(ls["steady_rec_s"], alo["steady_rec_s"])
        ratios["lakesink/alo (end-to-end)"] = _ratio(ls["rec_s"], alo["rec_s"])
        ratios["alo/lakesink cpu per record"] = _ratio(alo["cpu_us_per_rec"], ls["cpu_us_per_rec"])
    if "lakesink-dataframe" in rows:
        df = rows["lakesink-dataframe"]
        ratios["lakesink/lakesink-dataframe"] = _ratio(ls["steady_rec_s"], df["steady_rec_s"])
        ratios["lakesink-dataframe/lakesink cpu per record"] = _ratio(
            df["cpu_us_per_rec"], ls["cpu_us_per_rec"]
        )
    for mode in peers_to_run(args):
        p = rows[mode]
        if "failed" in p:
            continue
        ratios[f"lakesink/{mode}"] = _ratio(ls["steady_rec_s"], p["steady_rec_s"])
        ratios[f"lakesink/{mode} (end-to-end)"] = _ratio(ls["rec_s"], p["rec_s"])
        ratios[f"{mode}/lakesink cpu per record"] = _ratio(
            p["cpu_us_per_rec"], ls["cpu_us_per_rec"]
        )
    return {"event_bytes": round(per_record), "events": events, "runs": rows, "ratios": ratios}


def batch_size(events: int, args: argparse.Namespace) -> int:
    # at least 4 batches: the first one (JVM and worker warm-up) is not steady state
    return max(1000, min(args.per_batch, events // 4))


def lakesink_config(
    bootstrap: str, topic: str, path: Path, size: int, events: int, args: argparse.Namespace
) -> dict[str, Any]:
    from lakesink.kafka.producer import SAMPLE_EVENT_DDL

    cfg: dict[str, Any] = {
        "kafka.bootstrap.servers": bootstrap,
        "kafka.topics": topic,
        "value.format": "json",
        "value.schema": SAMPLE_EVENT_DDL,
        "table.path": str(path),
        "kafka.max.records.per.batch": batch_size(events, args),
        "writer.id": f"bench-{size}",
        "lock.provider": "filesystem",
        "spark.master": f"local[{args.cores}]",
    }
    if args.spark_conf:
        cfg["spark.conf"] = args.spark_conf
    for item in args.set or []:  # lakesink keys for A/B runs
        key, _, value = item.partition("=")
        cfg[key.strip()] = value.strip()
    return cfg


def spark_row(res: dict[str, Any], mon: TreeMonitor) -> dict[str, Any]:
    """A Spark run's figures: batches (time finished, records) after the query started."""
    batches = res["batches"]
    first_t, first_n = batches[0]
    return {
        "records": res["records"],
        "batches": len(batches),
        "session_s": res["session_s"],
        "wall_s": res["t_end"] - res["t_start"],
        "steady_s": res["t_end"] - first_t if len(batches) > 1 else float("nan"),
        "steady_records": res["records"] - first_n,
        "first_batch_s": first_t - res["t_start"],
        "batch_s": [round(b[0] - a[0], 3) for a, b in itertools.pairwise(batches)],
        "cpu_s": sum(mon.stats.cpu_s.values()),
        "steady_cpu_s": mon.cpu_between(first_t, res["t_end"]),
        "steady_cpu_by_role_s": {
            role: round(secs, 2)
            for role, secs in mon.cpu_by_role_between(first_t, res["t_end"]).items()
        },
        "batch_cpu_by_role_s": [  # each batch after the first: does the JVM or a worker warm?
            {role: round(secs, 2) for role, secs in mon.cpu_by_role_between(a[0], b[0]).items()}
            for a, b in itertools.pairwise(batches)
        ],
        "memory": mon.stats.as_json(),
    }


SPARK_VARIANTS = ("lakesink", "lakesink-dataframe", "alo")


def variants(args: argparse.Namespace) -> list[str]:
    """The Spark variants beside the raw limit; lakesink's direct path always runs (the ratios'
    denominator)."""
    asked = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(asked) - set(SPARK_VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}: choose from {', '.join(SPARK_VARIANTS)}")
    return ["lakesink", *(v for v in SPARK_VARIANTS[1:] if v in asked)]


def peers_to_run(args: argparse.Namespace) -> list[str]:
    if args.no_peers:
        return []
    return [p for p in args.peers.split(",") if p]


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def _fmt_audit(a: dict[str, Any] | None) -> str:
    if not a:
        return ""
    if "failed" in a:
        return "run failed"
    txt = f"{a['duplicates']:,} dup / {a['missing']:,} missing"
    if a.get("failed_restarts"):
        txt += f" ({len(a['failed_restarts'])} failed restart(s))"
    if "spark_metadata" in a:
        m = a["spark_metadata"]
        bad = a["all_files"].get("unreadable_files", 0)
        txt += f", {bad} torn files" if bad else ""
        txt += f" (files in Spark's log: {m['duplicates']:,} / {m['missing']:,})"
    return txt


def print_throughput(results: dict[str, Any]) -> None:
    print(
        f"\n{'size':>6} {'variant':<18} {'records':>9} {'rec/s':>9} {'steady rec/s':>12} "
        f"{'MB/s':>6} {'cpu us/rec':>10} {'peak RSS MB':>11} {'batches':>7} {'vs raw':>6} "
        f"{'lakesink/it':>11} {'its cpu/lakesink':>16}  after SIGKILL + restart"
    )
    for size, res in results.items():
        audits = res.get("correctness", {})
        if "raw" not in res["runs"]:  # a correctness-only run
            for name, a in audits.items():
                print(f"{size:>6} {name:<18} after SIGKILL + restart: {_fmt_audit(a)}")
            continue
        raw = res["runs"]["raw"]
        ls = res["runs"]["lakesink"]
        for name, r in res["runs"].items():
            if "failed" in r:
                print(f"{size:>6} {name:<18} failed: {r['failed'].splitlines()[0][:100]}")
                continue
            steady = r["steady_rec_s"]
            cpu = r["cpu_us_per_rec"] if steady else float("nan")
            vs_raw = _ratio(steady, raw["steady_rec_s"])
            ls_vs = _ratio(ls["steady_rec_s"], steady) if name not in ("raw", "lakesink") else None
            cpu_vs = _ratio(cpu, ls["cpu_us_per_rec"]) if name != "lakesink" else None
            print(
                f"{size:>6} {name:<18} {r['records']:>9,} {r['rec_s']:>9,.0f} "
                f"{(steady or 0):>12,.0f} {r['steady_mb_s']:>6.1f} {cpu:>10.1f} "
                f"{r['memory']['peak_total_rss_mb']:>11,.0f} {r.get('batches', ''):>7} "
                f"{vs_raw or '':>6} {ls_vs or '':>11} {cpu_vs or '':>16}  "
                f"{_fmt_audit(audits.get(name))}"
            )
        print("       " + "  ".join(f"{k} {v}" for k, v in res["ratios"].items()))
        for name, r in res["runs"].items():  # where each Spark run's steady CPU went
            if roles := r.get("steady_cpu_by_role_s"):
                n = max(1, r["steady_records"])
                split = ", ".join(f"{role} {1e6 * secs / n:.1f}" for role, secs in roles.items())
                print(f"       {name}: steady CPU us/rec by process: {split}")
        if any("jit" in r.get("steady_cpu_by_role_s", {}) for r in res["runs"].values()):
            print("       (jit: the Spark JVM's JIT compiler threads; jvm: the rest of it)")


def correctness(
    bootstrap: str,
    topic: str,
    ends: dict[int, int],
    size: int,
    work: Path,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """lakesink and each peer: SIGKILL mid-batch, restart, audit the table against Kafka."""
    from peers import audit_for, audit_hudi, kill_and_audit, peer_cmd, peer_config

    events = sum(ends.values())
    out: dict[str, Any] = {}
    base = work / f"kill-{size}"
    cfg = lakesink_config(bootstrap, topic, base / "lakesink" / "table", size, events, args)
    cfg["writer.id"] = f"kill-{size}"
    jobs: list[tuple[str, list[str], Any]] = [
        (
            "lakesink",
            _child_cmd("spark", "lakesink", json.dumps(cfg), str(events)),
            lambda: audit_hudi(base / "lakesink" / "table", ends),
        )
    ]
    for mode in peers_to_run(args):
        pcfg = peer_config(
            mode, bootstrap, topic, ends, batch_size(events, args), args.cores, base / mode
        )
        jobs.append((mode, peer_cmd(mode, pcfg), lambda m=mode: audit_for(m, base / m, ends)))
    for name, cmd, audit in jobs:
        t0 = time.perf_counter()
        try:
            out[name] = kill_and_audit(cmd, base / name / "logs", audit)
        except Exception as e:  # one failed writer leaves the others' audits
            print(f"correctness run of {name} failed: {e}", flush=True)
            out[name] = {"failed": str(e)[-2000:]}
            continue
        print(
            f"{name}: SIGKILL after {out[name]['killed_after_batches']} batches, restart "
            f"{out[name]['restart_s']}s, audit {_fmt_audit(out[name])} "
            f"({time.perf_counter() - t0:.0f}s)",
            flush=True,
        )
    return out


def parser() -> argparse.ArgumentParser:
    """run.py's options (scale.py parses its runs' options with it too)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=2_000_000, help="~250-byte events (0: skip)")
    ap.add_argument("--events-1k", type=int, default=500_000, help="1 KB events (0: skip)")
    ap.add_argument("--per-batch", type=int, default=500_000, help="kafka.max.records.per.batch")
    ap.add_argument("--cores", type=int, default=2, help="Spark local[N] and raw processes")
    ap.add_argument(
        "--partitions", type=int, default=TOPIC_PARTITIONS, help="Kafka partitions of each topic"
    )
    ap.add_argument(
        "--variants",
        default=",".join(SPARK_VARIANTS),
        help="Spark variants beside the raw limit (lakesink's direct path always runs)",
    )
    ap.add_argument(
        "--broker",
        choices=("kafka", "noida"),
        default="kafka",
        help="local broker: Apache Kafka (scripts/setup-kafka.sh) or noida-db",
    )
    ap.add_argument(
        "--skip",
        default="",
        help="comma-separated: throughput,correctness,commit,recovery,requests,freshness",
    )
    ap.add_argument(
        "--no-peers", action="store_true", help="lakesink, raw and at-least-once only (quick)"
    )
    ap.add_argument(
        "--peers",
        default="delta,parquet,hudi-insert,hudi-bulk_insert",
        help="peers to run (scripts/setup-peers.sh builds their environments once)",
    )
    ap.add_argument(
        "--kill-size",
        type=int,
        default=250,
        help="event size (250 or 1024) whose topic the SIGKILL correctness runs read",
    )
    ap.add_argument("--commit-repeats", type=int, default=30)
    ap.add_argument("--spark-conf", default="", help="extra Spark settings 'k=v,k=v' (A/B runs)")
    ap.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="a lakesink configuration key of the lakesink runs (A/B runs; repeatable)",
    )
    ap.add_argument(
        "--out", default=None, help="JSON file (default benchmarks/results/<time>.json)"
    )
    ap.add_argument("--print", dest="print_json", help="print the tables of a results JSON")
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.child:
        return child(args.child)
    if args.print_json:
        return print_throughput(json.loads(Path(args.print_json).read_text())["throughput"])
    skip = set(filter(None, args.skip.split(",")))
    # lakesink's Spark start maps a class archive made once per machine (docs/operations.md,
    # "A lighter start"): made here first, so every run measures a machine lakesink ran on
    subprocess.run([sys.executable, "-m", "lakesink.spark.prepare"], check=True)
    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cores": args.cores,
        "load_avg_at_start": os.getloadavg(),
    }
    out = (
        Path(args.out) if args.out else HERE / "results" / f"{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="lakesink-bench-"))
    try:
        if {"throughput", "correctness", "recovery"} - skip:
            from lakesink.kafka.kafka_server import local_broker

            broker = local_broker(args.broker, data_dir=work / "broker")
            broker.start()
            report["broker"] = args.broker
            try:
                bs = broker.bootstrap_servers
                measure = {"throughput", "correctness"} - skip
                if peers_to_run(args) and measure:
                    from peers import ensure_envs

                    report["peers"] = ensure_envs()
                if measure:
                    results: dict[str, Any] = {}
                    for size, events in ((250, args.events), (1024, args.events_1k)):
                        kill = "correctness" in measure and size == args.kill_size
                        if events <= 0 or ("throughput" in skip and not kill):
                            continue
                        topic = f"bench-{size}"
                        t0 = time.perf_counter()
                        ends = produce(bs, topic, events, size, args.partitions)
                        took = time.perf_counter() - t0
                        print(f"produced {events:,} events of ~{size} B in {took:.1f}s", flush=True)
                        entry: dict[str, Any] = {"events": events, "runs": {}, "ratios": {}}
                        if "throughput" in measure:
                            entry = throughput(bs, topic, ends, size, work, args)
                        if kill:
                            entry["correctness"] = correctness(bs, topic, ends, size, work, args)
                        results[str(size)] = entry
                        print_throughput({str(size): entry})
                        sys.stdout.flush()
                        report["throughput"] = results
                        out.write_text(json.dumps(report, indent=2))  # a cut run keeps this much
                if "recovery" not in skip:
                    from recovery import run_recovery

                    report["recovery"] = run_recovery(bs, work / "recovery", args.cores)
                    print_recovery(report["recovery"])
            finally:
                broker.close()
        if "commit" not in skip:
            from commit_cost import print_commit_cost, run_commit_cost

            report["commit"] = run_commit_cost(work / "commit", args.commit_repeats)
            print_commit_cost(report["commit"])
        if "requests" not in skip:
            report["requests"] = run_commit_requests(work / "requests.json")
        if "freshness" not in skip:
            report["freshness"] = run_freshness(work / "freshness.json", not args.no_peers)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["load_avg_at_end"] = os.getloadavg()
    out.write_text(json.dumps(report, indent=2))
    if "throughput" in report:
        print("\nthroughput summary")
        print_throughput(report["throughput"])
    print(
        f"\nload average at start {report['load_avg_at_start']}, at end {report['load_avg_at_end']}"
    )
    print(f"results: {out}")


def run_commit_requests(out: Path) -> dict[str, Any]:
    """Storage requests per steady commit on S3, Hudi and Iceberg (bench_commit_requests.py,
    in its own process: its own broker and Spark); it prints its table."""
    subprocess.run(
        [sys.executable, str(HERE / "bench_commit_requests.py"), "--json", str(out)], check=True
    )
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def run_freshness(out: Path, peers: bool) -> list[dict[str, Any]]:
    """Seconds from Kafka's append to an independent reader seeing the record, per system and
    trigger (freshness.py, in its own process: its own broker, ingestions and peers); it
    prints its table."""
    command = [sys.executable, str(HERE / "freshness.py"), "--json", str(out)]
    subprocess.run(command + (["--peers", "delta,hudi,iceberg"] if peers else []), check=True)
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def print_recovery(r: dict[str, Any]) -> None:
    print(
        f"\nrecovery after kill -9 at {r['crash_point']}: next completed instant "
        f"{r['kill_to_next_commit_s']:.1f}s after the kill, caught up after "
        f"{r['kill_to_caught_up_s']:.1f}s ({r['events']:,} events, {r['records_per_batch']:,} per "
        f"batch, {r['rolled_back']} rollback)"
    )


def child(argv: list[str]) -> None:
    kind, rest = argv[0], argv[1:]
    if kind == "raw":
        from raw_limit import run_raw

        from lakesink.kafka.producer import SAMPLE_EVENT_DDL

        ends = {int(k): v for k, v in json.loads(rest[2]).items()}
        res = run_raw(rest[0], rest[1], ends, SAMPLE_EVENT_DDL, Path(rest[3]), int(rest[4]))
        print("BENCH-RESULT " + json.dumps(res), flush=True)
    elif kind == "spark":
        from spark_runs import main as spark_main

        spark_main(rest)
    else:
        raise SystemExit(f"unknown child {kind}")


if __name__ == "__main__":
    main()
