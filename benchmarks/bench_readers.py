"""Read time of one table lakesink wrote, in three readers: Java Hudi (Spark with the Hudi
bundle, in the interop environment of scripts/setup-interop.sh), hudi-rs and lakesink's own
reader. The table: `--rows` rows (default 1M) of Kafka-shaped events in `--commits` commits
over 8 partitions, version 8. Each reader reads every row of the snapshot `--repeat` times;
the figures are the median and best of those runs, after one warm-up run.

Run: python benchmarks/bench_readers.py [--rows 1000000] [--commits 10] [--repeat 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import tempfile
import time
from pathlib import Path

import hudi
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from interop.java_hudi import JavaHudi

from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.table.writer import PartitionedWriter
from lakesink.protocol.instant import Action, InstantTime

PARTITIONS = 8


def _events(start: int, n: int) -> pa.Table:
    offsets = pa.array(range(start, start + n), pa.int64())
    base = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    return pa.table(
        {
            "kafka_topic": pa.array(["events"] * n, pa.string()),
            "kafka_partition": pa.array([i % PARTITIONS for i in range(n)], pa.int32()),
            "kafka_offset": offsets,
            "kafka_timestamp": pa.array(
                [base + dt.timedelta(milliseconds=i) for i in range(start, start + n)],
                pa.timestamp("ms", tz="UTC"),
            ),
            "event_id": offsets,
            "user": pa.array([f"user-{i % 5000}" for i in range(start, start + n)], pa.string()),
            "amount": pa.array([i / 100 for i in range(start, start + n)], pa.float64()),
            "payload": pa.array([f"{i:020d}" * 5 for i in range(start, start + n)], pa.string()),
        }
    )


def build(path: Path, rows: int, commits: int) -> HudiTable:
    cfg = TableConfig(
        "bench_events",
        ("kafka_topic", "kafka_partition", "kafka_offset"),
        ("kafka_partition",),
        version=8,
    )
    table = HudiTable.create(path, cfg)
    per = rows // commits
    ms = int(time.time() * 1000) - 3_600_000
    for c in range(commits):
        t = InstantTime.from_epoch_ms(ms + c * 1000)
        inst = table.timeline().begin(Action.COMMIT, t)
        writer = PartitionedWriter(table, t, "0-1-0")
        n = per if c < commits - 1 else rows - per * (commits - 1)
        writer.write(_events(c * per, n))
        writes = writer.close()
        md = CommitMetadata("BULK_INSERT", tuple(writes), schema=writer.avro_schema or "")
        table.timeline().publish(inst, md)
    return table


def _timed(read: object, repeat: int) -> tuple[list[float], int]:
    out, n = [], 0
    for _ in range(repeat + 1):  # the first run warms caches and is not counted
        start = time.perf_counter()
        n = read()  # type: ignore[operator]
        out.append(time.perf_counter() - start)
    return out[1:], n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--commits", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="lakesink-bench-readers-") as tmp:
        start = time.perf_counter()
        table = build(Path(tmp) / "events", args.rows, args.commits)
        files = len(list(table.base_path.glob("kafka_partition=*/*.parquet")))
        size = sum(f.stat().st_size for f in table.base_path.rglob("*.parquet"))
        print(
            f"table: {args.rows} rows, {args.commits} commits, {files} base files, "
            f"{size / 2**20:.1f} MiB, written in {time.perf_counter() - start:.1f}s"
        )

        def rs() -> int:
            t = hudi.HudiTableBuilder.from_base_uri(str(table.base_path)).build()
            return sum(b.num_rows for b in t.read())

        def ours() -> int:
            return int(TableReader(HudiTable.open(table.base_path)).snapshot().num_rows)

        results: dict[str, tuple[list[float], int]] = {
            "hudi-rs": _timed(rs, args.repeat),
            "lakesink reader": _timed(ours, args.repeat),
        }
        started = time.perf_counter()
        java = JavaHudi()
        print(f"Java Hudi session started in {time.perf_counter() - started:.1f}s")
        try:
            for name, opts in [
                ("Java Hudi", {}),
                ("Java Hudi, metadata table off", {"hoodie.metadata.enable": "false"}),
            ]:
                seconds, n = java.time_read(table.base_path, opts, repeat=args.repeat + 1)
                results[name] = seconds[1:], n
        finally:
            java.close()
    print(f"{'reader':32} {'rows':>9} {'median s':>9} {'best s':>8} {'Mrows/s':>8}")
    for name, (seconds, n) in results.items():
        med = statistics.median(seconds)
        print(f"{name:32} {n:9d} {med:9.2f} {min(seconds):8.2f} {n / med / 1e6:8.2f}")
        if n != args.rows:
            print(f"  {name} returned {n} rows, expected {args.rows}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
