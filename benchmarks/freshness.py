"""Freshness (issue 33, item 1, lakesink's half): how long after Kafka appends a record a reader
of the table sees it.

A producer appends records at a fixed rate (`--rate` records/s over `--partitions` partitions)
for `--seconds`, to a topic whose timestamps are the broker's append time (`LogAppendTime`).
`lakesink ingest` runs continuously in its own process (Spark local[2], Apache Kafka) into a
local table of each format in `--formats`, once per trigger in `--triggers`. An independent
reader polls the table every `--poll` seconds (hudi-rs for Hudi; pyiceberg's scan for Iceberg,
the SQL catalog on SQLite); a record is visible from the first poll that reads it, and its
freshness is that poll's time minus its Kafka append time. p50/p95/p99/max over every record
produced after the ingestion was up (a warm-up batch proves it is), per trigger. The poll
interval bounds what the reader adds (about half of it on average).

    python benchmarks/freshness.py [--rate 2000] [--seconds 60] [--triggers 5,1,0.2,0]
        [--formats hudi,iceberg] [--poll 0.1] [--json benchmarks/results/freshness.json]

The peers run in the same way (`--peers`, each at the triggers in `--peer-triggers`), in the
peers' Pythons (`freshness_peer.py`, scripts/setup-peers.sh): Spark Structured Streaming with
Spark's Kafka source into Delta Lake (read by delta-rs in the peers' Python), Hudi 1.2.0's
streaming sink (read by hudi-rs) and Iceberg 1.11 with a Hadoop catalog (read by pyiceberg from
the newest metadata file).

    python benchmarks/freshness.py --peers delta,hudi,iceberg --peer-triggers 1,0

`--rate half-max` first measures what lakesink ingests from a backlog (`ingest --once` of
400,000 records in batches of 50,000, from the end of its first batch to the end of its
last; the lowest over `--formats`) and produces at half of it. `--store s3` puts lakesink's
tables in a bucket of a local S3 server (moto over HTTP, the tests' `s3_server.py`; the Iceberg
catalog stays in SQLite on local disk); the peers run on local disk only.

The profile of each lakesink run (printed, and in the JSON): every record's freshness split by
the steps of the batch that carried it (freshness_breakdown.py: waiting in Kafka for the batch
to be planned, Spark until the batch reached lakesink's sink, begin, write, commit, the reader),
from the progress lines (each batch's steps and publish time) and Spark's offset log; CPU
seconds per process over the production window (lakesink's driver, JVM, JIT, Python workers
and source, the broker, the producer, this process: the reader). The reader reads only what
the commits since its last poll added (`--full-reads`: the whole table, as before); the
producer runs in a process of its own. `--per-batch` and `--ingest KEY=VALUE,...` set lakesink
keys for the measured runs (not for the max-rate measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

WARM_UP_RECORDS = 100
MAX_RATE_RECORDS = 400_000  # max_rate's backlog
MAX_RATE_BATCH = 50_000  # its records per batch: eight batches to time
PROGRESS = re.compile(r"total ([\d,]+)\s+([\d,]+) rec/s")
HERE = Path(__file__).resolve().parent
PAYLOAD = b"x" * 200


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": ordered[-1]}


COLUMNS = ["kafka_partition", "kafka_offset", "kafka_timestamp"]


def hudi_rs_rows(table: str, storage_options: dict[str, str] | None = None) -> pa.Table | None:
    """The table's coordinates and append times as hudi-rs reads them; None before it exists
    (`table`: a local path or an object store URI, with the store's reader options)."""
    from lakesink.formats.hudi.audit import hudi_rs_batches

    if "://" not in table and not (Path(table) / ".hoodie" / "hoodie.properties").exists():
        return None
    batches = hudi_rs_batches(table, storage_options, columns=COLUMNS)
    return pa.Table.from_batches(batches) if batches else None


def pyiceberg_rows(settings: Any) -> pa.Table | None:
    """The same through pyiceberg's scan of the table's current snapshot (the catalog asked
    again each time); None before the table exists."""
    from lakesink.errors import LakesinkError
    from lakesink.formats.iceberg.format import open_iceberg_table

    try:
        table = open_iceberg_table(settings, create=False).pyiceberg
    except LakesinkError:  # not created yet
        return None
    return table.scan(selected_fields=tuple(COLUMNS)).to_arrow()


class HudiIncremental:
    """hudi-rs reading only what commits completed since its last poll added, so that a poll's
    cost follows the new data, not the table's size: the first poll reads the snapshot, the
    next ones incremental queries over (the newest completion time read, the newest now].
    hudi-rs ranges incremental queries of a layout-2 table by completion time, which its
    timeline does not hand out: the reader lists `.hoodie/timeline` for them (on an object
    store through lakesink's storage: one LIST a poll)."""

    def __init__(
        self,
        table: str,
        storage_options: dict[str, str] | None = None,
        storage: Any = None,
    ) -> None:
        self.table, self.storage_options = table, storage_options
        self.storage = storage  # lakesink's Storage of a table on an object store
        self.last: str | None = None

    def _timeline_names(self) -> list[str]:
        if self.storage is not None:
            return list(self.storage.list_names(".hoodie/timeline"))
        folder = Path(self.table) / ".hoodie" / "timeline"
        return os.listdir(folder) if folder.is_dir() else []

    def _completed(self) -> list[tuple[str, str]]:
        """The table's completed instants as (completion time, action), oldest first, from the
        `<instant>_<completion>.<action>` names in `.hoodie/timeline`."""
        done = []
        for name in self._timeline_names():
            stem, _, action = name.partition(".")
            if "_" in stem and "." not in action:  # not .requested / .inflight
                done.append((stem.split("_", 1)[1], action))
        return sorted(done)

    def _ranges(self, completed: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The (after, through] completion ranges to read since the last poll: the runs of
        commits between clusterings. A clustering (a replace commit) rewrites rows already read;
        reading its files again would make this reader's poll, not the table, the tail (as a
        streaming reader skips clustering: Flink's `read.streaming.skip_clustering`)."""
        ranges, start, end = [], self.last or "", None
        for completion, action in completed:
            if completion <= (self.last or ""):
                continue
            if action in REWRITE_ACTIONS:
                if end is not None:
                    ranges.append((start, end))
                start, end = completion, None
            else:
                end = completion
        if end is not None:
            ranges.append((start, end))
        return ranges

    def __call__(self) -> pa.Table | None:
        import hudi

        completed = self._completed()
        newest = completed[-1][0] if completed else None
        if newest is None or newest == self.last:
            return None
        builder = hudi.HudiTableBuilder.from_base_uri(self.table)
        if self.storage_options:
            builder = builder.with_storage_options(dict(self.storage_options))
        table = builder.build()
        options = hudi.HudiReadOptions(projection=COLUMNS)
        if self.last is None:
            latest = table.get_timeline().get_latest_commit_timestamp()
            if not latest:
                return None
            batches = table.read(options.with_as_of_timestamp(latest))
        else:
            incremental = options.with_query_type(hudi.HudiQueryType.Incremental)
            batches = []
            for after, through in self._ranges(completed):
                batches += table.read(
                    incremental.with_start_timestamp(after).with_end_timestamp(through)
                )
        self.last = newest
        return pa.Table.from_batches(batches) if batches else None


REWRITE_ACTIONS = ("replacecommit", "clustercommit")
"""Timeline actions that rewrite rows already in the table (Hudi's clustering)."""


class IcebergIncremental:
    """pyiceberg reading only the data files that snapshots committed since its last poll
    added (from their manifests; a `replace` snapshot, the inline compaction, rewrites rows
    already read and is passed over), each Parquet file read through the table's FileIO."""

    def __init__(self, load: Callable[[], Any]) -> None:
        self.load = load  # the pyiceberg Table now, None before it exists
        self.last: int | None = None
        # a local table's metadata folder and its mtime when last loaded: every commit adds a
        # metadata file there, so an unchanged folder spares loading the table from the catalog
        self.metadata_dir: Path | None = None
        self.metadata_mtime = 0

    def __call__(self) -> pa.Table | None:
        import pyarrow.parquet as pq
        from pyiceberg.manifest import ManifestEntryStatus

        mtime = 0
        if self.metadata_dir is not None:
            mtime = self.metadata_dir.stat().st_mtime_ns
            if mtime == self.metadata_mtime:
                return None
        table = self.load()
        if table is not None and self.metadata_dir is None:
            location = table.location().removeprefix("file://")
            if "://" not in location and (Path(location) / "metadata").is_dir():
                self.metadata_dir = Path(location) / "metadata"
                mtime = self.metadata_dir.stat().st_mtime_ns
        current = None if table is None else table.current_snapshot()
        if current is None or current.snapshot_id == self.last:
            return None
        new = []
        snap = current
        while snap is not None and snap.snapshot_id != self.last:
            new.append(snap)
            parent = snap.parent_snapshot_id
            snap = table.snapshot_by_id(parent) if parent is not None else None
        pieces = []
        for snap in reversed(new):
            if snap.summary is not None and snap.summary.operation.value == "replace":
                continue
            for manifest in snap.manifests(table.io):
                if manifest.added_snapshot_id != snap.snapshot_id:
                    continue
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                    if entry.status != ManifestEntryStatus.ADDED:
                        continue
                    with table.io.new_input(entry.data_file.file_path).open() as f:
                        pieces.append(pq.read_table(f, columns=COLUMNS))
        self.last = current.snapshot_id
        self.metadata_mtime = mtime
        return pa.concat_tables(pieces) if pieces else None


def lakesink_iceberg_table(settings: Any) -> Any:
    """lakesink's Iceberg table through pyiceberg (the catalog asked again), None before it
    exists."""
    from lakesink.errors import LakesinkError
    from lakesink.formats.iceberg.format import open_iceberg_table

    try:
        return open_iceberg_table(settings, create=False).pyiceberg
    except LakesinkError:  # not created yet
        return None


def hadoop_iceberg_rows(warehouse: Path) -> pa.Table | None:
    """The Spark + Iceberg peer's table (a Hadoop catalog): the newest metadata file is the
    table; None before it exists."""
    from pyiceberg.table import StaticTable

    meta = warehouse / "bench" / "fresh" / "metadata"
    hint = meta / "version-hint.text"
    if not hint.exists():
        return None
    table = StaticTable.from_metadata(str(meta / f"v{hint.read_text().strip()}.metadata.json"))
    return table.scan(selected_fields=tuple(COLUMNS)).to_arrow()


class Seen:
    """When each (partition, offset) was first read and its append time, in arrays indexed by
    offset (a dict of tens of millions of records would not fit)."""

    def __init__(self) -> None:
        self.appended: dict[int, np.ndarray] = {}  # epoch µs, -1: not seen
        self.visible: dict[int, np.ndarray] = {}  # epoch s, NaN: not seen
        self.count = 0

    def note(
        self, partitions: np.ndarray, offsets: np.ndarray, appended_us: np.ndarray, at: float
    ) -> None:
        for p in np.unique(partitions):
            mask = partitions == p
            o, a = offsets[mask], appended_us[mask]
            vis = self.visible.get(int(p))
            need = int(o.max()) + 1
            if vis is None or len(vis) < need:
                size = max(need, 2 * (0 if vis is None else len(vis)))
                grown = np.full(size, np.nan)
                app = np.full(size, -1, dtype=np.int64)
                if vis is not None:
                    grown[: len(vis)] = vis
                    app[: len(vis)] = self.appended[int(p)]
                self.visible[int(p)], self.appended[int(p)] = grown, app
                vis = grown
            new = np.isnan(vis[o])
            if not new.any():
                continue
            # a row read twice in one poll is the same record, with the same append time
            self.count += len(np.unique(o[new]))
            vis[o[new]] = at
            self.appended[int(p)][o[new]] = a[new]

    def records(self, since: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(partitions, offsets, appended s, visible s) of the records seen that were appended
        at or after `since`."""
        ps, os_, aps, vs = [], [], [], []
        for p, vis in self.visible.items():
            app = self.appended[p]
            keep = (~np.isnan(vis)) & (app >= since * 1e6)
            o = np.flatnonzero(keep)
            ps.append(np.full(len(o), p, dtype=np.int64))
            os_.append(o)
            aps.append(app[o] / 1e6)
            vs.append(vis[o])
        if not ps:
            empty = np.array([], dtype=np.float64)
            return empty.astype(np.int64), empty.astype(np.int64), empty, empty
        return np.concatenate(ps), np.concatenate(os_), np.concatenate(aps), np.concatenate(vs)


class Reader(threading.Thread):
    """Polls the table with `read`; notes when each (partition, offset) is first read."""

    def __init__(self, read: Callable[[], pa.Table | None], poll_s: float) -> None:
        super().__init__(daemon=True)
        self.read, self.poll_s = read, poll_s
        self.seen = Seen()
        self.polls = 0
        self.read_s = 0.0
        self.max_read_s = 0.0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            start = time.time()
            try:
                rows = self.read()
            except Exception:  # a table mid-creation: the next poll reads it
                rows = None
            now = time.time()
            self.polls += 1
            self.read_s += now - start
            self.max_read_s = max(self.max_read_s, now - start)
            if rows is not None and rows.num_rows:
                self._note(rows, now)
            self.stopping.wait(max(0.0, self.poll_s - (time.time() - start)))

    def _note(self, rows: pa.Table, visible: float) -> None:
        appended = pc.cast(
            pc.cast(rows["kafka_timestamp"], pa.timestamp("us", tz="UTC")), pa.int64()
        )
        self.seen.note(
            rows["kafka_partition"].to_numpy().astype(np.int64),
            rows["kafka_offset"].to_numpy().astype(np.int64),
            appended.to_numpy(),
            visible,
        )


class DeltaReader(threading.Thread):
    """`Reader`'s notes for the Delta peer, read by delta-rs in the peers' Python
    (`freshness_peer.py read-delta`), which prints each poll's new coordinates."""

    def __init__(self, path: Path, poll_s: float) -> None:
        super().__init__(daemon=True)
        from peers import PeerEnv

        self.seen = Seen()
        self.polls = 0
        self.read_s = 0.0
        self.max_read_s = 0.0
        self.stopping = threading.Event()
        python = PeerEnv.for_mode("delta").python
        self.process = subprocess.Popen(
            [python, str(HERE / "freshness_peer.py"), "read-delta", str(path), str(poll_s)],
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if not line.startswith("SEEN "):
                continue
            _, visible, rows = line.split(" ", 2)
            self.polls += 1
            got = np.array(json.loads(rows), dtype=np.int64).reshape(-1, 3)
            if len(got):
                self.seen.note(got[:, 0], got[:, 1], got[:, 2], float(visible))

    def join(self, timeout: float | None = None) -> None:
        self.process.terminate()
        self.process.wait(30)
        super().join(timeout)


def _produce(bootstrap: str, topic: str, count: int, rate: float) -> float:
    """`count` records at `rate` per second (inf: as fast as the client takes them), spread
    over the topic's partitions by the client (no key); returns when the last is acknowledged.
    Cheap on purpose, to leave the cores to what is measured: no clock read or key per
    record; every millisecond or so it hands the client the records that are due."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "batch.size": 262_144}
    )
    produce, poll = producer.produce, producer.poll
    start = time.time()
    sent = 0
    while sent < count:
        due = count if rate == float("inf") else min(count, int((time.time() - start) * rate) + 1)
        if due <= sent:
            time.sleep(0.001)
            continue
        for _ in range(due - sent):
            while True:
                try:
                    produce(topic, PAYLOAD)
                    break
                except BufferError:  # the client's queue is full: let it drain
                    poll(0.05)
        sent = due
        poll(0)
    producer.flush(60)
    return time.time()


def _produce_into(bootstrap: str, topic: str, count: int, rate: float, done: Any) -> None:
    done.put(_produce(bootstrap, topic, count, rate))


def produce_apart(
    bootstrap: str, topic: str, count: int, rate: float
) -> tuple[Any, Callable[[], float]]:
    """`_produce` in a process of its own (its CPU apart from the reader's, no GIL shared):
    the process, and a wait that returns when its last record was acknowledged."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    done = ctx.Queue()
    proc = ctx.Process(target=_produce_into, args=(bootstrap, topic, count, rate, done))
    proc.start()

    def wait() -> float:
        until = float(done.get())
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"the producer exited with {proc.exitcode}")
        return until

    return proc, wait


def _start_lakesink(
    bootstrap: str,
    name: str,
    fmt: str,
    trigger_s: float,
    tmp: Path,
    store: dict[str, Any],
    per_batch: int = 1_000_000,
    extra: dict[str, Any] | None = None,
    full_reads: bool = False,
) -> tuple[list[str], Callable[[], pa.Table | None]]:
    """The `lakesink ingest` command for the topic `name`, and how to read its table (what the
    commits since the last poll added; `full_reads`: the whole table at each poll). `store`:
    the storage keys and `root` of an S3 bucket, or empty for local disk; `extra`: more keys
    (`--ingest`)."""
    from lakesink.config.registry import build_config

    root = store.get("root")
    table = f"{root}/{name}" if root else str(tmp / name)
    keys = {
        "kafka.bootstrap.servers": bootstrap,
        "kafka.topics": name,
        "value.format": "raw",
        "table.path": table,
        "checkpoint.location": str(tmp / f"{name}-checkpoint"),
        "writer.id": name,
        "trigger.interval.s": trigger_s,
        "kafka.max.records.per.batch": per_batch,
        **{k: v for k, v in store.items() if k != "root"},
        **(extra or {}),
    }
    if fmt == "iceberg":
        keys |= {"table.format": "iceberg", "table.name": "events"}
        if root:  # the catalog stays on local disk; the warehouse is the bucket
            keys["iceberg.catalog.uri"] = f"sqlite:///{tmp / name}.db"
    if root:
        keys["lock.provider"] = "filesystem"
    conf = tmp / f"{name}.toml"
    conf.write_text("".join(f'"{k}" = {json.dumps(v)}\n' for k, v in keys.items()))
    settings = build_config(keys).settings
    command = [sys.executable, "-m", "lakesink.cli.main", "ingest", "--config", str(conf)]
    if fmt == "hudi":
        options = settings.table_storage().reader_options() if root else None
        if full_reads:
            return command, lambda: hudi_rs_rows(table, options)
        return command, HudiIncremental(table, options, settings.table_storage() if root else None)
    if full_reads:
        return command, lambda: pyiceberg_rows(settings)
    return command, IcebergIncremental(lambda: lakesink_iceberg_table(settings))


def max_rate(
    bootstrap: str, fmt: str, args: argparse.Namespace, tmp: Path, store: dict[str, Any]
) -> float:
    """The records per second lakesink ingests from a backlog of MAX_RATE_RECORDS (`ingest
    --once`, MAX_RATE_BATCH records a batch): from the first batch's end to the last's, read
    from the progress lines (`total N  R rec/s`: R is N over the seconds since the query
    started), so that Spark's start and the first batch's warm-up are left out."""
    from lakesink.kafka.client import create_topic

    name = f"max-{fmt}-{int(time.time())}"
    create_topic(bootstrap, name, args.partitions)
    _produce(bootstrap, name, MAX_RATE_RECORDS, float("inf"))
    command, _ = _start_lakesink(bootstrap, name, fmt, 5.0, tmp, store, MAX_RATE_BATCH)
    out = subprocess.run([*command, "--once"], check=True, capture_output=True, text=True).stdout
    progress = [
        (int(total.replace(",", "")), int(total.replace(",", "")) / float(rate.replace(",", "")))
        for total, rate in PROGRESS.findall(out)
        if float(rate.replace(",", "")) > 0
    ]
    if len(progress) < 3:
        raise RuntimeError(f"too few batches to time ({len(progress)}): {out[-2000:]}")
    (n1, t1), (n2, t2) = progress[0], progress[-1]
    return (n2 - n1) / (t2 - t1)


def _start_peer(
    bootstrap: str, name: str, mode: str, trigger_s: float, tmp: Path, cores: int
) -> tuple[list[str], Callable[[], pa.Table | None] | None]:
    """The peer's command (freshness_peer.py in its Python) and how to read its table (None:
    the Delta peer, read by a DeltaReader)."""
    from peers import PeerEnv

    env = PeerEnv.for_mode("hudi-insert" if mode == "hudi" else "delta")
    jars = list(env.jars)
    if mode == "iceberg":  # Iceberg's runtime beside Spark's Kafka source, without Delta's
        cache = Path(os.environ.get("LAKESINK_CACHE", HERE.parent / ".cache"))
        jars = [j for j in jars if "delta" not in Path(j).name and "unitycatalog" not in j]
        jars += sorted(str(p) for p in (cache / "iceberg-jars").glob("iceberg-spark-runtime-*"))
    path = tmp / name
    cfg = {
        "mode": mode,
        "bootstrap": bootstrap,
        "topic": name,
        "trigger_s": trigger_s,
        "master": f"local[{cores}]",
        "path": str(path),
        "checkpoint": str(tmp / f"{name}-checkpoint"),
        "jars": jars,
    }
    command = [env.python, str(HERE / "freshness_peer.py"), "run", json.dumps(cfg)]
    if mode == "hudi":
        return command, lambda: hudi_rs_rows(str(path / "table"))
    if mode == "iceberg":
        return command, lambda: hadoop_iceberg_rows(path)
    return command, None


def _cpu_window(
    monitors: dict[str, Any], own: tuple[float, float], t0: float, t1: float
) -> dict[str, float]:
    """CPU seconds per process role between t0 and t1: the writer's tree by procmon's roles
    (`driver`, `jvm`, `jit`, `source`, `pyworkers`), the broker, the producer, and this
    process (the reader, with the monitors' sampling threads)."""
    out: dict[str, float] = {}
    for name, mon in monitors.items():
        for role, secs in mon.cpu_by_role_between(t0, t1).items():
            key = name if name != "writer" else f"lakesink {role}"
            if name != "writer" and role != "driver":
                key = f"{name} {role}"
            out[key] = out.get(key, 0.0) + secs
    out["reader (this process)"] = own[1] - own[0]
    return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v > 0}


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


class OffsetLogKeeper(threading.Thread):
    """Keeps each batch's planned ranges from Spark's offset log while the writer runs: Spark
    deletes the logs of all but its last 100 batches (`minBatchesToRetain`)."""

    def __init__(self, checkpoint: Path) -> None:
        super().__init__(daemon=True)
        self.checkpoint = checkpoint
        self.ranges: dict[int, dict[int, tuple[int, int]]] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            self.collect()

    def collect(self) -> None:
        from lakesink.errors import LakesinkError
        from lakesink.spark.sink import planned_ranges

        try:
            names = os.listdir(self.checkpoint / "offsets")
        except OSError:
            return
        for name in names:
            if not name.isdigit() or int(name) in self.ranges:
                continue
            try:
                planned = planned_ranges(self.checkpoint, int(name))
            except (LakesinkError, ValueError):  # being written or already deleted
                continue
            self.ranges[int(name)] = {r.partition.partition: (r.start, r.end) for r in planned}


def _batches_of(
    log_path: Path, ranges: dict[int, dict[int, tuple[int, int]]], near: float
) -> list[Any]:
    """The writer's published batches (freshness_breakdown.Batch) from its progress lines and
    the ranges kept from Spark's offset log (a batch whose ranges were not kept is left out:
    its records count as unmatched)."""
    from freshness_breakdown import batch_from, parse_progress

    batches = []
    for line in log_path.read_text(errors="replace").splitlines():
        parsed = parse_progress(line, near)
        if parsed is None or parsed[0] not in ranges:
            continue
        batch_id, records, steps, published = parsed
        batches.append(batch_from(batch_id, records, steps, published, ranges[batch_id]))
    return batches


def one_trigger(
    bootstrap: str,
    system: str,
    trigger_s: float,
    args: argparse.Namespace,
    tmp: Path,
    store: dict[str, Any],
    rate: float,
    broker_pid: int | None = None,
) -> dict[str, Any]:
    """`system`: `lakesink-<format>` or `peer-<delta|hudi|iceberg>` (the peers on local disk
    only); `rate`: records per second."""
    from freshness_breakdown import format_summary, summarize
    from procmon import TreeMonitor

    from lakesink.kafka.client import create_topic

    name = f"fresh-{system}-{str(trigger_s).replace('.', '_')}-{int(time.time())}"
    create_topic(
        bootstrap, name, args.partitions, config={"message.timestamp.type": "LogAppendTime"}
    )
    kind, what = system.split("-", 1)
    if kind == "lakesink":
        command, read = _start_lakesink(
            bootstrap,
            name,
            what,
            trigger_s,
            tmp,
            store,
            args.per_batch,
            args.ingest_keys,
            args.full_reads,
        )
    else:
        command, read = _start_peer(bootstrap, name, what, trigger_s, tmp, args.cores)
    load_before = os.getloadavg()
    log = open(tmp / f"{name}.log", "w")  # noqa: SIM115 - the process writes it until stopped
    writer = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=HERE
    )
    reader: Reader | DeltaReader = (
        Reader(read, args.poll)
        if read is not None
        else DeltaReader(tmp / name / "table", args.poll)
    )
    reader.start()
    keeper = OffsetLogKeeper(tmp / f"{name}-checkpoint")
    keeper.start()
    monitors: dict[str, Any] = {}
    with ExitStack() as stack:
        monitors["writer"] = stack.enter_context(TreeMonitor(writer.pid, 0.5))
        if broker_pid is not None:
            monitors["broker"] = stack.enter_context(TreeMonitor(broker_pid, 0.5))
        try:
            _produce(bootstrap, name, WARM_UP_RECORDS, 1000.0)
            deadline = time.time() + 300
            while reader.seen.count < WARM_UP_RECORDS:
                if writer.poll() is not None or time.time() > deadline:
                    tail = Path(log.name).read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{system} never showed its warm-up; its log ends:\n{tail}")
                time.sleep(0.2)
            count = int(rate * args.seconds)
            polls_before, read_s_before = reader.polls, reader.read_s
            producer, wait = produce_apart(bootstrap, name, count, rate)
            monitors["producer"] = stack.enter_context(TreeMonitor(producer.pid, 0.5))
            measured_from = time.time()
            own = [_own_cpu(), 0.0]
            produced_until = wait()
            own[1] = _own_cpu()
            window_polls = reader.polls - polls_before
            window_read_s = reader.read_s - read_s_before
            deadline = time.time() + 120
            while reader.seen.count < WARM_UP_RECORDS + count and time.time() < deadline:
                time.sleep(0.2)
        finally:
            reader.stopping.set()
            reader.join()
            keeper.stopping.set()
            keeper.join()
            keeper.collect()
            os.killpg(writer.pid, signal.SIGTERM)
            try:
                writer.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(writer.pid, signal.SIGKILL)
                writer.wait()
            log.close()
    load_after = os.getloadavg()
    window = produced_until - measured_from
    cpu = _cpu_window(monitors, (own[0], own[1]), measured_from, produced_until)
    partitions, offsets, appended, visible = reader.seen.records(measured_from)
    fresh = list(visible - appended)
    result: dict[str, Any] = {
        "system": system,
        "trigger_s": trigger_s,
        "rate": rate,
        "store": "s3" if store else "local",
        "produced": count,
        "visible": len(fresh),
        "production_s": window,
        "polls": reader.polls,
        "mean_read_s": window_read_s / max(1, window_polls),
        "max_read_s": reader.max_read_s,
        "load_before": load_before,
        "load_after": load_after,
        "cpu_s": cpu,
        "cores_busy": round(sum(cpu.values()) / window, 2) if window > 0 else None,
        "ingest_keys": args.ingest_keys,
        **(_percentiles(fresh) if fresh else {}),
    }
    if kind == "lakesink":
        batches = _batches_of(Path(log.name), keeper.ranges, time.time())
        inside = [b for b in batches if b.published >= measured_from]
        result["breakdown"] = summarize(partitions, offsets, appended, visible, batches)
        result["breakdown"]["batches_in_window"] = len(inside)
        result["batch_steps"] = [  # every batch's steps, to look at one
            {
                "batch": b.batch_id,
                "records": b.records,
                "published": round(b.published, 3),
                **{k: round(v, 3) for k, v in b.step_seconds().items()},
                "publish": b.publish,
                "after": b.after,
            }
            for b in batches
        ]
        print(format_summary(result["breakdown"]))
    print(
        f"CPU s over the {window:.1f} s of production ({result['cores_busy']} cores busy; "
        f"load {load_before[0]:.1f} -> {load_after[0]:.1f}): "
        + ", ".join(f"{k} {v}" for k, v in cpu.items())
    )
    return result


def print_table(results: list[dict[str, Any]]) -> None:
    print(
        f"{'system':>16} {'trigger s':>9} {'records':>8} {'visible':>8} {'p50 s':>6} "
        f"{'p95 s':>6} {'p99 s':>6} {'max s':>6} {'read s':>6}"
    )
    for r in results:
        print(
            f"{r['system']:>16} {r['trigger_s']:>9} {r['produced']:>8,} {r['visible']:>8,} "
            f"{r.get('p50', float('nan')):>6.2f} {r.get('p95', float('nan')):>6.2f} "
            f"{r.get('p99', float('nan')):>6.2f} {r.get('max', float('nan')):>6.2f} "
            f"{r['mean_read_s']:>6.3f}"
        )


def _keys(text: str) -> dict[str, Any]:
    """`KEY=VALUE,...` as lakesink keys (a value that parses as JSON is taken as such)."""
    out: dict[str, Any] = {}
    # a comma starts the next key only before `KEY=`: a list value keeps its commas
    for item in filter(None, re.split(r",(?=[\w.]+=)", text)):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--ingest: {item!r} is not KEY=VALUE")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rate",
        default="2000",
        help="records per second, or half-max: half of what lakesink ingests from a backlog "
        "(measured first, the lowest over --formats)",
    )
    parser.add_argument(
        "--store",
        choices=("local", "s3"),
        default="local",
        help="lakesink's tables on local disk or in a bucket of a local S3 server (moto over HTTP)",
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of production")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--triggers", default="5,1,0.2,0", help="trigger.interval.s values")
    parser.add_argument("--formats", default="hudi,iceberg", help="table formats, in turn")
    parser.add_argument("--poll", type=float, default=0.1, help="the reader's poll interval, s")
    parser.add_argument(
        "--peers", default="", help="peers, in turn, of delta,hudi,iceberg (default: none)"
    )
    parser.add_argument("--peer-triggers", default="1,0", help="the peers' triggers, s")
    parser.add_argument("--cores", type=int, default=2, help="the peers' Spark local[N]")
    parser.add_argument(
        "--per-batch",
        type=int,
        default=1_000_000,
        help="lakesink's kafka.max.records.per.batch in the measured runs",
    )
    parser.add_argument(
        "--ingest",
        default="",
        help="more lakesink keys for the measured runs, KEY=VALUE,... (values as JSON where "
        "they parse, else text): e.g. commit.mode=async",
    )
    parser.add_argument(
        "--full-reads",
        action="store_true",
        help="lakesink's reader reads the whole table at each poll (default: only what the "
        "commits since its last poll added)",
    )
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)
    args.ingest_keys = _keys(args.ingest)
    # a SIGTERM (timeout, kill) unwinds like Ctrl-C: the writers, readers and broker are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from lakesink.kafka.kafka_server import local_broker

    if args.store == "s3" and args.peers:
        raise SystemExit("--store s3 runs lakesink only: leave --peers out")
    results: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="lakesink-freshness-") as tmp_name,
        ExitStack() as on_exit,
    ):
        tmp = Path(tmp_name)
        broker = local_broker("kafka", data_dir=tmp / "broker")
        broker.start()
        on_exit.callback(broker.close)
        store: dict[str, Any] = {}
        if args.store == "s3":
            sys.path.insert(0, str(HERE.parent / "tests"))
            from s3_server import S3Server

            server = on_exit.enter_context(S3Server())
            store = {"root": f"s3://{server.new_bucket('fresh')}", **server.storage_config()}
        formats = [f for f in args.formats.split(",") if f]
        if args.rate == "half-max":
            maxima = {f: max_rate(broker.bootstrap_servers, f, args, tmp, store) for f in formats}
            print(
                "max rate from a backlog, records/s: "
                + ", ".join(f"{f} {r:,.0f}" for f, r in maxima.items())
            )
            rate = min(maxima.values()) / 2
        else:
            rate = float(args.rate)
        runs = [(f"lakesink-{fmt}", float(t)) for fmt in formats for t in args.triggers.split(",")]
        runs += [
            (f"peer-{mode}", float(t))
            for mode in args.peers.split(",")
            if mode
            for t in args.peer_triggers.split(",")
        ]
        for system, trigger in runs:
            results.append(
                one_trigger(
                    broker.bootstrap_servers, system, trigger, args, tmp, store, rate, broker.pid
                )
            )
            print_table(results[-1:])
    print(
        f"\n{rate:,.0f} records/s over {args.partitions} partitions for {args.seconds} s, "
        f"lakesink's tables on {args.store};"
    )
    print(f"load average at the end {os.getloadavg()}")
    print_table(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
