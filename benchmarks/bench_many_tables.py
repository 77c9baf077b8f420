"""One ingestion writing N tables against N ingestions of one table each, side by side in one run
(prints figures; not a timed test).

N topics of one partition each, `--events` records per topic, on one local broker. For each N
of `--tables`:

- `one ingestion`: one `lakesink ingest` pipeline (a child process: Spark local[cores], Hudi,
  sync commits, `--commit-parallelism` tables committing at once, `--publish-delay` seconds of
  modelled store latency in each table commit) over the N topics with a table per topic
  (`tables.t<i>.route.topics`), each batch read once and committed into every table;
- `N ingestions`: an ingestion per topic into its own table, each its own child process (a
  driver per table, as users run them today), one after the other. With `--sample K` only K of
  them run and their figures are scaled by N/K (said so in the output).

Printed per N: end-to-end wall time, CPU seconds of the process trees (driver, Spark JVM,
Python workers: benchmarks/procmon.py), peak memory, table commits per second, and for the one
ingestion the steady cost per table commit (CPU and wall of a batch after the first, divided by
N); then N ingestions' CPU over the one ingestion's (the issue's goal: ≥ N/2 for N ≥ 10). Every
run must write every record (checked). Writes benchmarks/results/many-tables-<time>.json.

    python benchmarks/bench_many_tables.py --tables 1,10,50 --events 2000 --sample 10
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from run import _child_cmd, run_child, spark_row  # noqa: E402

BATCHES = 4  # per run: the first warms the JVM and the workers, the rest are steady


def base_config(bootstrap: str, batch: int, cores: int) -> dict[str, Any]:
    from lakesink.kafka.producer import SAMPLE_EVENT_DDL

    return {
        "kafka.bootstrap.servers": bootstrap,
        "value.format": "json",
        "value.schema": SAMPLE_EVENT_DDL,
        "kafka.max.records.per.batch": batch,
        "lock.provider": "filesystem",
        "spark.master": f"local[{cores}]",
        "table.services.inline.every.commits": 0,  # the commits alone
    }


def one_ingestion(
    bootstrap: str,
    topics: list[str],
    events: int,
    work: Path,
    cores: int,
    parallelism: int,
    delay_s: float = 0.0,
    write_path: str = "auto",
) -> dict[str, Any]:
    n = len(topics)
    cfg = base_config(bootstrap, max(1, n * events // BATCHES), cores)
    cfg["write.path"] = write_path
    cfg["commit.tables.parallelism"] = parallelism
    cfg["commit.publish.delay.s"] = delay_s
    cfg["kafka.topics"] = ",".join(topics)
    cfg["writer.id"] = f"bench-one-{n}"
    for i, topic in enumerate(topics):
        cfg[f"tables.t{i:03d}.table.path"] = str(work / f"one-{n}" / f"t{i:03d}")
        cfg[f"tables.t{i:03d}.route.topics"] = topic
    res, mon, _ = run_child(_child_cmd("spark", "lakesink", json.dumps(cfg), str(n * events)))
    row = spark_row(res, mon)
    row["table_commits"] = n * row["batches"]
    steady_batches = max(1, row["batches"] - 1)
    row["steady_cpu_ms_per_table_commit"] = 1e3 * row["steady_cpu_s"] / (n * steady_batches)
    row["steady_wall_ms_per_table_commit"] = 1e3 * row["steady_s"] / (n * steady_batches)
    row["steady_cpu_ms_per_table_commit_by_role"] = {
        role: round(1e3 * secs / (n * steady_batches), 1)
        for role, secs in row["steady_cpu_by_role_s"].items()
    }
    return row


def separate_ingestions(
    bootstrap: str, topics: list[str], events: int, work: Path, cores: int, sample: int
) -> dict[str, Any]:
    n = len(topics)
    ran = topics[: min(n, sample)] if sample else topics
    rows = []
    for i, topic in enumerate(ran):
        cfg = base_config(bootstrap, max(1, events // BATCHES), cores)
        cfg["kafka.topics"] = topic
        cfg["table.path"] = str(work / f"separate-{n}" / f"t{i:03d}")
        cfg["writer.id"] = f"bench-separate-{n}-{i}"
        res, mon, _ = run_child(_child_cmd("spark", "lakesink", json.dumps(cfg), str(events)))
        rows.append(spark_row(res, mon))
    scale = n / len(ran)
    return {
        "ran": len(ran),
        "scaled_by": scale,
        "records": sum(r["records"] for r in rows) * scale,
        "wall_s": sum(r["wall_s"] for r in rows) * scale,
        "cpu_s": sum(r["cpu_s"] for r in rows) * scale,
        "peak_rss_mb": max(r["memory"]["peak_total_rss_mb"] for r in rows),
        "table_commits": sum(r["batches"] for r in rows) * scale,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", default="1,10,50", help="the N to measure, comma-separated")
    ap.add_argument("--events", type=int, default=2000, help="records per topic")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--sample", type=int, default=10, help="separate runs per N (0: all N)")
    ap.add_argument("--separate-up-to", type=int, default=50, help="no N-ingestion runs above")
    ap.add_argument("--broker", choices=("kafka", "noida"), default="kafka")
    ap.add_argument(
        "--commit-parallelism",
        type=int,
        default=8,
        help="commit.tables.parallelism of the one ingestion (1: its tables one after another)",
    )
    ap.add_argument(
        "--publish-delay",
        type=float,
        default=0.0,
        help="commit.publish.delay.s of the one ingestion: seconds each table commit waits, "
        "to model a store's latency (an object store's requests)",
    )
    ap.add_argument(
        "--write-path",
        choices=("auto", "dataframe"),
        default="auto",
        help="write.path of the one ingestion: auto routes on the direct task path where the "
        "tables allow it (these do), dataframe on the DataFrame fan-out (the before)",
    )
    args = ap.parse_args()
    import subprocess

    from lakesink.kafka.kafka_server import local_broker
    from lakesink.kafka.producer import produce_sample_events

    subprocess.run([sys.executable, "-m", "lakesink.spark.prepare"], check=True)
    work = Path(tempfile.mkdtemp(prefix="lakesink-many-"))
    broker = local_broker(args.broker, data_dir=work / "broker")
    broker.start()
    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cores": args.cores,
        "commit_parallelism": args.commit_parallelism,
        "publish_delay_s": args.publish_delay,
        "write_path": args.write_path,
    }
    try:
        for n in (int(x) for x in args.tables.split(",")):
            topics = [f"many-{n}-{i:03d}" for i in range(n)]
            for topic in topics:
                produce_sample_events(broker.bootstrap_servers, topic, args.events, 1)
            row: dict[str, Any] = {
                "one": one_ingestion(
                    broker.bootstrap_servers,
                    topics,
                    args.events,
                    work,
                    args.cores,
                    args.commit_parallelism,
                    args.publish_delay,
                    args.write_path,
                )
            }
            if n <= args.separate_up_to:
                row["separate"] = separate_ingestions(
                    broker.bootstrap_servers, topics, args.events, work, args.cores, args.sample
                )
            report[str(n)] = row
            print_row(n, row, n * args.events)
            shutil.rmtree(work / f"one-{n}", ignore_errors=True)
            shutil.rmtree(work / f"separate-{n}", ignore_errors=True)
    finally:
        broker.close()
        shutil.rmtree(work, ignore_errors=True)
    out = HERE / "results" / f"many-tables-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"written: {out}")


def print_row(n: int, row: dict[str, Any], events: int) -> None:
    one = row["one"]
    ok = "ok" if one["records"] == events else f"WROTE {one['records']} OF {events}"
    print(
        f"N={n:<4} one ingestion: {one['wall_s']:7.1f} s wall, {one['cpu_s']:7.1f} s CPU, "
        f"peak {one['memory']['peak_total_rss_mb']:6.0f} MB, "
        f"{one['table_commits'] / one['wall_s']:6.1f} table commits/s, steady "
        f"{one['steady_cpu_ms_per_table_commit']:6.1f} ms CPU and "
        f"{one['steady_wall_ms_per_table_commit']:6.1f} ms wall per table commit ({ok})",
        flush=True,
    )
    roles = one["steady_cpu_ms_per_table_commit_by_role"]
    print(
        "       steady CPU per table commit by role: "
        + ", ".join(f"{role} {ms:.1f} ms" for role, ms in sorted(roles.items())),
        flush=True,
    )
    sep = row.get("separate")
    if sep is None:
        return
    ok = "ok" if round(sep["records"]) == events else f"WROTE {sep['records']:.0f} OF {events}"
    scaled = f" (scaled from {sep['ran']} runs by {sep['scaled_by']:.1f})" if sep["ran"] < n else ""
    print(
        f"       {n} ingestions: {sep['wall_s']:7.1f} s wall, {sep['cpu_s']:7.1f} s CPU, "
        f"peak {sep['peak_rss_mb']:6.0f} MB each{scaled} ({ok}); "
        f"CPU ratio {sep['cpu_s'] / one['cpu_s']:.1f}x, wall ratio "
        f"{sep['wall_s'] / one['wall_s']:.1f}x (goal for N>=10: CPU >= {n / 2:g}x)",
        flush=True,
    )


if __name__ == "__main__":
    main()
