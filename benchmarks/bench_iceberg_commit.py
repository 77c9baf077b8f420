"""Iceberg commit latency on an aged table, and recovery time (prints figures; not a test).

A table in the SQL catalog (a SQLite file, or PostgreSQL with --postgres-dsn) is aged to
`--snapshots` snapshots holding `--files` data files: one writer ("old") commits first, then a
second writer ("main") commits the rest, each commit one fast append of files/snapshots data files
with lakesink's requirement (the writer's offsets in the lineage are the batch's start offsets).
The data files are descriptions only (the commit path reads manifests and metadata, never data
files), so building the history costs catalog commits, not Parquet writes.

Then, on that table:
1. commit latency without expiry: p50/p95 of `--measure` more appends (IcebergTable.commit_append:
   requirement check, manifest, manifest list, metadata file, catalog commit);
2. recovery: a fresh catalog + table load and the offsets of "main" (its newest commit is the
   current snapshot) and of "old" (the walk goes back through every snapshot), median of 5;
3. expire-snapshots (all but the current snapshot and each writer's newest commit): its time;
4. commit latency with expiry: p50/p95 of `--measure` more appends on the expired table, and
   recovery again.

    python benchmarks/bench_iceberg_commit.py [--files 10000] [--snapshots 1000] [--measure 50]
        [--postgres-dsn postgresql://user:pw@host:port/db] [--json PATH]

Writes benchmarks/results/iceberg-commit-<time>.json unless --json names another path.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from lakesink.formats.iceberg.catalog import CatalogSettings, open_catalog
from lakesink.formats.iceberg.datafiles import DataFileDescription
from lakesink.formats.iceberg.schema import parse_partition_spec
from lakesink.formats.iceberg.services import expire_snapshots
from lakesink.formats.iceberg.table import CommitOutcome, IcebergTable
from lakesink.kafka.reader import METADATA_FIELDS
from lakesink.protocol.offsets import OffsetRange, TopicPartition

HERE = Path(__file__).parent
ROWS = pa.schema([*METADATA_FIELDS, pa.field("value", pa.string())])
PARTITIONS = 8
ROWS_PER_FILE = 1000


class Aged:
    """One table and its writers' next offsets."""

    def __init__(self, settings: CatalogSettings) -> None:
        self.settings = settings
        self.table = self.open()
        self.next: dict[str, int] = {}
        self.serial = 0

    def open(self) -> IcebergTable:
        return IcebergTable.open(
            open_catalog(self.settings),
            "bench.events",
            ROWS,
            parse_partition_spec("kafka_partition"),
        )

    def commit(self, writer: str, files: int) -> float:
        """One batch of `files` data files over the partitions; seconds of commit_append."""
        topic = f"t-{writer}"
        ranges = []
        descs = []
        for p in range(PARTITIONS):
            n = files // PARTITIONS + (1 if p < files % PARTITIONS else 0)
            if n == 0:
                continue
            tp = TopicPartition(topic, p)
            start = self.next.get(str(tp), 0)
            ranges.append(OffsetRange(tp, start, start + n * ROWS_PER_FILE))
            self.next[str(tp)] = start + n * ROWS_PER_FILE
            for _ in range(n):
                self.serial += 1
                descs.append(
                    DataFileDescription(
                        path=f"{self.table.location}/data/kafka_partition={p}/f-{self.serial}.parquet",
                        size_bytes=4 << 20,
                        record_count=ROWS_PER_FILE,
                        spec_id=0,
                        partition=(p,),
                    )
                )
        requirement = self.table.begin(writer, ranges).requirement
        started = time.perf_counter()
        result = self.table.commit_append(descs, requirement)
        took = time.perf_counter() - started
        assert result.outcome is CommitOutcome.COMMITTED, result
        return took


def percentiles(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in seconds)
    return {
        "p50_ms": round(statistics.median(ms), 1),
        "p95_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.95))], 1),
    }


def recovery(aged: Aged) -> dict[str, float]:
    """Median of 5: catalog + table load and each writer's offsets, from a cold handle."""
    out: dict[str, list[float]] = {"load_ms": [], "main_offsets_ms": [], "old_offsets_ms": []}
    for _ in range(5):
        started = time.perf_counter()
        table = aged.open()
        loaded = time.perf_counter()
        main = table.committed_offsets("main")
        walked_main = time.perf_counter()
        old = table.committed_offsets("old")
        walked_old = time.perf_counter()
        assert main.next_offsets and old.next_offsets
        out["load_ms"].append((loaded - started) * 1000)
        out["main_offsets_ms"].append((walked_main - loaded) * 1000)
        out["old_offsets_ms"].append((walked_old - walked_main) * 1000)
    return {k: round(statistics.median(v), 2) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--snapshots", type=int, default=1_000)
    ap.add_argument("--measure", type=int, default=50)
    ap.add_argument("--postgres-dsn", default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    per_commit = max(1, args.files // args.snapshots)
    with tempfile.TemporaryDirectory(prefix="bench-iceberg-") as tmp:
        settings = CatalogSettings(
            warehouse=str(Path(tmp) / "wh"),
            uri=args.postgres_dsn,
            name="b" + str(int(time.time())),
        )
        aged = Aged(settings)
        started = time.perf_counter()
        aged.commit("old", per_commit)
        build = [aged.commit("main", per_commit) for _ in range(args.snapshots - 1)]
        build_s = time.perf_counter() - started
        snapshots = len(aged.table.pyiceberg.metadata.snapshots)
        files = sum(1 for _ in aged.table.pyiceberg.scan().plan_files())
        print(f"built {snapshots} snapshots, {files} data files in {build_s:.1f} s")
        print(f"  first 50 commits p50 {percentiles(build[:50])['p50_ms']} ms")

        without = percentiles([aged.commit("main", per_commit) for _ in range(args.measure)])
        rec_without = recovery(aged)
        print(f"without expiry ({snapshots + args.measure} snapshots): commit {without}")
        print(f"  recovery {rec_without}")

        started = time.perf_counter()
        expired = expire_snapshots(aged.table, 0, now_ms=int(time.time() * 1000) + 1000)
        expire_s = time.perf_counter() - started
        print(
            f"expire-snapshots: {len(expired.expired)} expired, {expired.retained} retained "
            f"in {expire_s:.2f} s"
        )
        with_expiry = percentiles([aged.commit("main", per_commit) for _ in range(args.measure)])
        rec_with = recovery(aged)
        print(f"with expiry ({expired.retained + args.measure} snapshots): commit {with_expiry}")
        print(f"  recovery {rec_with}")
    result = {
        "args": vars(args) | {"json": str(args.json) if args.json else None},
        "catalog": "postgres" if args.postgres_dsn else "sqlite",
        "files_per_commit": per_commit,
        "build": {"snapshots": snapshots, "data_files": files, "seconds": round(build_s, 1)},
        "commit_without_expiry": without,
        "recovery_without_expiry": rec_without,
        "expire": {"expired": len(expired.expired), "seconds": round(expire_s, 2)},
        "commit_with_expiry": with_expiry,
        "recovery_with_expiry": rec_with,
    }
    out = args.json or HERE / "results" / f"iceberg-commit-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
