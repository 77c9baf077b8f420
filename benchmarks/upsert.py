"""Upserts (issue 29): a keyed stream of versions into a table that holds the latest version of
each key, lakesink against the peers, side by side in one run on one broker and the same cores.

    python benchmarks/upsert.py                      # the default sizes, every variant
    python benchmarks/upsert.py --keys 20000 --hot-records 20000 --skip correctness   # quick
    python benchmarks/upsert.py --print benchmarks/results/upsert-<time>.json

Records are JSON {id, seq, payload fields (~200 B in all)}, Kafka key = id, partition = id mod
`--partitions` (a key's versions stay in order), seq growing over the whole topic. Two key
spaces, each its own topic:

- `large`: `--keys` keys (default 200,000; the issue says 1M, sized down for a 2-core machine),
  each created once, 10% of the records (`--update-ratio`) updating an earlier key at random;
- `hot`: `--hot-keys` keys (10,000), created by the first records, then every record an update
  of one of them at random, `--hot-records` records in all.

Variants, each reading the same topic from the start:

- `lakesink`: write.operation=upsert, table.record.key.fields=id, table.ordering.field=seq,
  table.bucket.count printed (one bucket per ~50,000 keys, a multiple of the cores);
- `lakesink-mor`: the same into a merge-on-read table (table.type=MERGE_ON_READ, no inline
  compaction: every batch a deltacommit); after its run the table is read, compacted with
  `lakesink table compact` and read again;
- `hudi-upsert`: Hudi 1.2.0's streaming sink (Spark 3.5), copy-on-write, upsert, record key id,
  precombine seq, Hudi's default index;
- `delta-merge`: Spark 4.1 Structured Streaming, foreachBatch: the batch folded by key, then
  Delta's MERGE (a row replaced only by a higher seq).

Figures: rec/s (end to end and steady, after the first batch), CPU µs per record in the steady
window (procmon: the whole process tree), peak RSS, write amplification (every byte of every
file that appeared in the table's folder, its largest size seen, sampled each second and at the
end, ÷ the Kafka values' bytes), mean batch time (finish to finish, after the first batch),
and for lakesink's tables: the bytes the commits added (their write stats: base and log files;
compaction apart), the driver's batch and publish times (p50/p95), CPU s per 1,000 records, and
full reads with hudi-rs and lakesink's reader at the end, 5 each (`lakesink-mor`: also the
compaction's time and bytes, and the reads after it); a second table sets them side by side.
Correctness: each variant once more on a fresh table, SIGKILLed (its process group) mid-batch
after 2 batches, restarted to the end, then the table read back (lakesink and Hudi: hudi-rs;
Delta: delta-rs) and compared with the fold of the produced records by key (the highest seq
wins): wrong keys (missing, extra, or another version) and repeated keys must be 0. lakesink's
table is also audited by `lakesink verify`'s fold audit (formats/audit.py compare_with_fold).

Results: benchmarks/results/upsert-<time>.json (not committed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from run import _child_cmd, _ratio, run_child, spark_row  # noqa: E402

VARIANTS = ("lakesink", "lakesink-mor", "hudi-upsert", "delta-merge")
LAKESINK = ("lakesink", "lakesink-mor")
LABELS = {
    "lakesink": "lakesink upsert",
    "lakesink-mor": "lakesink upsert, MOR",
    "hudi-upsert": "Hudi 1.2.0 sink upsert",
    "delta-merge": "Spark + Delta MERGE",
}
SPACES = ("large", "hot")
VALUE_DDL = (
    "id BIGINT, seq BIGINT, name STRING, city STRING, amount DOUBLE, status STRING, note STRING"
)
COLUMNS = ("id", "seq", "name", "city", "amount", "status", "note")
_CITIES = ("Lisbon", "Porto", "Braga", "Coimbra", "Faro", "Evora", "Aveiro", "Leiria")
_STATUSES = ("active", "suspended", "closed", "pending")
_NOTE = "abcdefghijklmnopqrstuvwxyz0123456789" * 4


def payload(key: int, seq: int) -> dict[str, Any]:
    """The record of version `seq` of `key`: every field but id a function of (key, seq), so the
    expected row of a key is rebuilt from its winning seq alone."""
    h = (key * 2654435761 + seq * 40503) & 0xFFFFFFFF
    return {
        "id": key,
        "seq": seq,
        "name": f"customer-{key:09d}",
        "city": _CITIES[h % len(_CITIES)],
        "amount": (h % 10_000_000) / 100,
        "status": _STATUSES[(h >> 8) % len(_STATUSES)],
        "note": _NOTE[h % 36 : h % 36 + 100],
    }


def versions(space: str, args: argparse.Namespace) -> Iterator[int]:
    """The key of each record in seq order (seq = position in this sequence)."""
    rng = random.Random(29)
    if space == "large":
        created = 0
        while created < args.keys:
            if created and rng.random() < args.update_ratio:
                yield rng.randrange(created)
            else:
                yield created
                created += 1
    else:
        yield from range(args.hot_keys)
        for _ in range(args.hot_records - args.hot_keys):
            yield rng.randrange(args.hot_keys)


@dataclass(frozen=True)
class Topic:
    name: str
    ends: dict[int, int]  # partition -> records
    value_bytes: int
    latest: dict[int, int]  # the fold: key -> its highest seq
    records: int


def produce_space(
    bootstrap: str, space: str, args: argparse.Namespace
) -> tuple[Topic, int, dict[str, Any]]:
    """Produce the key space's stream (`produce`); its topic, lakesink's table.bucket.count for
    it and the report entry every upsert benchmark starts the space's figures from."""
    t0 = time.perf_counter()
    topic = produce(bootstrap, space, args)
    buckets = bucket_count(len(topic.latest), args)
    print(
        f"produced {topic.records:,} records over {len(topic.latest):,} keys "
        f"({topic.value_bytes / 1e6:.1f} MB) to {topic.name} in "
        f"{time.perf_counter() - t0:.1f}s; lakesink table.bucket.count {buckets}",
        flush=True,
    )
    entry: dict[str, Any] = {
        "records": topic.records,
        "keys": len(topic.latest),
        "value_bytes": topic.value_bytes,
        "per_batch": per_batch(topic, args),
        "buckets": buckets,
    }
    return topic, buckets, entry


def produce(bootstrap: str, space: str, args: argparse.Namespace) -> Topic:
    from lakesink.kafka.client import create_topic
    from lakesink.kafka.producer import encode_event, make_producer

    name = f"upsert-{space}"
    create_topic(bootstrap, name, args.partitions)
    producer = make_producer(bootstrap)
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    ends = dict.fromkeys(range(args.partitions), 0)
    latest: dict[int, int] = {}
    size = 0
    seq = 0
    for seq, key in enumerate(versions(space, args)):
        value = encode_event(payload(key, seq))
        part = key % args.partitions
        while True:
            try:
                producer.produce(name, value, str(key).encode(), part, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        ends[part] += 1
        latest[key] = seq
        size += len(value)
        if seq % 10_000 == 0:
            producer.poll(0)
    if producer.flush(600) or errors:
        raise RuntimeError(f"producing {name} failed: {errors[:1]}")
    return Topic(name, ends, size, latest, seq + 1)


def bucket_count(keys: int, args: argparse.Namespace) -> int:
    if args.buckets:
        return int(args.buckets)
    cores = int(args.cores)
    groups = -(-keys // 50_000)  # ~50,000 keys per file group (~1.7 MB of zstd Parquet here)
    return max(cores, -(-groups // cores) * cores)


def per_batch(topic: Topic, args: argparse.Namespace) -> int:
    # at least 4 batches: the first one (JVM and worker warm-up) is not steady state
    return max(1000, min(int(args.per_batch), -(-topic.records // 4)))


def lakesink_config(
    bootstrap: str,
    topic: Topic,
    path: Path,
    buckets: int,
    args: argparse.Namespace,
    merge_on_read: bool = False,
) -> dict[str, Any]:
    mor = {"table.type": "MERGE_ON_READ", "table.compaction.every.commits": 0}
    return {
        "kafka.bootstrap.servers": bootstrap,
        "kafka.topics": topic.name,
        "value.format": "json",
        "value.schema": VALUE_DDL.replace("id BIGINT", "id BIGINT NOT NULL"),
        "table.path": str(path),
        "kafka.max.records.per.batch": per_batch(topic, args),
        "writer.id": f"upsert-{path.parent.name}",
        "lock.provider": "filesystem",
        "spark.master": f"local[{args.cores}]",
        "write.operation": "upsert",
        "table.record.key.fields": "id",
        "table.ordering.field": "seq",
        "table.bucket.count": buckets,
        **(mor if merge_on_read else {}),
    }


def variant_cmd(
    variant: str, bootstrap: str, topic: Topic, out: Path, buckets: int, args: argparse.Namespace
) -> list[str]:
    if variant in LAKESINK:
        cfg = lakesink_config(
            bootstrap, topic, out / "table", buckets, args, variant == "lakesink-mor"
        )
        return _child_cmd("spark", "lakesink", json.dumps(cfg), str(topic.records))
    from peers import peer_cmd

    pcfg = {
        "bootstrap": bootstrap,
        "topic": topic.name,
        "ends": {str(p): n for p, n in topic.ends.items()},
        "per_batch": per_batch(topic, args),
        "master": f"local[{args.cores}]",
        "value_ddl": VALUE_DDL,
        "path": str(out / "table"),
        "checkpoint": str(out / "checkpoint"),
        "record_key": "id",
        "ordering": "seq",
    }
    return peer_cmd(variant, pcfg)


class FolderBytes:
    """Bytes written into a folder: every file seen in it, at the largest size seen, sampled
    every `interval_s` (a file a cleaner deletes between two samples would be missed)."""

    def __init__(self, root: Path, interval_s: float = 1.0) -> None:
        self.root = root
        self.interval_s = interval_s
        self.sizes: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FolderBytes:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def sample(self) -> None:
        for dirpath, _, files in os.walk(self.root):
            for f in files:
                p = os.path.join(dirpath, f)
                try:
                    size = os.stat(p).st_size
                except OSError:
                    continue
                if size > self.sizes.get(p, -1):
                    self.sizes[p] = size

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    @property
    def total(self) -> int:
        return sum(self.sizes.values())


def read_rows(variant: str, table: Path) -> Any:
    """The table's COLUMNS as one pyarrow Table (hudi-rs for Hudi tables, delta-rs for Delta)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if variant == "delta-merge":
        from peers import PeerEnv

        env = PeerEnv.for_mode("delta")
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "rows.parquet"
            script = str(HERE / "peer_job.py")
            subprocess.run(
                [env.python, script, "export", "delta", str(table), ",".join(COLUMNS), str(out)],
                check=True,
                capture_output=True,
            )
            return pq.read_table(out)
    import hudi

    batches = hudi.HudiTableBuilder.from_base_uri(str(table)).build().read()
    if not batches:
        return pa.table({c: pa.array([], pa.int64()) for c in COLUMNS})
    return pa.Table.from_batches(batches).select(list(COLUMNS))


def fold_check(variant: str, table: Path, topic: Topic) -> dict[str, Any]:
    """The table against the fold of the produced records by key (the highest seq wins)."""
    rows = read_rows(variant, table)
    got: dict[int, tuple[Any, ...]] = {}
    for row in rows.to_pylist():
        got[row["id"]] = tuple(row[c] for c in COLUMNS)
    wrong = 0
    for key, seq in topic.latest.items():
        want = payload(key, seq)
        if got.get(key) != tuple(want[c] for c in COLUMNS):
            wrong += 1
    extra = len(set(got) - set(topic.latest))
    return {
        "rows": rows.num_rows,
        "keys_expected": len(topic.latest),
        "wrong_keys": wrong + extra,
        "repeated_keys": rows.num_rows - len(got),
    }


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50 (the median) and p95 (nearest rank: with fewer than 20 values, the largest)."""
    if not values:
        return {"p50": None, "p95": None}
    s = sorted(values)
    return {
        "p50": round(statistics.median(s), 3),
        "p95": round(s[max(0, math.ceil(0.95 * len(s)) - 1)], 3),
    }


def commit_bytes(table: Path) -> dict[str, Any]:
    """The bytes the table's completed commits added, from their write stats (base files, log
    files): the ingestion's commits and deltacommits apart from compaction commits."""
    from lakesink.formats.hudi.table.hudi_table import HudiTable
    from lakesink.formats.hudi.table.metadata import COMPACT_OPERATION

    timeline = HudiTable.open(table).timeline()
    out: dict[str, Any] = {"commits": 0, "deltacommits": 0, "compactions": 0}
    out.update(data_bytes=0, data_files=0, compaction_bytes=0, compaction_files=0)
    for instant in timeline.completed():
        if not instant.action.writes_data:
            continue
        meta = timeline.commit_metadata(instant)
        files = sum(1 for w in meta.writes if w.file_size_bytes)
        size = sum(w.file_size_bytes for w in meta.writes)
        if meta.operation_type == COMPACT_OPERATION:
            out["compactions"] += 1
            out["compaction_bytes"] += size
            out["compaction_files"] += files
            continue
        out["deltacommits" if instant.action.value == "deltacommit" else "commits"] += 1
        out["data_bytes"] += size
        out["data_files"] += files
    return out


def read_times(table: Path, repeats: int = 5) -> dict[str, Any]:
    """One full read of the table, `repeats` times each, with hudi-rs and lakesink's reader
    (TableReader.snapshot): the median, the fastest (the least disturbed by other load) and
    every time, in seconds."""
    from lakesink.formats.hudi.table.hudi_table import HudiTable
    from lakesink.formats.hudi.table.reader import TableReader

    def lakesink_read() -> None:
        TableReader(HudiTable.open(table)).snapshot()

    out: dict[str, Any] = {}
    for name, read in (
        ("hudi_rs", lambda: read_rows("lakesink", table)),
        ("lakesink", lakesink_read),
    ):
        took = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            read()
            took.append(round(time.perf_counter() - t0, 3))
        out[f"{name}_s"] = statistics.median(took)
        out[f"{name}_min_s"] = min(took)
        out[f"{name}_all_s"] = took
    return out


def read_and_compact(table: Path, merge_on_read: bool) -> dict[str, Any]:
    """The table's full reads (hudi-rs and lakesink's reader) and its commits' bytes; a
    merge-on-read table is then compacted (`lakesink table compact`, in this process) and read
    again."""
    reads = read_times(table)
    out: dict[str, Any] = {"read_s": reads["hudi_rs_s"], "reads": reads}
    out["commit_bytes"] = commit_bytes(table)
    if not merge_on_read:
        return out
    from lakesink.cli.main import main as cli

    written = FolderBytes(table)
    written.sample()
    before = set(written.sizes)
    with written:
        t0 = time.perf_counter()
        rc = cli(["table", "compact", str(table), "--lock-provider", "filesystem"])
        out["compaction_s"] = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"lakesink table compact {table} exited {rc}")
    out["compaction_bytes"] = sum(n for p, n in written.sizes.items() if p not in before)
    out["commit_bytes_after_compaction"] = commit_bytes(table)
    after = read_times(table)
    out["read_after_compaction_s"] = after["hudi_rs_s"]
    out["reads_after_compaction"] = after
    return out


def lakesink_verify(
    bootstrap: str, topic: Topic, table: Path, buckets: int, args: Any, variant: str = "lakesink"
) -> Any:
    """`lakesink verify`'s audit of the table: the fold audit of its committed records."""
    from lakesink.cli.verify import audit_config
    from lakesink.config import build_config

    mor = variant == "lakesink-mor"
    cfg = build_config(lakesink_config(bootstrap, topic, table, buckets, args, mor))
    report = audit_config(cfg)
    return {
        "ok": report.ok,
        "keys": getattr(report, "keys", None),
        "wrong_keys": getattr(report, "wrong_keys", None),
        "problems": report.problems[:5],
    }


def throughput(
    bootstrap: str, topic: Topic, buckets: int, work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for variant in args.variants.split(","):
        out = work / f"{topic.name}-{variant}"
        cmd = variant_cmd(variant, bootstrap, topic, out, buckets, args)
        t0 = time.perf_counter()
        try:
            with FolderBytes(out / "table") as written:
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
        r["bytes_written"] = written.total
        r["files_written"] = len(written.sizes)
        r["write_amplification"] = written.total / topic.value_bytes
        r["mean_batch_s"] = sum(r["batch_s"]) / len(r["batch_s"]) if r["batch_s"] else None
        r["cpu_s_per_1000_rec"] = r["cpu_us_per_rec"] / 1000
        # the driver's time per batch after the first (read, write, commit: finish to finish)
        # and the publish alone (the table lock held), over the batches that held records
        r["batch_s_pcts"] = percentiles(r["batch_s"])
        published = [
            s for (_, n), s in zip(res["batches"], res.get("publish_s", []), strict=False) if n
        ]
        r["publish_s"] = published
        r["publish_s_pcts"] = percentiles(published)
        if "spark" in res:
            r["spark"] = res["spark"]
        r["fold_check"] = fold_check(variant, out / "table", topic)
        if variant in LAKESINK:
            r.update(read_and_compact(out / "table", variant == "lakesink-mor"))
        if r["records"] < topic.records:
            r["error"] = f"read {r['records']} of {topic.records} records"
        rows[variant] = r
        print(
            f"{topic.name} {variant}: {r['rec_s']:,.0f} rec/s, steady "
            f"{r['steady_rec_s'] or 0:,.0f}, {r['cpu_us_per_rec']:.1f} us/rec, "
            f"WA {r['write_amplification']:.3f}, fold check {r['fold_check']} "
            f"({time.perf_counter() - t0:.0f}s)",
            flush=True,
        )
    return rows


def correctness(
    bootstrap: str, topic: Topic, buckets: int, work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    from peers import kill_and_audit

    out: dict[str, Any] = {}
    for variant in args.variants.split(","):
        base = work / f"kill-{topic.name}-{variant}"
        cmd = variant_cmd(variant, bootstrap, topic, base, buckets, args)

        def audit(v: str = variant, b: Path = base) -> dict[str, Any]:
            res = fold_check(v, b / "table", topic)
            if v in LAKESINK:
                res["lakesink_verify"] = lakesink_verify(
                    bootstrap, topic, b / "table", buckets, args, v
                )
            return res

        t0 = time.perf_counter()
        try:
            out[variant] = kill_and_audit(cmd, base / "logs", audit)
        except Exception as e:  # one failed writer leaves the others' audits
            print(f"correctness run of {variant} failed: {e}", flush=True)
            out[variant] = {"failed": str(e)[-2000:]}
            continue
        print(
            f"{topic.name} {variant}: SIGKILL after {out[variant]['killed_after_batches']} "
            f"batches, restart {out[variant]['restart_s']}s, {_fmt_audit(out[variant])} "
            f"({time.perf_counter() - t0:.0f}s)",
            flush=True,
        )
    return out


def _fmt_audit(a: dict[str, Any] | None) -> str:
    if not a:
        return ""
    if "failed" in a:
        return "run failed"
    txt = f"{a['wrong_keys']:,} wrong / {a['repeated_keys']:,} repeated keys"
    if v := a.get("lakesink_verify"):
        txt += f"; verify {'PASS' if v['ok'] else 'FAIL'} ({v['wrong_keys']} wrong)"
    if a.get("failed_restarts"):
        txt += f" ({len(a['failed_restarts'])} failed restart(s))"
    return txt


def print_results(report: dict[str, Any]) -> None:
    print(
        f"\n{'keys':<6} {'variant':<24} {'records':>9} {'rec/s':>8} {'steady':>8} "
        f"{'cpu us/rec':>10} {'RSS MB':>7} {'write amp':>9} {'batch s':>7} "
        f"{'ls÷it steady':>12} {'it÷ls cpu':>9}  after SIGKILL + restart: fold audit"
    )
    for space, res in report["spaces"].items():
        runs = res.get("runs", {})
        ls = runs.get("lakesink", {})
        reads: list[str] = []
        for name, r in runs.items():
            label = LABELS.get(name, name)
            audit = _fmt_audit(res.get("correctness", {}).get(name))
            if "failed" in r:
                print(f"{space:<6} {label:<24} failed: {r['failed'].splitlines()[0][:100]}")
                continue
            vs = _ratio(ls.get("steady_rec_s"), r["steady_rec_s"]) if name != "lakesink" else ""
            cpu = (
                _ratio(r["cpu_us_per_rec"], ls.get("cpu_us_per_rec")) if name != "lakesink" else ""
            )
            print(
                f"{space:<6} {label:<24} {r['records']:>9,} {r['rec_s']:>8,.0f} "
                f"{r['steady_rec_s'] or 0:>8,.0f} {r['cpu_us_per_rec']:>10.1f} "
                f"{r['memory']['peak_total_rss_mb']:>7,.0f} {r['write_amplification']:>9.3f} "
                f"{r['mean_batch_s'] or 0:>7.1f} {vs or '':>12} {cpu or '':>9}  {audit}"
            )
            if "read_s" in r:
                txt = f"{label}: hudi-rs reads it in {r['read_s']:.2f} s"
                if "compaction_s" in r:
                    txt += (
                        f"; lakesink table compact {r['compaction_s']:.1f} s, "
                        f"{r['compaction_bytes'] / 1e6:.1f} MB written; then read in "
                        f"{r['read_after_compaction_s']:.2f} s"
                    )
                reads.append(txt)
        for txt in reads:
            print(f"       {space}: {txt}")
        if not runs:
            for name, a in res.get("correctness", {}).items():
                print(f"{space:<6} {LABELS.get(name, name):<24} {_fmt_audit(a)}")
        print(
            f"       {space}: {res['records']:,} records over {res['keys']:,} keys, "
            f"{res['value_bytes'] / max(1, res['records']):.0f} B each, "
            f"{res['per_batch']:,} per batch, lakesink table.bucket.count {res['buckets']}"
        )


def print_table_types(report: dict[str, Any]) -> None:
    """Copy-on-write against merge-on-read (`lakesink` and `lakesink-mor`), per key space:
    bytes the commits added (compaction apart) ÷ the Kafka values' bytes, the driver's batch and
    publish times, rec/s, CPU, the reads before and after compaction, the kill column."""
    rows = [
        (space, name, r, res)
        for space, res in report["spaces"].items()
        for name, r in res.get("runs", {}).items()
        if name in LAKESINK and "failed" not in r and "commit_bytes" in r
    ]
    if not rows:
        return
    print("\ncopy-on-write against merge-on-read (bytes: the commits' write stats)")
    print(
        f"{'keys':<6} {'table':<7} {'records':>9} {'instants':>8} {'MB in':>6} {'MB written':>10} "
        f"{'compaction MB':>13} {'WA':>6} {'WA+comp':>7} {'WA dir':>6} "
        f"{'batch s p50/p95':>15} {'publish s p50/p95':>17} {'rec/s':>7} {'CPU s/1k':>8} "
        f"{'read hudi-rs/lakesink s':>23} {'compact s':>9} {'read after s':>12}  "
        "after SIGKILL + restart"
    )
    for space, name, r, res in rows:
        cb = r.get("commit_bytes_after_compaction", r["commit_bytes"])
        value_bytes = res["value_bytes"]
        reads = r.get("reads", {})
        after = r.get("reads_after_compaction", {})
        bp, pp = r.get("batch_s_pcts", {}), r.get("publish_s_pcts", {})
        print(
            f"{space:<6} {'MOR' if name == 'lakesink-mor' else 'COW':<7} {r['records']:>9,} "
            f"{_instants(r['commit_bytes']):>8} "
            f"{value_bytes / 1e6:>6.1f} {cb['data_bytes'] / 1e6:>10.2f} "
            f"{cb['compaction_bytes'] / 1e6:>13.2f} {cb['data_bytes'] / value_bytes:>6.3f} "
            f"{(cb['data_bytes'] + cb['compaction_bytes']) / value_bytes:>7.3f} "
            f"{r['write_amplification']:>6.3f} "
            f"{_pair(bp.get('p50'), bp.get('p95')):>15} "
            f"{_pair(pp.get('p50'), pp.get('p95')):>17} {r['rec_s']:>7,.0f} "
            f"{r['cpu_s_per_1000_rec']:>8.3f} "
            f"{_pair(reads.get('hudi_rs_s'), reads.get('lakesink_s')):>23} "
            f"{_secs(r.get('compaction_s')):>9} "
            f"{_pair(after.get('hudi_rs_s'), after.get('lakesink_s')):>12}  "
            f"{_fmt_audit(res.get('correctness', {}).get(name))}"
        )


def _instants(cb: dict[str, Any]) -> str:
    """The ingestion's completed instants: `4 c` (commits) or `4 dc` (deltacommits)."""
    return f"{cb['deltacommits']} dc" if cb["deltacommits"] else f"{cb['commits']} c"


def _secs(s: float | None) -> str:
    return "-" if s is None else f"{s:.1f}"


def _pair(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a:.2f}/{b:.2f}"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--keys", type=int, default=200_000, help="keys of the large key space")
    ap.add_argument("--update-ratio", type=float, default=0.1, help="updates in the large space")
    ap.add_argument("--hot-keys", type=int, default=10_000, help="keys of the hot key space")
    ap.add_argument("--hot-records", type=int, default=200_000, help="records of the hot space")
    ap.add_argument("--spaces", default=",".join(SPACES), help="key spaces to run")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="variants to run")
    ap.add_argument("--per-batch", type=int, default=500_000, help="most records per batch")
    ap.add_argument("--cores", type=int, default=2, help="Spark local[N]")
    ap.add_argument("--partitions", type=int, default=8, help="Kafka partitions of each topic")
    ap.add_argument("--buckets", type=int, default=0, help="table.bucket.count (0: by keys)")
    ap.add_argument("--skip", default="", help="comma-separated: throughput,correctness")
    ap.add_argument("--broker", choices=("kafka", "noida"), default="kafka")
    ap.add_argument("--out", default=None, help="JSON (default results/upsert-<time>.json)")
    ap.add_argument("--print", dest="print_json", help="print the table of a results JSON")
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.print_json:
        saved = json.loads(Path(args.print_json).read_text())
        print_results(saved)
        return print_table_types(saved)
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variant(s) {sorted(unknown)}: choose from {VARIANTS}")
    skip = set(filter(None, args.skip.split(",")))
    subprocess.run([sys.executable, "-m", "lakesink.spark.prepare"], check=True)
    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "argv": sys.argv[1:],
        "cores": args.cores,
        "load_avg_at_start": os.getloadavg(),
        "spaces": {},
    }
    out = (
        Path(args.out)
        if args.out
        else HERE / "results" / f"upsert-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    if set(args.variants.split(",")) - set(LAKESINK):
        from peers import ensure_envs

        report["peers"] = ensure_envs()
    work = Path(tempfile.mkdtemp(prefix="lakesink-upsert-"))
    try:
        from lakesink.kafka.kafka_server import local_broker

        broker = local_broker(args.broker, data_dir=work / "broker")
        broker.start()
        try:
            bs = broker.bootstrap_servers
            for space in args.spaces.split(","):
                topic, buckets, entry = produce_space(bs, space, args)
                if "throughput" not in skip:
                    entry["runs"] = throughput(bs, topic, buckets, work, args)
                    ls = entry["runs"].get("lakesink", {})
                    entry["ratios"] = {
                        f"lakesink/{v}": {
                            "steady rec/s": _ratio(ls.get("steady_rec_s"), r.get("steady_rec_s")),
                            "end-to-end rec/s": _ratio(ls.get("rec_s"), r.get("rec_s")),
                            "its cpu/rec ÷ lakesink's": _ratio(
                                r.get("cpu_us_per_rec"), ls.get("cpu_us_per_rec")
                            ),
                            "its write amplification ÷ lakesink's": _ratio(
                                r.get("write_amplification"), ls.get("write_amplification")
                            ),
                        }
                        for v, r in entry["runs"].items()
                        if v != "lakesink" and "failed" not in r
                    }
                if "correctness" not in skip:
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
    print_table_types(report)
    print(
        f"\nload average at start {report['load_avg_at_start']}, at end {report['load_avg_at_end']}"
    )
    print(f"results: {out}")


if __name__ == "__main__":
    main()
