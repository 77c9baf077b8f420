"""Commit cost as the table grows: drive the Coordinator directly (no Spark) with synthetic
write statuses, on tables whose history holds 100 .. 100k base files, for 8 .. 512 Kafka
partitions. Each measured batch: begin_batch() (lock, instant time, intent, heartbeat, requested and
inflight files), then untimed: one empty base file and its marker per Kafka partition, then
complete_batch() (reconcile against markers, lock, liveness and offset checks, conflict check,
publish). "publish" is the part under the lock that writes the completed instant
(BatchOutcome.publish_s); "batch overhead" is begin + complete."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lakesink.config import build_config
from lakesink.engine import writer_state as keys
from lakesink.formats.hudi.coordinator import HudiCoordinator
from lakesink.formats.hudi.services.archival import ArchivePolicy, archive
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.files import base_file_name, new_file_id
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.markers import create_marker
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.protocol.instant import Action, InstantTime
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets
from lakesink.protocol.write_status import FileWrite, WriteStatus
from lakesink.spark.pipeline import make_control

TOPIC = "bench"
WRITER = "bench-writer"
HISTORY_FILES_PER_COMMIT = 100
RECORDS_PER_PARTITION = 1000
SCHEMA = json.dumps(
    {"type": "record", "name": "bench_record", "fields": [{"name": "x", "type": "long"}]}
)


def _file(t: InstantTime, partition: int) -> FileWrite:
    fid = new_file_id()
    return FileWrite("", fid, base_file_name(fid, f"{partition}-1-0", t), 1000, 1 << 20)


def build_history(path: Path, files: int, partitions: int) -> tuple[HudiTable, WriterOffsets]:
    """A table whose timeline holds `files` base files in commits of 100 files by WRITER, the
    last one recording offsets for `partitions` partitions (the files exist only in metadata)."""
    table = HudiTable.create(path, TableConfig("bench", ("kafka_offset",), (), version=8))
    base = int(time.time() * 1000) - 10 * files
    offsets = WriterOffsets.empty()
    commits = max(1, files // HISTORY_FILES_PER_COMMIT)
    for c in range(commits):
        t = InstantTime.from_epoch_ms(base + c * 10)
        offsets = offsets.advanced_by(
            OffsetRange(TopicPartition(TOPIC, p), c * RECORDS_PER_PARTITION, (c + 1) * 1000)
            for p in range(partitions)
        )
        n = min(HISTORY_FILES_PER_COMMIT, files)
        md = CommitMetadata(
            "INSERT",
            tuple(_file(t, i % partitions) for i in range(n)),
            schema=SCHEMA,
            extra={
                keys.WRITER_ID_KEY: WRITER,
                keys.OFFSETS_KEY: json.dumps(offsets.to_json()),
                keys.BATCH_ID_KEY: str(c),
            },
        )
        timeline = table.timeline()
        inst = timeline.begin(Action.COMMIT, t)
        timeline.publish(inst, md, completion_time=InstantTime.from_epoch_ms(base + c * 10 + 5))
    return table, offsets


def measure(
    path: Path, files: int, partitions: int, repeats: int, archived: bool = False
) -> dict[str, Any]:
    t0 = time.perf_counter()
    table, offsets = build_history(path, files, partitions)
    built_s = time.perf_counter() - t0
    cfg = build_config(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "kafka.topics": TOPIC,
            "value.format": "raw",
            "table.path": str(path),
            "writer.id": WRITER,
            "lock.provider": "filesystem",
        }
    )
    services = make_control(cfg)
    if archived:  # archival down to its default 20 active instants, before measuring
        archive(table, services, ArchivePolicy())
    coordinator = HudiCoordinator(table, WRITER, query_id="bench", control=services)
    coordinator.start()
    publish: list[float] = []
    overhead: list[float] = []
    begin_s: list[float] = []
    cpu: list[float] = []  # this process's CPU time: steadier than wall time on a shared machine
    for batch in range(repeats):
        ranges = [
            OffsetRange(tp, start, start + RECORDS_PER_PARTITION)
            for tp, start in sorted(offsets.next_offsets.items())
        ]
        a, a_cpu = time.perf_counter(), time.process_time()
        t = coordinator.begin_batch(batch, ranges)
        b, b_cpu = time.perf_counter(), time.process_time()
        assert t is not None
        statuses = []
        for r in ranges:
            f = _file(t, r.partition.partition)
            create_marker(table.base_path, t, "", f.path)
            (table.base_path / f.path).touch()
            statuses.append(
                WriteStatus(t.value, f"0.{r.partition.partition}.0", r, (f,), 1000, 1000)
            )
        c, c_cpu = time.perf_counter(), time.process_time()
        outcome = coordinator.complete_batch(t, batch, ranges, statuses, schema=SCHEMA)
        d, d_cpu = time.perf_counter(), time.process_time()
        offsets = offsets.advanced_by(ranges)
        publish.append(outcome.publish_s)
        begin_s.append(b - a)
        overhead.append((b - a) + (d - c))
        cpu.append((b_cpu - a_cpu) + (d_cpu - c_cpu))
    return {
        "files": files,
        "partitions": partitions,
        "archived": archived,
        "instants": len(table.timeline()),
        "history_build_s": round(built_s, 1),
        "publish_ms": _pcts(publish),
        "begin_ms": _pcts(begin_s),
        "batch_overhead_ms": _pcts(overhead),
        "batch_cpu_ms": _pcts(cpu),
    }


def _pcts(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {
        "p50": round(1000 * statistics.median(s), 2),
        "p95": round(1000 * s[min(len(s) - 1, round(0.95 * len(s)) - 1)], 2),
    }


CASES = [
    (100, 8, False),
    (1_000, 8, False),
    (10_000, 8, False),
    (100_000, 8, False),
    (100_000, 8, True),
    (10_000, 64, False),
    (10_000, 512, False),
    (100_000, 512, False),
]


def run_commit_cost(work: Path, repeats: int) -> list[dict[str, Any]]:
    out = []
    for files, partitions, archived in CASES:
        label = f"t{files}-{partitions}" + ("-archived" if archived else "")
        res = measure(work / label, files, partitions, repeats, archived)
        out.append(res)
        print(
            f"commit: {files:>7,} files {partitions:>3} partitions ({res['instants']} instants"
            f"{', archived' if archived else ''}): "
            f"publish p50 {res['publish_ms']['p50']} ms, overhead p50 "
            f"{res['batch_overhead_ms']['p50']} ms",
            flush=True,
        )
    return out


def print_commit_cost(rows: list[dict[str, Any]]) -> None:
    print(
        f"\n{'files':>8} {'kafka partitions':>16} {'instants':>8} {'archival':>8} "
        f"{'publish p50/p95 ms':>19} "
        f"{'batch overhead p50/p95 ms':>26} {'batch CPU p50/p95 ms':>21}"
    )
    for r in rows:
        p, o = r["publish_ms"], r["batch_overhead_ms"]
        print(
            f"{r['files']:>8,} {r['partitions']:>16} {r['instants']:>8} "
            f"{'on' if r.get('archived') else 'off':>8} "
            f"{p['p50']:>9.1f} / {p['p95']:<7.1f} {o['p50']:>13.1f} / {o['p95']:<8.1f}"
            + (f" {c['p50']:>10.1f} / {c['p95']:<8.1f}" if (c := r.get("batch_cpu_ms")) else "")
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30, help="measured batches per case")
    parser.add_argument(
        "--case",
        action="append",
        default=[],
        help="files:partitions[:archived], repeatable (default: every case of CASES)",
    )
    parser.add_argument("--json", type=Path, help="write the rows here as JSON")
    args = parser.parse_args(argv)
    cases = [
        (int(c.split(":")[0]), int(c.split(":")[1]), c.endswith(":archived")) for c in args.case
    ] or CASES
    rows = []
    with tempfile.TemporaryDirectory(prefix="commit-cost-") as work:
        for files, partitions, archived in cases:
            label = f"t{files}-{partitions}" + ("-archived" if archived else "")
            row = measure(Path(work) / label, files, partitions, args.repeats, archived)
            print(json.dumps(row), flush=True)
            rows.append(row)
    print_commit_cost(rows)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
