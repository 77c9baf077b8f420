"""What the decoupled commit buys: ingestion throughput with commit.mode=sync vs async when every
table commit is slowed (commit.publish.delay.s, a benchmark-only option modelling lock contention
or slow storage). Same broker, topic, Spark session and batch size for every run.

    python benchmarks/bench_async.py [--events 200000] [--batch 20000] [--delays 0,1,2]

Prints a table and writes benchmarks/results/async-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from lakesink.config import build_config
from lakesink.formats.hudi.audit import audit
from lakesink.kafka.embedded_broker import EmbeddedBroker
from lakesink.kafka.producer import SAMPLE_EVENT_DDL, produce_sample_events
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
    return {
        "mode": mode,
        "delay_s": delay,
        "records": result.records,
        "batches": result.batches,
        "wall_s": round(wall, 2),
        "rec_s": round(result.records / wall),
        "audit_ok": report.ok,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=20_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--delays", default="0,1,2")
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
