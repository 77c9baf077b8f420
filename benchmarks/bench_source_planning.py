"""What planning one batch costs the `lakesink-kafka` source's driver side (issue 30): the calls
Spark's source runner makes per batch (`latestOffset`: the topic's partitions, the topic ids,
the watermarks), timed in this process against a local Apache Kafka, with the planning clients
kept across batches (one reader for every batch, as Spark's runner keeps it) against new clients
per batch (the reader stopped after each call: one admin client and one consumer made and closed
per batch). Run from a tree before the clients were kept, both rows make new clients per batch,
three of them (two admin clients and a consumer).

    python benchmarks/bench_source_planning.py                 # 200 batches, 8 partitions
    python benchmarks/bench_source_planning.py --batches 500 --partitions 64

Prints wall ms and CPU ms (this process, every thread: librdkafka's included) per batch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def plan(reader: Any, batches: int, fresh: bool) -> dict[str, float]:
    from pyspark.sql.streaming.datasource import ReadMaxRows

    start = reader.initialOffset()
    walls: list[float] = []
    cpu0 = time.process_time()
    for _ in range(batches):
        t0 = time.perf_counter()
        reader.latestOffset(start, ReadMaxRows(1000))
        if fresh:
            reader.stop()  # the next call makes new clients
        walls.append(time.perf_counter() - t0)
    cpu = time.process_time() - cpu0
    reader.stop()
    return {
        "wall_ms_mean": 1000 * statistics.fmean(walls),
        "wall_ms_p50": 1000 * statistics.median(walls),
        "cpu_ms": 1000 * cpu / batches,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--partitions", type=int, default=8)
    args = ap.parse_args()

    from lakesink.config import build_config
    from lakesink.kafka.client import create_topic
    from lakesink.kafka.kafka_server import local_broker
    from lakesink.spark.source import KafkaStreamReader

    work = Path(tempfile.mkdtemp(prefix="lakesink-source-planning-"))
    broker = local_broker("kafka", data_dir=work / "broker")
    broker.start()
    try:
        bs = broker.bootstrap_servers
        create_topic(bs, "planning", args.partitions)
        cfg = build_config(
            {
                "kafka.bootstrap.servers": bs,
                "kafka.topics": "planning",
                "value.schema": "a INT",
                "table.path": str(work / "table"),
            }
        )
        rows = {}
        for name, fresh in (("stopped after each batch", True), ("one reader, all batches", False)):
            plan(KafkaStreamReader(cfg), 5, fresh)  # warms the imports and the broker
            rows[name] = plan(KafkaStreamReader(cfg), args.batches, fresh)
    finally:
        broker.close()
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"\n{args.batches} batches planned, 1 topic of {args.partitions} partitions, "
        f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    print(f"{'':<24} {'wall ms mean':>12} {'wall ms p50':>11} {'CPU ms':>7}  per batch")
    for name, r in rows.items():
        print(
            f"{name:<24} {r['wall_ms_mean']:>12.1f} {r['wall_ms_p50']:>11.1f} {r['cpu_ms']:>7.1f}"
        )


if __name__ == "__main__":
    main()
