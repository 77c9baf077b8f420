"""Tables on a local S3 server (moto over HTTP on loopback) against the local disk.

1. Commit path, no Spark: the Coordinator drives `--commits` batches (begin: lock, instant time,
   requested and inflight files; then one base file and its marker per Kafka partition; then
   complete: reconcile, lock, checks, publish), with archival on (ArchivePolicy min/max). On S3
   every request goes through the fault proxy of the tests (no faults injected), which counts
   LIST/GET/HEAD/PUT/POST/DELETE requests per commit. Reported per window of commits, so growth
   with commits and files shows.
2. Ingestion: Spark local[2] reads `--records` records from a local Apache Kafka broker into a
   table on local disk and one on S3 (straight to the server), records per second.

    python benchmarks/bench_storage.py [--commits 60] [--partitions 4] [--records 20000]
        [--json benchmarks/results/storage.json] [--skip-ingest]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from s3_faults import FaultProxy  # noqa: E402
from s3_server import S3Server  # noqa: E402

from lakesink.config import build_config  # noqa: E402
from lakesink.formats.hudi.coordinator import HudiCoordinator  # noqa: E402
from lakesink.formats.hudi.services.archival import ArchivePolicy, archive  # noqa: E402
from lakesink.formats.hudi.table.config import TableConfig  # noqa: E402
from lakesink.formats.hudi.table.files import base_file_name, new_file_id  # noqa: E402
from lakesink.formats.hudi.table.hudi_table import HudiTable  # noqa: E402
from lakesink.formats.hudi.table.markers import create_marker  # noqa: E402
from lakesink.protocol.offsets import OffsetRange, TopicPartition  # noqa: E402
from lakesink.protocol.write_status import FileWrite, WriteStatus  # noqa: E402
from lakesink.spark.pipeline import make_control  # noqa: E402

TOPIC = "bench"
WRITER = "bench-writer"
OPS = ("LIST", "GET", "HEAD", "PUT", "POST", "DELETE")
SCHEMA = json.dumps(
    {"type": "record", "name": "bench_record", "fields": [{"name": "x", "type": "long"}]}
)
POLICY = ArchivePolicy(min_instants=10, max_instants=20)


def _pcts(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {
        "p50": round(1000 * statistics.median(s), 1),
        "p95": round(1000 * s[min(len(s) - 1, round(0.95 * len(s)) - 1)], 1),
    }


def _storage_keys(server: S3Server, endpoint: str) -> dict[str, Any]:
    keys = server.storage_config()
    keys["storage.s3.endpoint"] = endpoint
    return keys


def commit_path(
    where: str, storage: dict[str, Any], commits: int, partitions: int, proxy: FaultProxy | None
) -> list[dict[str, Any]]:
    """`commits` coordinator batches with archival on; one row per window of 20 commits."""
    cfg = build_config(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "kafka.topics": TOPIC,
            "value.format": "raw",
            "table.path": where,
            "writer.id": WRITER,
            "lock.provider": "filesystem",
            **storage,
        }
    )
    store = cfg.table_storage
    table = HudiTable.create(store, TableConfig("bench", ("kafka_offset",), (), version=8))
    services = make_control(cfg)
    coordinator = HudiCoordinator(table, WRITER, query_id="bench", control=services)
    coordinator.start()
    next_offset = dict.fromkeys(range(partitions), 0)
    rows: list[dict[str, Any]] = []
    window: list[float] = []
    counted: Counter[str] = Counter()
    archived_total = 0
    for batch in range(commits):
        start = len(proxy.requests) if proxy is not None else 0
        a = time.perf_counter()
        ranges = [
            OffsetRange(TopicPartition(TOPIC, p), o, o + 1000) for p, o in next_offset.items()
        ]
        t = coordinator.begin_batch(batch, ranges)
        assert t is not None
        statuses = []
        for r in ranges:
            fid = new_file_id()
            name = base_file_name(fid, f"{r.partition.partition}-1-0", t)
            create_marker(store, t, "", name)
            store.write(name, b"")  # the file's content is not what a commit costs
            f = FileWrite("", fid, name, 1000, 1 << 20)
            statuses.append(WriteStatus(t.value, f"0.{r.partition.partition}.0", r, (f,), 1000, 0))
        coordinator.complete_batch(t, batch, ranges, statuses, schema=SCHEMA)
        result = archive(table, services, POLICY)  # inline archival, counted with the commit
        archived_total += len(result.archived)
        window.append(time.perf_counter() - a)
        if proxy is not None:
            counted.update(proxy.counts(start))
        for r in ranges:
            next_offset[r.partition.partition] = r.end
        if len(window) == 20 or batch == commits - 1:
            n = len(window)
            rows.append(
                {
                    "commits_upto": batch + 1,
                    "objects_in_table": len(store.list_prefix("")),
                    "active_instants": len(table.timeline().completed()),
                    "archived_instants": archived_total,
                    "commit_ms": _pcts(window),
                    "requests_per_commit": {k: round(counted[k] / n, 1) for k in OPS}
                    if proxy is not None
                    else None,
                }
            )
            window, counted = [], Counter()
    return rows


def ingestion(server: S3Server, records: int, partitions: int) -> dict[str, Any]:
    """Records per second of `lakesink ingest --once` into local disk and into S3."""
    from lakesink.kafka.kafka_server import local_broker
    from lakesink.kafka.producer import SAMPLE_EVENT_DDL, produce_sample_events
    from lakesink.spark.pipeline import Ingestion
    from lakesink.spark.session import get_spark

    out: dict[str, Any] = {"records": records, "kafka_partitions": partitions}
    with tempfile.TemporaryDirectory(prefix="lakesink-bench-storage-") as tmp:
        broker = local_broker("kafka", data_dir=Path(tmp) / "broker")
        broker.start()
        spark = get_spark("local[2]", {"spark.sql.shuffle.partitions": "2"})
        try:
            produce_sample_events(broker.bootstrap_servers, TOPIC, records, partitions)
            for name in ("warmup", "local", "s3"):
                bucket = server.new_bucket("bench")
                raw: dict[str, Any] = {
                    "kafka.bootstrap.servers": broker.bootstrap_servers,
                    "kafka.topics": TOPIC,
                    "value.format": "json",
                    "value.schema": SAMPLE_EVENT_DDL,
                    "kafka.max.records.per.batch": max(1000, records // 10),
                    "writer.id": f"bench-{name}",
                    "checkpoint.location": f"{tmp}/{name}-checkpoint",
                    "table.path": f"{tmp}/{name}" if name != "s3" else f"s3://{bucket}/t",
                }
                if name == "s3":
                    raw.update(server.storage_config())
                a = time.perf_counter()
                res = Ingestion(build_config(raw), spark).run(once=True, timeout_s=1200)
                seconds = time.perf_counter() - a
                assert res.records == records, (name, res.records)
                if name != "warmup":
                    out[name] = {"seconds": round(seconds, 1), "rec_s": round(records / seconds)}
        finally:
            spark.stop()
            broker.close()
    out["s3_vs_local"] = round(out["s3"]["rec_s"] / out["local"]["rec_s"], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=60)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--skip-ingest", action="store_true")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "storage.json")
    args = ap.parse_args(argv)
    result: dict[str, Any] = {"commits": args.commits, "kafka_partitions": args.partitions}
    with S3Server() as server, FaultProxy(server.endpoint_url) as proxy:
        with tempfile.TemporaryDirectory(prefix="lakesink-bench-storage-") as tmp:
            local = commit_path(f"{tmp}/t", {}, args.commits, args.partitions, None)
        bucket = server.new_bucket("bench")
        s3 = commit_path(
            f"s3://{bucket}/t",
            _storage_keys(server, proxy.endpoint_url),
            args.commits,
            args.partitions,
            proxy,
        )
        result["commit_path"] = {"local": local, "s3": s3}
        print(f"\ncommit path: {args.commits} commits, {args.partitions} Kafka partitions, ")
        print(f"archival min/max {POLICY.min_instants}/{POLICY.max_instants} active instants\n")
        head = f"{'commits':>7} {'objects':>7} {'local p50/p95 ms':>17} {'S3 p50/p95 ms':>15}"
        print(f"{head} {'S3/local p50':>12}  S3 requests per commit")
        for lo, so in zip(local, s3, strict=True):
            lp, sp = lo["commit_ms"], so["commit_ms"]
            reqs = " ".join(f"{k} {v}" for k, v in so["requests_per_commit"].items() if v)
            print(
                f"{so['commits_upto']:>7} {so['objects_in_table']:>7} "
                f"{lp['p50']:>8} / {lp['p95']:<6} {sp['p50']:>7} / {sp['p95']:<6} "
                f"{sp['p50'] / max(lp['p50'], 0.1):>11.1f}x  {reqs}"
            )
        if not args.skip_ingest:
            ing = ingestion(server, args.records, args.partitions)
            result["ingestion"] = ing
            print(
                f"\ningestion of {ing['records']} records: local {ing['local']['rec_s']} rec/s "
                f"({ing['local']['seconds']} s), S3 {ing['s3']['rec_s']} rec/s "
                f"({ing['s3']['seconds']} s), S3/local {ing['s3_vs_local']}"
            )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
