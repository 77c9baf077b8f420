"""Upserts into Iceberg tables (issue 30): the keyed stream of upsert.py (issue 29) into lakesink's
copy-on-write and merge-on-read Iceberg tables of keys, against Spark + Iceberg `MERGE INTO` in
`foreachBatch` and pyiceberg's own `Table.upsert`, side by side in one run on one broker and the
same cores.

    python benchmarks/bench_iceberg_upsert.py    # default sizes: 7.5 minutes here at load 5-6
    python benchmarks/bench_iceberg_upsert.py --keys 200000 --hot-keys 10000 --hot-records 200000
    python benchmarks/bench_iceberg_upsert.py --issue-size --spaces large   # the issue's 1M keys
    python benchmarks/bench_iceberg_upsert.py --skip correctness            # throughput only
    python benchmarks/bench_iceberg_upsert.py --set write.keyed.single.task.max.records=0
    python benchmarks/bench_iceberg_upsert.py --print benchmarks/results/iceberg-upsert-<t>.json

The records and the two key spaces are upsert.py's (JSON {id, seq, payload ~200 B}, Kafka key =
id, partition = id mod 8, seq growing over the topic): `large` (`--keys` keys, each created once,
`--update-ratio` of the records updating an earlier key) and `hot` (`--hot-keys` keys updated at
random, `--hot-records` records in all). The defaults are sized down so a run takes minutes;
`--issue-size` sets the issue's: 1,000,000 keys with 10 % updates (1,111,111 records), 10,000 hot
keys over 1,000,000 records.

Variants, each reading the same topic from the start in batches of the same size:

- `lakesink-cow`, `lakesink-mor`: table.format=iceberg, write.operation=upsert, record key id,
  ordering field seq, table.bucket.count as upsert.py chooses it, iceberg.write.mode
  copy-on-write / merge-on-read (SQL catalog on a SQLite file in the warehouse);
- `spark-merge`: Spark 4.1 Structured Streaming (spark-sql-kafka-0-10) with Iceberg's Spark
  runtime 1.11 (the peers environment), `foreachBatch`: the batch folded by key (`max_by` seq),
  then `MERGE INTO` (a row replaced only by a higher seq; Iceberg's default copy-on-write);
- `pyiceberg-upsert`: one Python process in lakesink's venv: confluent-kafka reads a batch, folds
  it by key (Table.upsert refuses duplicate keys) and calls pyiceberg's `Table.upsert(join_cols=
  ["id"])` on a SQL catalog (SQLite). No offsets are stored: it is at-least-once (a restart
  reads the topic again from its start, over the table it left).

Figures per variant: rec/s (end to end and steady, after the first batch), CPU µs per record in
the steady window (procmon: the whole process tree), batches, and the correctness column: the
table read back with pyiceberg against a plain dict fold of the produced records (the highest
seq of each key wins; every column compared): wrong keys (missing, extra or another version) and
repeated keys, 0 expected.

Correctness after a crash (`--kill-variants`, default lakesink's two and pyiceberg's; spark-merge
too when named): each variant once more on a fresh table, its process group SIGKILLed half a
batch after its second batch, restarted (again, up to 3 times, if a restart fails) until it has
read the topic to its end, then the same fold check, plus, for lakesink, `lakesink verify`'s
fold audit of the committed Kafka ranges (formats/audit.py). The column also gives the records
the restart read: lakesink resumes from the offsets its table committed, Spark from its
checkpoint (its last batch again), pyiceberg's loop from the topic's start.

Results: benchmarks/results/iceberg-upsert-<time>.json (not committed).
"""

from __future__ import annotations

import argparse
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

from run import _child_cmd, _ratio, run_child, spark_row  # noqa: E402
from upsert import (  # noqa: E402
    COLUMNS,
    SPACES,
    VALUE_DDL,
    Topic,
    payload,
    per_batch,
    produce_space,
)

VARIANTS = ("lakesink-cow", "lakesink-mor", "spark-merge", "pyiceberg-upsert")
LABELS = {
    "lakesink-cow": "lakesink copy-on-write",
    "lakesink-mor": "lakesink merge-on-read",
    "spark-merge": "Spark + Iceberg MERGE INTO",
    "pyiceberg-upsert": "pyiceberg Table.upsert",
}
TABLE = "bench"  # lakesink's table name; namespace and catalog name are lakesink's defaults
NAMESPACE = "lakesink"
CATALOG = "lakesink"


def lakesink_config(
    bootstrap: str, topic: Topic, warehouse: Path, buckets: int, mode: str, args: Any
) -> dict[str, Any]:
    return {
        "kafka.bootstrap.servers": bootstrap,
        "kafka.topics": topic.name,
        "value.format": "json",
        "value.schema": VALUE_DDL.replace("id BIGINT", "id BIGINT NOT NULL"),
        "table.format": "iceberg",
        "table.name": TABLE,
        "table.path": str(warehouse),
        "kafka.max.records.per.batch": per_batch(topic, args),
        "writer.id": f"iceberg-upsert-{warehouse.parent.name}",
        "lock.provider": "filesystem",
        "spark.master": f"local[{args.cores}]",
        "write.operation": "upsert",
        "table.record.key.fields": "id",
        "table.ordering.field": "seq",
        "table.bucket.count": buckets,
        "iceberg.write.mode": mode,
    } | dict(item.partition("=")[::2] for item in getattr(args, "set", None) or [])


def variant_cmd(
    variant: str, bootstrap: str, topic: Topic, out: Path, buckets: int, args: Any
) -> list[str]:
    if variant.startswith("lakesink-"):
        mode = "copy-on-write" if variant == "lakesink-cow" else "merge-on-read"
        cfg = lakesink_config(bootstrap, topic, out / "warehouse", buckets, mode, args)
        return _child_cmd("spark", "lakesink", json.dumps(cfg), str(topic.records))
    pcfg = {
        "bootstrap": bootstrap,
        "topic": topic.name,
        "ends": {str(p): n for p, n in topic.ends.items()},
        "per_batch": per_batch(topic, args),
        "warehouse": str(out / "warehouse"),
    }
    if variant == "pyiceberg-upsert":
        return [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(pcfg)]
    from peers import PeerEnv

    env = PeerEnv.for_mode("delta")  # the Spark 4.1 peers venv, Iceberg's runtime beside Kafka's
    cache = Path(os.environ.get("LAKESINK_CACHE", HERE.parent / ".cache"))
    jars = [j for j in env.jars if "delta" not in Path(j).name and "unitycatalog" not in j]
    jars += sorted(str(p) for p in (cache / "iceberg-jars").glob("iceberg-spark-runtime-*.jar"))
    pcfg |= {
        "master": f"local[{args.cores}]",
        "value_ddl": VALUE_DDL,
        "checkpoint": str(out / "checkpoint"),
        "record_key": "id",
        "ordering": "seq",
        "jars": jars,
    }
    return [env.python, str(HERE / "iceberg_peer_job.py"), json.dumps(pcfg)]


def read_rows(variant: str, warehouse: Path) -> Any:
    """The table's COLUMNS as one pyarrow Table, read with pyiceberg (position deletes applied)."""
    if variant == "spark-merge":  # a Hadoop catalog: the newest metadata file is the table
        from pyiceberg.table import StaticTable

        meta = warehouse / "bench" / "upserts" / "metadata"
        hint = (meta / "version-hint.text").read_text().strip()
        table = StaticTable.from_metadata(str(meta / f"v{hint}.metadata.json"))
    else:
        table = _sql_catalog(warehouse).load_table(
            f"{NAMESPACE}.{TABLE}" if variant.startswith("lakesink-") else "bench.upserts"
        )
    return table.scan(selected_fields=COLUMNS).to_arrow()


def _sql_catalog(warehouse: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(
        CATALOG, uri=f"sqlite:///{warehouse / 'catalog.db'}", warehouse=warehouse.as_uri()
    )


def fold_check(variant: str, warehouse: Path, topic: Topic) -> dict[str, Any]:
    """The table against the dict fold of the produced records (the highest seq wins)."""
    rows = read_rows(variant, warehouse)
    got: dict[int, tuple[Any, ...]] = {}
    for row in rows.to_pylist():
        got[row["id"]] = tuple(row[c] for c in COLUMNS)
    wrong = 0
    for key, seq in topic.latest.items():
        want = payload(key, seq)
        if got.get(key) != tuple(want[c] for c in COLUMNS):
            wrong += 1
    return {
        "rows": rows.num_rows,
        "keys_expected": len(topic.latest),
        "wrong_keys": wrong + len(set(got) - set(topic.latest)),
        "repeated_keys": rows.num_rows - len(got),
    }


def lakesink_verify(
    bootstrap: str, topic: Topic, warehouse: Path, buckets: int, mode: str, args: Any
) -> dict[str, Any]:
    """`lakesink verify`'s audit of the table: the fold audit of its committed Kafka ranges."""
    from lakesink.cli.verify import audit_config
    from lakesink.config import build_config

    cfg = build_config(lakesink_config(bootstrap, topic, warehouse, buckets, mode, args))
    report = audit_config(cfg)
    return {
        "ok": report.ok,
        "keys": getattr(report, "keys", None),
        "wrong_keys": getattr(report, "wrong_keys", None),
        "problems": report.problems[:5],
    }


def _restart_records(log_dir: Path) -> int | None:
    """The records the last (successful) restart read, from its BENCH-RESULT line."""
    from run import _parse_result

    logs = sorted(log_dir.glob("restart-*.log"), key=lambda p: int(p.stem.split("-")[1]))
    try:
        return int(_parse_result(logs[-1].read_text())["records"]) if logs else None
    except (RuntimeError, KeyError, ValueError):
        return None


def correctness(
    bootstrap: str, topic: Topic, buckets: int, work: Path, args: Any
) -> dict[str, Any]:
    """Each of `--kill-variants` on a fresh table: SIGKILL mid-stream, restart, fold audit."""
    from peers import kill_and_audit

    out: dict[str, Any] = {}
    for variant in filter(None, args.kill_variants.split(",")):
        base = work / f"kill-{topic.name}-{variant}"
        (base / "warehouse").mkdir(parents=True, exist_ok=True)
        cmd = variant_cmd(variant, bootstrap, topic, base, buckets, args)

        def audit(v: str = variant, b: Path = base) -> dict[str, Any]:
            res = fold_check(v, b / "warehouse", topic)
            if v.startswith("lakesink-"):
                mode = "copy-on-write" if v == "lakesink-cow" else "merge-on-read"
                res["lakesink_verify"] = lakesink_verify(
                    bootstrap, topic, b / "warehouse", buckets, mode, args
                )
            return res

        t0 = time.perf_counter()
        try:
            res = kill_and_audit(cmd, base / "logs", audit)
        except Exception as e:  # one failed writer leaves the others' audits
            print(f"correctness run of {variant} failed: {e}", flush=True)
            out[variant] = {"failed": str(e)[-2000:]}
            continue
        res["restart_records"] = _restart_records(base / "logs")
        out[variant] = res
        print(
            f"{topic.name} {variant}: SIGKILL after {res['killed_after_batches']} batches, "
            f"restart read {res['restart_records']} records (restart and audit "
            f"{res['restart_s']}s), "
            f"{_fmt_audit(res)} ({time.perf_counter() - t0:.0f}s)",
            flush=True,
        )
    return out


def _fmt_audit(a: dict[str, Any] | None) -> str:
    if not a:
        return ""
    if "failed" in a:
        return "run failed"
    txt = f"{a['wrong_keys']:,} / {a['repeated_keys']:,}"
    if a.get("restart_records") is not None:
        txt += f", restart read {a['restart_records']:,}"
    if v := a.get("lakesink_verify"):
        txt += f"; verify {'PASS' if v['ok'] else 'FAIL'} ({v['wrong_keys']} wrong)"
    if a.get("failed_restarts"):
        txt += f" ({len(a['failed_restarts'])} failed restart(s))"
    return txt


def throughput(bootstrap: str, topic: Topic, buckets: int, work: Path, args: Any) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for variant in args.variants.split(","):
        out = work / f"{topic.name}-{variant}"
        (out / "warehouse").mkdir(parents=True, exist_ok=True)
        cmd = variant_cmd(variant, bootstrap, topic, out, buckets, args)
        t0 = time.perf_counter()
        try:
            res, mon, _ = run_child(cmd, name=variant)
        except RuntimeError as e:  # one variant failing leaves the others' figures
            print(f"{variant} failed: {str(e)[-1500:]}", flush=True)
            rows[variant] = {"failed": str(e)[-2000:]}
            continue
        r = spark_row(res, mon)
        steady_n = r["steady_records"]
        r["rec_s"] = r["records"] / r["wall_s"]
        r["steady_rec_s"] = steady_n / r["steady_s"] if r["steady_s"] == r["steady_s"] else None
        r["cpu_us_per_rec"] = 1e6 * r["steady_cpu_s"] / max(1, steady_n)
        r["cpu_s_per_1k"] = r["cpu_us_per_rec"] / 1000
        r["mean_batch_s"] = sum(r["batch_s"]) / len(r["batch_s"]) if r["batch_s"] else None
        for k in ("spark", "pyiceberg"):
            if k in res:
                r[k] = res[k]
        r["fold_check"] = fold_check(variant, out / "warehouse", topic)
        if r["records"] < topic.records:
            r["error"] = f"read {r['records']} of {topic.records} records"
        rows[variant] = r
        print(
            f"{topic.name} {variant}: {r['rec_s']:,.0f} rec/s, steady "
            f"{r['steady_rec_s'] or 0:,.0f}, {r['cpu_us_per_rec']:.1f} us/rec, "
            f"{r['batches']} batches, fold check {r['fold_check']} "
            f"({time.perf_counter() - t0:.0f}s)",
            flush=True,
        )
    return rows


# --- the pyiceberg variant's child process -------------------------------------------------


def pyiceberg_child(cfg: dict[str, Any]) -> dict[str, Any]:
    """Read the topic in batches of `per_batch` records with confluent-kafka, fold each batch by
    key (the last version in the partition's order has the highest seq) and `Table.upsert` it."""
    import pyarrow as pa
    import pyiceberg
    from confluent_kafka import Consumer, TopicPartition
    from pyiceberg.schema import Schema
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType

    t_session = time.time()
    warehouse = Path(cfg["warehouse"])
    catalog = _sql_catalog(warehouse)
    catalog.create_namespace_if_not_exists("bench")
    types = {"id": LongType(), "seq": LongType(), "amount": DoubleType()}
    fields = [
        NestedField(i, c, types.get(c, StringType()), required=c == "id")
        for i, c in enumerate(COLUMNS, 1)
    ]
    # a restart after a kill finds the table: at-least-once, it replays the topic over it
    table = catalog.create_table_if_not_exists(
        "bench.upserts", Schema(*fields, identifier_field_ids=[1]), properties={}
    )
    arrow_schema = pa.schema(
        [
            pa.field(
                c,
                {"id": pa.int64(), "seq": pa.int64(), "amount": pa.float64()}.get(c, pa.string()),
                nullable=c != "id",
            )
            for c in COLUMNS
        ]
    )
    consumer = Consumer(
        {
            "bootstrap.servers": cfg["bootstrap"],
            "group.id": "pyiceberg-upsert",
            "enable.auto.commit": False,
        }
    )
    ends = {int(p): int(n) for p, n in cfg["ends"].items()}
    consumer.assign([TopicPartition(cfg["topic"], p, 0) for p in ends])
    left = sum(ends.values())
    batches: list[tuple[float, int]] = []
    t_start = time.time()
    while left:
        want = min(int(cfg["per_batch"]), left)
        latest: dict[int, dict[str, Any]] = {}
        n = 0
        while n < want:
            for msg in consumer.consume(min(10_000, want - n), timeout=1.0):
                if msg.error():
                    raise RuntimeError(str(msg.error()))
                rec = json.loads(msg.value() or b"null")
                latest[rec["id"]] = rec  # a key's versions are in seq order in its partition
                n += 1
        table.upsert(pa.Table.from_pylist(list(latest.values()), arrow_schema), join_cols=["id"])
        left -= n
        batches.append((time.time(), n))
        print(f"BENCH-BATCH {len(batches)} {n}", flush=True)
    consumer.close()
    return {
        "mode": "pyiceberg-upsert",
        "records": sum(n for _, n in batches),
        "session_s": t_start - t_session,
        "t_start": t_start,
        "t_end": batches[-1][0] if batches else time.time(),
        "batches": batches,
        "pyiceberg": pyiceberg.__version__,
    }


# --- report ---------------------------------------------------------------------------------


def print_results(report: dict[str, Any]) -> None:
    print(
        f"\n{'keys':<6} {'variant':<28} {'records':>8} {'rec/s':>7} {'steady':>7} "
        f"{'cpu s/1k':>8} {'batches':>7} {'batch s':>7} {'ls÷it steady':>12} "
        f"{'it÷ls cpu':>9}  wrong / repeated keys  after SIGKILL + restart: wrong / repeated"
    )
    for space, res in report["spaces"].items():
        runs = res.get("runs", {})
        ls = runs.get("lakesink-cow", {})
        kills = res.get("correctness", {})
        for name, r in runs.items():
            label = LABELS.get(name, name)
            audit = _fmt_audit(kills.get(name))
            if "failed" in r:
                print(f"{space:<6} {label:<28} failed: {r['failed'].splitlines()[0][:100]}")
                continue
            vs = _ratio(ls.get("steady_rec_s"), r["steady_rec_s"])
            cpu = _ratio(r["cpu_us_per_rec"], ls.get("cpu_us_per_rec"))
            fc = r["fold_check"]
            print(
                f"{space:<6} {label:<28} {r['records']:>8,} {r['rec_s']:>7,.0f} "
                f"{r['steady_rec_s'] or 0:>7,.0f} {r['cpu_us_per_rec'] / 1000:>8.3f} "
                f"{r['batches']:>7} {r['mean_batch_s'] or 0:>7.1f} {vs or '':>12} "
                f"{cpu or '':>9}  {fc['wrong_keys']:,} / {fc['repeated_keys']:,}"
                + (f"  {audit}" if audit else "")
            )
        for name, a in kills.items():
            if name not in runs:
                print(f"{space:<6} {LABELS.get(name, name):<28} after SIGKILL: {_fmt_audit(a)}")
        print(
            f"       {space}: {res['records']:,} records over {res['keys']:,} keys, "
            f"{res['per_batch']:,} per batch, lakesink table.bucket.count {res['buckets']}; "
            "ratios against lakesink copy-on-write"
        )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--issue-size",
        action="store_true",
        help="the issue's sizes: 1,000,000 keys (large), 10,000 hot keys over 1,000,000 records",
    )
    ap.add_argument("--keys", type=int, default=20_000, help="keys of the large key space")
    ap.add_argument("--update-ratio", type=float, default=0.1, help="updates in the large space")
    ap.add_argument("--hot-keys", type=int, default=2_000, help="keys of the hot key space")
    ap.add_argument("--hot-records", type=int, default=20_000, help="records of the hot space")
    ap.add_argument("--spaces", default=",".join(SPACES), help="key spaces to run")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="variants to run")
    ap.add_argument(
        "--kill-variants",
        default="lakesink-cow,lakesink-mor,pyiceberg-upsert",
        help="variants SIGKILLed and restarted for the correctness column ('' for none)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a lakesink setting for lakesink's variants (repeatable)",
    )
    ap.add_argument("--skip", default="", help="comma-separated: throughput,correctness")
    ap.add_argument("--per-batch", type=int, default=500_000, help="most records per batch")
    ap.add_argument("--cores", type=int, default=2, help="Spark local[N]")
    ap.add_argument("--partitions", type=int, default=8, help="Kafka partitions of each topic")
    ap.add_argument("--buckets", type=int, default=0, help="table.bucket.count (0: by keys)")
    ap.add_argument("--broker", choices=("kafka", "noida"), default="kafka")
    ap.add_argument("--out", default=None, help="JSON (default results/iceberg-upsert-<time>.json)")
    ap.add_argument("--print", dest="print_json", help="print the table of a results JSON")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.issue_size:
        args.keys, args.hot_keys, args.hot_records = 1_000_000, 10_000, 1_000_000
    if args.child:
        res = pyiceberg_child(json.loads(args.child))
        print("BENCH-RESULT " + json.dumps(res), flush=True)
        return
    if args.print_json:
        return print_results(json.loads(Path(args.print_json).read_text()))
    skip = set(filter(None, args.skip.split(",")))
    if "correctness" in skip:
        args.kill_variants = ""
    unknown = set(args.variants.split(",") + args.kill_variants.split(",")) - set(VARIANTS) - {""}
    if unknown:
        raise SystemExit(f"unknown variant(s) {sorted(unknown)}: choose from {VARIANTS}")
    subprocess.run([sys.executable, "-m", "lakesink.spark.prepare"], check=True)
    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "argv": sys.argv[1:],
        "cores": args.cores,
        "load_avg_at_start": os.getloadavg(),
        "spaces": {},
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else HERE / "results" / f"iceberg-upsert-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if "spark-merge" in args.variants.split(",") + args.kill_variants.split(","):
        subprocess.run(["bash", str(HERE.parent / "scripts/setup-peers.sh")], check=True)
        subprocess.run(["bash", str(HERE.parent / "scripts/setup-iceberg-reader.sh")], check=True)
    work = Path(tempfile.mkdtemp(prefix="lakesink-iceberg-upsert-"))
    try:
        from lakesink.kafka.kafka_server import local_broker

        broker = local_broker(args.broker, data_dir=work / "broker")
        broker.start()
        try:
            bs = broker.bootstrap_servers
            for space in args.spaces.split(","):
                topic, buckets, entry = produce_space(bs, space, args)
                entry["runs"] = (
                    throughput(bs, topic, buckets, work, args) if "throughput" not in skip else {}
                )
                ls = entry["runs"].get("lakesink-cow", {})
                entry["ratios"] = {
                    f"lakesink-cow/{v}": {
                        "steady rec/s": _ratio(ls.get("steady_rec_s"), r.get("steady_rec_s")),
                        "end-to-end rec/s": _ratio(ls.get("rec_s"), r.get("rec_s")),
                        "its cpu/rec ÷ lakesink's": _ratio(
                            r.get("cpu_us_per_rec"), ls.get("cpu_us_per_rec")
                        ),
                    }
                    for v, r in entry["runs"].items()
                    if v != "lakesink-cow" and "failed" not in r
                }
                if args.kill_variants:
                    entry["correctness"] = correctness(bs, topic, buckets, work, args)
                report["spaces"][space] = entry
                out.write_text(json.dumps(report, indent=2))  # a cut run keeps this much
        finally:
            broker.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["load_avg_at_end"] = os.getloadavg()
    out.write_text(json.dumps(report, indent=2))
    print_results(report)
    print(
        f"\nload average at start {report['load_avg_at_start']}, at end {report['load_avg_at_end']}"
    )
    print(f"results: {out}")


if __name__ == "__main__":
    main()
