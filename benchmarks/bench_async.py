"""What the decoupled commit buys: ingestion throughput with commit.mode=sync vs async when every
table commit is slowed (commit.publish.delay.s, a benchmark-only option modelling lock contention
or slow storage). Same broker, topic, Spark session and batch size for every run.

    python benchmarks/bench_async.py [--events 200000] [--batch 20000] [--delays 0,1,2]

With `--keys N` the table is an Iceberg table of keys instead (write.operation=cdc, N accounts,
--events changes, iceberg.write.mode from --iceberg-mode): a batch of keys plans after the one
before is published, so only the publish overlaps Spark's per-batch work; `--rounds` runs
sync and async alternately that many times (the figures of a loaded machine move a lot). The
audit is the fold audit (pyiceberg and DuckDB against the fold of the committed ranges).

Prints a table and writes benchmarks/results/async-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from lakesink.cli.verify import audit_config
from lakesink.config import build_config
from lakesink.formats.hudi.audit import audit
from lakesink.kafka.embedded_broker import EmbeddedBroker
from lakesink.kafka.producer import SAMPLE_EVENT_DDL, produce_sample_events
from lakesink.kafka.sample_changes import ACCOUNTS_DDL, produce_sample_changes
from lakesink.spark.pipeline import Ingestion
from lakesink.spark.session import get_spark


def run_once(
    spark: Any, bootstrap: str, topic: str, work: Path, mode: str, delay: float, batch: int
) -> dict[str, Any]:
    table = work / f"{mode}-{delay}"
    cfg = build_config(
        {
            "kafka.bootstrap.servers": bootstrap,
            "kafka.topics": topic,
            "value.schema": SAMPLE_EVENT_DDL,
            "table.path": str(table),
            "kafka.max.records.per.batch": batch,
            "commit.mode": mode,
            "commit.publish.delay.s": delay,
            "commit.max.pending": 4,
            "writer.id": f"bench-{mode}",
        }
    )
    started = time.monotonic()
    result = Ingestion(cfg, spark).run(once=True)
    wall = time.monotonic() - started
    report = audit(str(table), cfg.writer_id, bootstrap=bootstrap)
    return _row(mode, delay, result, wall, report.ok)


def run_keyed(
    spark: Any, bootstrap: str, topic: str, work: Path, mode: str, batch: int, iceberg_mode: str
) -> dict[str, Any]:
    """One --once ingestion of the change stream into a fresh Iceberg table of keys."""
    name = f"{mode}_{time.monotonic_ns()}"
    cfg = build_config(
        {
            "kafka.bootstrap.servers": bootstrap,
            "kafka.topics": topic,
            "value.schema": ACCOUNTS_DDL,
            "table.format": "iceberg",
            "table.path": str(work / "wh"),
            "table.name": name,
            "write.operation": "cdc",
            "table.record.key.fields": "id",
            "table.bucket.count": 4,
            "iceberg.write.mode": iceberg_mode,
            "kafka.max.records.per.batch": batch,
            "commit.mode": mode,
            "writer.id": f"bench-{name}",
        }
    )
    started = time.monotonic()
    result = Ingestion(cfg, spark).run(once=True)
    wall = time.monotonic() - started
    return _row(mode, 0.0, result, wall, audit_config(cfg).ok)


def _row(mode: str, delay: float, result: Any, wall: float, ok: bool) -> dict[str, Any]:
    return {
        "mode": mode,
        "delay_s": delay,
        "records": result.records,
        "batches": result.batches,
        "wall_s": round(wall, 2),
        "rec_s": round(result.records / wall),
        "audit_ok": ok,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=20_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--delays", default="0,1,2")
    ap.add_argument("--keys", type=int, default=0, help="an Iceberg table of keys of N accounts")
    ap.add_argument("--iceberg-mode", default="merge-on-read")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.keys:
        return main_keyed(args)
    delays = [float(d) for d in args.delays.split(",")]
    spark = get_spark("local[2]")
    rows: list[dict[str, Any]] = []
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        produce_sample_events(broker.bootstrap_servers, "bench-async", args.events, args.partitions)
        # Warm the JVM and Python workers so the first measured run is not charged for it.
        run_once(spark, broker.bootstrap_servers, "bench-async", Path(tmp), "sync", 0.0, args.batch)
        for delay in delays:
            for mode in ("sync", "async"):
                r = run_once(
                    spark,
                    broker.bootstrap_servers,
                    "bench-async",
                    Path(tmp) / "m",
                    mode,
                    delay,
                    args.batch,
                )
                rows.append(r)
                verdict = "ok" if r["audit_ok"] else "FAIL"
                print(
                    f"{mode:5}  delay {delay:3.1f}s  {r['records']:>8,} rec  "
                    f"{r['batches']:3} batches  {r['wall_s']:7.1f}s  {r['rec_s']:>8,} rec/s  "
                    f"audit {verdict}",
                    flush=True,
                )
    print("\ndelay  sync rec/s  async rec/s  async/sync")
    for delay in delays:
        s = next(r for r in rows if r["mode"] == "sync" and r["delay_s"] == delay)
        a = next(r for r in rows if r["mode"] == "async" and r["delay_s"] == delay)
        print(
            f"{delay:4.1f}s  {s['rec_s']:>10,}  {a['rec_s']:>11,}  {a['rec_s'] / s['rec_s']:9.2f}x"
        )
    out = Path(__file__).parent / "results" / f"async-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "runs": rows}, indent=2))
    print(f"\nwrote {out}")
    spark.stop()


def main_keyed(args: argparse.Namespace) -> None:
    import os

    spark = get_spark("local[2]")
    rows: list[dict[str, Any]] = []
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        bootstrap = broker.bootstrap_servers
        produce_sample_changes(bootstrap, "bench-keys", args.keys, args.events, args.partitions)
        work = Path(tmp)
        # warm the JVM and the Python workers
        run_keyed(spark, bootstrap, "bench-keys", work, "sync", args.batch, args.iceberg_mode)
        for _ in range(args.rounds):
            for mode in ("sync", "async"):
                load = os.getloadavg()[0]
                r = run_keyed(
                    spark, bootstrap, "bench-keys", work, mode, args.batch, args.iceberg_mode
                )
                r["load"] = round(load, 1)
                rows.append(r)
                print(
                    f"{mode:5}  {r['records']:>8,} rec  {r['batches']:3} batches  "
                    f"{r['wall_s']:7.1f}s  {r['rec_s']:>8,} rec/s  load {load:5.1f}  "
                    f"fold audit {'ok' if r['audit_ok'] else 'FAIL'}",
                    flush=True,
                )
    for mode in ("sync", "async"):
        walls = sorted(r["wall_s"] for r in rows if r["mode"] == mode)
        print(f"{mode:5}  wall s {walls}")
    out = Path(__file__).parent / "results" / f"async-keys-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "runs": rows}, indent=2))
    print(f"\nwrote {out}")
    spark.stop()


if __name__ == "__main__":
    main()
