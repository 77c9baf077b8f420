"""Figures for table services (prints them; not a timed test).

1. Clustering a streamed table: many micro-batch commits of small files, then one clustering
   (and a clean that deletes the replaced files): base files before/after and snapshot read time
   with hudi-rs and with lakesink's reader.
2. Commit time as the table ages: commits through the Coordinator (filesystem lock, heartbeats,
   conflict check) without services, with clean + archive every 50 commits (a stream that is
   never clustered) and with clean + cluster + archive; median and p95 of the publish step
   (under the lock) and of begin+publish over the last 100 commits, and the services' time per
   run, around 100, 1k and 10k commits; with archival, the files in the archived timeline
   (packed) and the time to read every commit's metadata, archived ones included (the audit).

3. `--defaults-commits N`: only the cost per commit of the default inline services (as an
   ingestion runs them, every `table.services.inline.every.commits`) against all of them off.

    python benchmarks/bench_services.py [--commits 100,1000,10000] [--no-archival-up-to 1000]
        [--modes archive,cluster] [--skip-clustering] [--pack-files 600]
    python benchmarks/bench_services.py --defaults-commits 200
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from lakesink.formats.hudi.audit import completed_commits, read_with_hudi_rs
from lakesink.formats.hudi.control import LockedCommitControl
from lakesink.formats.hudi.coordinator import HudiCoordinator
from lakesink.formats.hudi.services.archival import ArchivePolicy, archive
from lakesink.formats.hudi.services.clean import RetainPolicy, clean
from lakesink.formats.hudi.services.clustering import ClusteringOptions, cluster
from lakesink.formats.hudi.table.archive import ARCHIVE_DIR, PACK_LOOSE_FILES
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.files import write_token
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.table.view import FileSystemView
from lakesink.formats.hudi.table.writer import PartitionedWriter
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import WriteStatus


def make_table(path: Path) -> tuple[HudiTable, LockedCommitControl, HudiCoordinator]:
    table = HudiTable.create(
        path,
        TableConfig(
            name="bench",
            record_key_fields=("kafka_topic", "kafka_partition", "kafka_offset"),
            partition_fields=("kafka_partition",),
        ),
    )
    services = LockedCommitControl(path, heartbeat_interval_s=5, heartbeat_tolerance_s=60)
    coord = HudiCoordinator(table, "bench-writer", control=services)
    coord.start()
    return table, services, coord


def commit_batch(
    coord: HudiCoordinator, batch: int, rows: int, partitions: int
) -> tuple[float, float]:
    """One micro-batch: `rows` records per partition. Returns (publish s, begin+complete s)."""
    ranges = []
    for p in range(partitions):
        tp = TopicPartition("events", p)
        start = coord.committed.get(tp) or 0
        ranges.append(OffsetRange(tp, start, start + rows))
    started = time.perf_counter()
    t = coord.begin_batch(batch, ranges)
    assert t is not None
    begin_s = time.perf_counter() - started
    writer = PartitionedWriter(coord.table, t, write_token(0, 0, 0))
    n = rows * partitions
    writer.write(
        pa.table(
            {
                "kafka_topic": pa.array(["events"] * n),
                "kafka_partition": pa.array(
                    [r.partition.partition for r in ranges for _ in range(rows)], pa.int32()
                ),
                "kafka_offset": pa.array(
                    [o for r in ranges for o in range(r.start, r.end)], pa.int64()
                ),
                "payload": pa.array(["x" * 100] * n),
            }
        )
    )
    files = writer.close()
    statuses = [WriteStatus(t.value, "a", None, tuple(files), n, n)]
    started = time.perf_counter()
    outcome = coord.complete_batch(t, batch, ranges, statuses, schema=writer.avro_schema or "")
    return outcome.publish_s, begin_s + time.perf_counter() - started


def read_times(table: HudiTable) -> tuple[float, float, int]:
    started = time.perf_counter()
    n_rs = read_with_hudi_rs(str(table.base_path)).num_rows
    rs = time.perf_counter() - started
    started = time.perf_counter()
    n_ls = TableReader(table).snapshot().num_rows
    ls = time.perf_counter() - started
    assert n_rs == n_ls
    return rs, ls, n_ls


def bench_clustering(root: Path, commits: int, rows: int) -> None:
    table, services, coord = make_table(root / "clustering")
    for b in range(commits):
        commit_batch(coord, b, rows, 4)
    files_before = len(FileSystemView(table).latest_base_files())
    rs_b, ls_b, n = read_times(table)
    started = time.perf_counter()
    result = cluster(table, services, ClusteringOptions(min_files=2))
    cluster_s = time.perf_counter() - started
    cleaned = clean(table, services, RetainPolicy(commits=1))
    files_after = len(FileSystemView(table).latest_base_files())
    rs_a, ls_a, n2 = read_times(table)
    assert n == n2
    print(f"## clustering a streamed table ({commits} commits x 4 partitions, {n:,} rows)")
    print("| | base files | hudi-rs read s | lakesink read s |")
    print("| --- | --- | --- | --- |")
    print(f"| before | {files_before} | {rs_b:.3f} | {ls_b:.3f} |")
    print(f"| after  | {files_after} | {rs_a:.3f} | {ls_a:.3f} |")
    print(
        f"clustering {cluster_s:.2f}s rewrote {result.files_before} files into "
        f"{result.files_after}; clean deleted {len(cleaned.deleted)} replaced files\n"
    )


MODES = {
    "none": "no services",
    "archive": "inline clean + archive every 50 commits (a stream without clustering)",
    "cluster": "inline clean + cluster + archive every 50 commits",
}


def bench_commit_time(
    root: Path, total: int, mode: str, marks: list[int], pack_files: int = PACK_LOOSE_FILES
) -> None:
    table, services, coord = make_table(root / f"commits-{total}-{mode}")
    publish: list[float] = []
    whole: list[float] = []
    service_s: list[float] = []
    print(f"## commit time, {MODES[mode]}")
    print(
        "| commits | active instants | base files | publish median ms | publish p95 ms "
        "| commit median ms | services median ms | archive files | all commits read ms |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for b in range(total):
        p, w = commit_batch(coord, b, 1, 2)
        publish.append(p)
        whole.append(w)
        if mode != "none" and (b + 1) % 50 == 0:
            started = time.perf_counter()
            clean(table, services, RetainPolicy(commits=10))
            if mode == "cluster":
                cluster(table, services, ClusteringOptions(min_files=2))
            archive(table, services, ArchivePolicy(20, 40, pack_files=pack_files))
            service_s.append(time.perf_counter() - started)
        if b + 1 in marks:
            window = slice(max(0, b + 1 - 100), b + 1)
            pub, tot = sorted(publish[window]), sorted(whole[window])
            active = len(table.timeline().instants)
            files = len(list(table.base_path.glob("kafka_partition=*/*.parquet")))
            med, p95 = statistics.median(pub) * 1000, pub[int(len(pub) * 0.95) - 1] * 1000
            svc = f"{statistics.median(service_s[-10:]) * 1000:.0f}" if service_s else "-"
            archived = table.base_path / ARCHIVE_DIR / "timeline"
            archive_files = len(list(archived.iterdir())) if archived.exists() else 0
            started = time.perf_counter()
            assert len(completed_commits(table)) == b + 1
            read_ms = (time.perf_counter() - started) * 1000
            print(
                f"| {b + 1:,} | {active:,} | {files:,} | {med:.1f} | {p95:.1f} | "
                f"{statistics.median(tot) * 1000:.1f} | {svc} | {archive_files:,} "
                f"| {read_ms:.0f} |",
                flush=True,
            )
    print()


def bench_defaults(root: Path, commits: int, rows: int) -> None:
    """The cost per commit of the default inline services (the `table.services.*` defaults, as
    an ingestion's coordinator runs them after its commits) against all services off
    (`table.services.inline.every.commits=0`): the services' time spread over every commit."""
    from lakesink.config import load_config
    from lakesink.formats.hudi.services.inline import inline_services_hook

    print(f"## the default inline services against off ({commits} commits x 2 partitions)")
    print(
        "| services | every N commits | commit mean ms (services included) | commit median ms "
        "| slowest commit ms | active instants | live base files | parquet files on disk |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for label, overrides in (("defaults", {}), ("off", {"table.services.inline.every.commits": 0})):
        path = root / f"defaults-{label}"
        table, services, _ = make_table(path)
        settings = load_config(
            None,
            {
                "kafka.bootstrap.servers": "127.0.0.1:9",
                "kafka.topics": "events",
                "value.format": "raw",
                "table.path": str(path),
                **overrides,
            },
        ).settings
        coord = HudiCoordinator(
            table,
            "bench-defaults",
            control=services,
            post_commit=(inline_services_hook(table, settings, services),),
        )
        coord.start()
        whole: list[float] = []
        for b in range(commits):
            started = time.perf_counter()
            commit_batch(coord, b, rows, 2)
            whole.append(time.perf_counter() - started)
        live = len(FileSystemView(table).latest_base_files())
        on_disk = len(list(table.base_path.glob("kafka_partition=*/*.parquet")))
        print(
            f"| {label} | {settings.services.inline_every_commits} "
            f"| {statistics.mean(whole) * 1000:.1f} | {statistics.median(whole) * 1000:.1f} "
            f"| {max(whole) * 1000:.0f} | {len(table.timeline().instants)} | {live} | {on_disk} |",
            flush=True,
        )
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", default="100,1000,10000")
    ap.add_argument("--no-archival-up-to", type=int, default=1000)
    ap.add_argument("--cluster-commits", type=int, default=200)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--skip-clustering", action="store_true")
    ap.add_argument(
        "--pack-files",
        type=int,
        default=PACK_LOOSE_FILES,
        help="archived files per pack (a huge number: never pack, to compare)",
    )
    ap.add_argument(
        "--modes", default="archive,cluster", help="service modes with archival: archive,cluster"
    )
    ap.add_argument(
        "--defaults-commits",
        type=int,
        default=0,
        help="only the default inline services against off, over this many commits",
    )
    args = ap.parse_args()
    marks = [int(x) for x in args.commits.split(",")]
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        root = Path(d)
        if args.defaults_commits:
            bench_defaults(root, args.defaults_commits, 250)
            return
        if not args.skip_clustering:
            bench_clustering(root, args.cluster_commits, 250)
        upto = [m for m in marks if m <= args.no_archival_up_to]
        if upto:
            bench_commit_time(root, max(upto), "none", upto)
        for mode in args.modes.split(","):
            bench_commit_time(root, max(marks), mode, marks, args.pack_files)


if __name__ == "__main__":
    main()
