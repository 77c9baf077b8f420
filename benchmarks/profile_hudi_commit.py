"""Driver CPU of a steady Hudi commit, per table per batch, as one ingestion of N tables pays it.

No Spark and no Kafka: N Hudi tables, each with its writer's coordinator as an ingestion builds
it (`HudiCoordinator.from_settings`: the lease lock, heartbeats, fencing, the inline services
hook; `--services`, by default clean and archive), are driven through `begin_batch` and
`complete_batch` with synthetic write statuses (one small, empty base file and its marker per
Kafka partition, written untimed, as the tasks would). The
process CPU time of begin + complete (with the background threads it starts: heartbeats, marker
deletion) is measured per table per batch; then the same batches again under cProfile, whose
top functions show where that CPU goes. `--store s3` puts the tables in a bucket of the tests'
local S3 server (moto over HTTP) instead of local disk.

    python benchmarks/profile_hudi_commit.py [--tables 10] [--batches 20] [--partitions 2]
        [--store local|s3] [--services clean,archive] [--top 25] [--json FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

TOPIC = "bench"
RECORDS = 100  # per Kafka partition per batch (the statuses only say so)
SCHEMA = json.dumps(
    {"type": "record", "name": "bench_record", "fields": [{"name": "x", "type": "long"}]}
)


class Tables:
    """N tables and their coordinators, driven batch by batch."""

    def __init__(
        self, n: int, partitions: int, root: str, storage_keys: dict[str, Any], services: str
    ) -> None:
        from lakesink.config import build_config
        from lakesink.formats.hudi.coordinator import HudiCoordinator
        from lakesink.formats.hudi.table.config import TableConfig
        from lakesink.formats.hudi.table.hudi_table import HudiTable
        from lakesink.protocol.offsets import TopicPartition
        from lakesink.spark.pipeline import make_control

        self.partitions = [TopicPartition(TOPIC, p) for p in range(partitions)]
        self.items: list[tuple[Any, Any, dict[Any, int]]] = []
        for i in range(n):
            cfg = build_config(
                {
                    "kafka.bootstrap.servers": "127.0.0.1:1",
                    "kafka.topics": TOPIC,
                    "value.format": "raw",
                    "table.path": f"{root}/t{i}",
                    "writer.id": f"w{i}",
                    "lock.provider": "filesystem",
                    # the files are empty: clustering, which reads them, is left out
                    "table.services.inline": services,
                    **storage_keys,
                }
            )
            table = HudiTable.create(
                cfg.table_storage, TableConfig(f"t{i}", ("kafka_offset",), (), version=8)
            )
            control = make_control(cfg)
            coordinator = HudiCoordinator.from_settings(
                cfg.settings, table, control, query_id=f"q{i}"
            )
            coordinator.start()
            self.items.append((table, coordinator, dict.fromkeys(self.partitions, 0)))
        self.batch = 0

    def run_batch(self) -> float:
        """One batch on every table; the driver CPU seconds of begin + complete, all tables."""
        from lakesink.formats.hudi.table.files import base_file_name, new_file_id
        from lakesink.formats.hudi.table.markers import create_marker
        from lakesink.protocol.offsets import OffsetRange
        from lakesink.protocol.write_status import FileWrite, WriteStatus

        cpu = 0.0
        for table, coordinator, nxt in self.items:
            ranges = [OffsetRange(tp, o, o + RECORDS) for tp, o in nxt.items()]
            a = time.process_time()
            t = coordinator.begin_batch(self.batch, ranges)
            cpu += time.process_time() - a
            assert t is not None
            statuses = []
            for r in ranges:  # what the tasks do: a marker, then the file
                fid = new_file_id()
                name = base_file_name(fid, f"{r.partition.partition}-1-0", t)
                create_marker(table.storage, t, "", name)
                table.storage.write(name, b"")
                f = FileWrite("", fid, name, RECORDS, 1)
                statuses.append(
                    WriteStatus(t.value, f"0.{r.partition.partition}.0", r, (f,), RECORDS, 0)
                )
            a = time.process_time()
            coordinator.complete_batch(t, self.batch, ranges, statuses, schema=SCHEMA)
            cpu += time.process_time() - a
            for tp in nxt:
                nxt[tp] += RECORDS
        self.batch += 1
        return cpu


def run(args: argparse.Namespace) -> dict[str, Any]:
    from lakesink.formats.hudi.table.markers import wait_for_marker_deletions

    with ExitStack() as stack:
        if args.store == "s3":
            from s3_server import S3Server

            server = stack.enter_context(S3Server())
            root, keys = f"s3://{server.new_bucket('prof')}", server.storage_config()
        else:
            root, keys = stack.enter_context(tempfile.TemporaryDirectory()), {}
        tables = Tables(args.tables, args.partitions, root, keys, args.services)
        for _ in range(args.warmup):  # the first commits create folders and read nothing back
            tables.run_batch()
        wait_for_marker_deletions(60)
        per_table_ms = []
        wall = time.perf_counter()
        for _ in range(args.batches):
            per_table_ms.append(1000 * tables.run_batch() / args.tables)
        wall = time.perf_counter() - wall
        wait_for_marker_deletions(60)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.batches):
            tables.run_batch()
        profiler.disable()
        wait_for_marker_deletions(60)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    s = sorted(per_table_ms)
    return {
        "tables": args.tables,
        "partitions": args.partitions,
        "store": args.store,
        "batches": args.batches,
        "cpu_ms_per_table_batch": {
            "p50": round(statistics.median(s), 1),
            "mean": round(statistics.fmean(s), 1),
            "max": round(s[-1], 1),
        },
        "wall_ms_per_table_batch": round(1000 * wall / (args.batches * args.tables), 1),
        "profile": out.getvalue(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=10)
    ap.add_argument("--batches", type=int, default=20, help="measured batches (then profiled)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=2, help="Kafka partitions (files a batch)")
    ap.add_argument("--store", choices=("local", "s3"), default="local")
    ap.add_argument("--services", default="clean,archive", help="table.services.inline")
    ap.add_argument("--top", type=int, default=25, help="functions printed, by each order")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    res = run(args)
    print(res["profile"])
    cpu = res["cpu_ms_per_table_batch"]
    print(
        f"{args.tables} Hudi tables ({args.store}), {args.partitions} Kafka partitions: driver "
        f"CPU per table per batch p50 {cpu['p50']} ms, mean {cpu['mean']} ms, max {cpu['max']} "
        f"ms; wall {res['wall_ms_per_table_batch']} ms per table per batch"
    )
    if args.json:
        args.json.write_text(json.dumps({k: v for k, v in res.items() if k != "profile"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
