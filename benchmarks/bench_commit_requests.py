"""What one steady streaming commit asks of an object store, by request type, for Hudi and Iceberg.

`lakesink ingest --once` (Spark local[2], a local Apache Kafka broker) writes into a table on a
local S3 server (moto over HTTP); every request of the driver and of the tasks goes through the
fault proxy of the tests (no faults), which logs its S3 operation (LIST, GET, HEAD, PUT, POST,
DELETE) and key. Two runs on fresh tables differ only in their number of batches (1 and
1 + `--batches`): the difference, divided by `--batches`, is what a steady commit costs, start,
recovery and the table's creation cancelled out. Requests on data files (`.parquet`: the
multipart uploads of base and data files) are counted apart from the metadata requests (timeline,
markers, lock, heartbeats, Iceberg metadata, manifests), and so are the writes of the writer's
liveness file, which a clock renews (`periodic`: they depend on the run's length, not on its
commits). Hudi takes the lease lock on the store (`lock.provider=filesystem`); the variant
`hudi-pglock` takes it in a PostgreSQL server the benchmark starts (Debian's, on loopback, as
the tests do): what a Hudi commit asks of the store when the lock lives elsewhere.

    python benchmarks/bench_commit_requests.py [--batches 4] [--partitions 2]
        [--formats hudi,iceberg,hudi-pglock] [--json benchmarks/results/commit_requests.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from s3_faults import FaultProxy, Request  # noqa: E402
from s3_server import S3Server  # noqa: E402

OPS = ("LIST", "GET", "HEAD", "PUT", "POST", "DELETE")
RECORDS_PER_BATCH = 200
FORMATS = ("hudi", "iceberg")
VARIANTS = (*FORMATS, "hudi-pglock")


def _key(r: Request, bucket: str) -> str:
    """The key (or, for a LIST, the prefix) a request names, relative to the table root."""
    parts = urlsplit(r.target)
    if r.op == "LIST":
        key = parse_qs(parts.query).get("prefix", [""])[0]
    else:
        key = unquote(parts.path).lstrip("/").removeprefix(bucket).lstrip("/")
    return key.removeprefix("t/")


def _where(key: str) -> str:
    """The folder a request is about, coarse: what the docs' table names."""
    if key.endswith(".parquet") or ".parquet?" in key:
        return "data file"
    if "/liveness/" in key:
        return "liveness"  # renewed on a clock, not per commit
    for folder in (
        ".hoodie/.temp",
        ".hoodie/.lakesink/lock",
        ".hoodie/.heartbeat",
        ".hoodie/.aux",
        ".hoodie/.lakesink",
        ".hoodie/timeline",
        ".hoodie",
    ):
        if key.startswith(folder):
            return folder
    if "/metadata/" in key or key.startswith("metadata"):
        return "iceberg metadata"
    if ".lakesink" in key:
        return ".lakesink"
    return "other"


def count(requests: list[Request], bucket: str) -> dict[str, Counter[str]]:
    """Requests by operation, metadata and data files apart, and by (operation, folder)."""
    meta: Counter[str] = Counter()
    data: Counter[str] = Counter()
    periodic: Counter[str] = Counter()
    folders: Counter[str] = Counter()
    for r in requests:
        where = _where(_key(r, bucket))
        bucket_of = {"data file": data, "liveness": periodic}.get(where, meta)
        bucket_of[r.op] += 1
        folders[f"{r.op} {where}"] += 1
    return {"metadata": meta, "data": data, "periodic": periodic, "by_folder": folders}


def one_run(
    fmt: str,
    batches: int,
    *,
    server: S3Server,
    proxy: FaultProxy,
    bootstrap: str,
    spark: Any,
    partitions: int,
    tmp: Path,
    postgres_dsn: str | None = None,
) -> tuple[dict[str, Counter[str]], int]:
    """Ingest `batches` batches into a fresh table through the proxy; its requests and commits."""
    from lakesink.config import build_config
    from lakesink.formats.hudi.table.markers import wait_for_marker_deletions
    from lakesink.kafka.producer import produce_sample_events
    from lakesink.spark.pipeline import Ingestion

    bucket = server.new_bucket("req")
    topic = f"req-{bucket}"
    produce_sample_events(bootstrap, topic, RECORDS_PER_BATCH * batches, partitions)
    keys = server.storage_config()
    keys["storage.s3.endpoint"] = proxy.endpoint_url
    raw: dict[str, Any] = {
        "kafka.bootstrap.servers": bootstrap,
        "kafka.topics": topic,
        "value.format": "raw",
        "kafka.max.records.per.batch": RECORDS_PER_BATCH,
        "writer.id": f"w-{bucket}",
        "checkpoint.location": str(tmp / f"{bucket}-checkpoint"),
        "table.path": f"s3://{bucket}/t",
        "lock.provider": "filesystem",
        **keys,
    }
    if fmt == "hudi-pglock":
        assert postgres_dsn is not None
        raw["lock.provider"] = "postgres"
        raw["postgres.dsn"] = postgres_dsn
    if fmt == "iceberg":
        raw["table.format"] = "iceberg"
        raw["table.name"] = "events"
        raw["iceberg.catalog.uri"] = f"sqlite:///{tmp / bucket}.db"
    cfg = build_config(raw)
    start = len(proxy.requests)
    result = Ingestion(cfg, spark).run(once=True, timeout_s=600)
    wait_for_marker_deletions(timeout_s=60)
    assert result.records == RECORDS_PER_BATCH * batches, (fmt, batches, result.records)
    return count(proxy.requests[start:], bucket), result.batches


def steady(fmt: str, batches: int, **kw: Any) -> dict[str, Any]:
    """Per steady commit: (run of 1 + batches) - (run of 1), divided by batches."""
    one, n1 = one_run(fmt, 1, **kw)
    more, n2 = one_run(fmt, 1 + batches, **kw)
    commits = n2 - n1
    assert commits == batches, (fmt, n1, n2)
    out: dict[str, Any] = {"commits": commits}
    for part in ("metadata", "data", "periodic", "by_folder"):
        diff = Counter(more[part])
        diff.subtract(one[part])
        out[part] = {k: round(v / commits, 2) for k, v in sorted(diff.items()) if v}
    out["metadata_total"] = round(sum(out["metadata"].values()), 2)
    return out


def print_table(results: dict[str, Any]) -> None:
    print(f"\nrequests per steady commit ({RECORDS_PER_BATCH} records a batch)\n")
    print(f"{'format':<8} {'kind':<9} " + " ".join(f"{op:>6}" for op in OPS) + f" {'total':>6}")
    for fmt, r in results.items():
        for part in ("metadata", "data", "periodic"):
            row = [r[part].get(op, 0) for op in OPS]
            cells = " ".join(f"{v:>6g}" for v in row)
            print(f"{fmt:<8} {part:<9} {cells} {round(sum(row), 2):>6g}")
    for fmt, r in results.items():
        print(f"\n{fmt}, by folder:")
        for k, v in sorted(r["by_folder"].items(), key=lambda kv: -kv[1]):
            print(f"  {v:>6g}  {k}")


def run(batches: int, partitions: int, formats: tuple[str, ...]) -> dict[str, Any]:
    from lakesink.kafka.kafka_server import local_broker
    from lakesink.spark.session import get_spark

    unknown = sorted(set(formats) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"--formats: unknown {', '.join(unknown)}; valid: {', '.join(VARIANTS)}")
    results: dict[str, Any] = {}
    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="lakesink-bench-requests-"))
        postgres_dsn = None
        if "hudi-pglock" in formats:
            from integration.pg_fixture import start_postgres

            pg = start_postgres()  # a folder of its own: the postgres user reads it
            stack.callback(shutil.rmtree, pg.base_dir, ignore_errors=True)
            stack.callback(pg.stop)
            postgres_dsn = pg.dsn
        broker = local_broker("kafka", data_dir=Path(tmp) / "broker")
        broker.start()
        spark = get_spark("local[2]", {"spark.sql.shuffle.partitions": "2"})
        try:
            with S3Server() as server, FaultProxy(server.endpoint_url) as proxy:
                kw = {
                    "server": server,
                    "proxy": proxy,
                    "bootstrap": broker.bootstrap_servers,
                    "spark": spark,
                    "partitions": partitions,
                    "tmp": Path(tmp),
                    "postgres_dsn": postgres_dsn,
                }
                for fmt in formats:
                    results[fmt] = steady(fmt, batches, **kw)
        finally:
            spark.stop()
            broker.close()
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--json", type=Path, default=HERE / "results" / "commit_requests.json")
    args = ap.parse_args(argv)
    formats = tuple(f for f in args.formats.split(",") if f)
    results = run(args.batches, args.partitions, formats)
    print_table(results)
    report = {"batches": args.batches, "kafka_partitions": args.partitions, "formats": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
