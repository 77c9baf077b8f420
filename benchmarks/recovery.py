"""Recovery: kill -9 of the driver in the middle of a batch, then restart (or a warm standby).

The first `lakesink ingest --once` runs with LAKESINK_CRASH_AT=after-write: in its second batch,
after the tasks wrote their files and before the commit, the driver SIGKILLs itself; the rest of
its process group (Spark's JVM, Python workers) is killed at once, like a power cut. A second
`lakesink ingest --once` starts right away. Measured: seconds from the kill until the next
commit lands (JVM start, query start, recovery, one batch), and until the restart has caught up.
A Hudi table's next commit is a completed instant on its timeline (after the rollback of the
dead one); an Iceberg table's is a new snapshot in its catalog (nothing to roll back: the dead
batch's files are orphans).

`standby=True`: a `lakesink ingest --once --standby` of the same configuration is started
first and warmed (its Spark up, Python workers started); the crashing run starts once the
standby says it is warm. After the kill nothing is restarted: the standby sees the writer's
liveness lapse (standby.takeover.after.s) and takes over.

`restart-plain` is a restart without lakesink's lighter start (spark.class.archive and
spark.python.workers.compiled off). Before the runs the class archive is made
(`python -m lakesink.spark.prepare`), as it is on any machine lakesink ran on before.

    python benchmarks/recovery.py                # restart and standby side by side, one broker
    python benchmarks/recovery.py --variants restart-plain,restart,standby
    python benchmarks/recovery.py --format iceberg --events 200000 --per-batch 50000
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lakesink.formats.hudi.table.timeline import Timeline
from lakesink.kafka.producer import SAMPLE_EVENT_DDL, produce_sample_events
from lakesink.protocol.instant import Action, TimelineLayout

TOPIC = "bench-recovery"
EVENTS = 400_000
PER_BATCH = 100_000


def _config(
    path: Path, bootstrap: str, table: Path, cores: int, fmt: str, topic: str, per_batch: int
) -> None:
    path.write_text(
        f"""[kafka]
"bootstrap.servers" = "{bootstrap}"
topics = ["{topic}"]
"max.records.per.batch" = {per_batch}

[value]
format = "json"
schema = "{SAMPLE_EVENT_DDL}"

[table]
path = "{table}"
format = "{fmt}"
name = "events"

[writer]
id = "bench-recovery"

[lock]
provider = "filesystem"

[spark]
master = "local[{cores}]"
"""
    )


def _completed(table: Path, fmt: str) -> list[str]:
    """The commits on the table so far: completed instants (Hudi) or snapshots (Iceberg)."""
    if fmt == "iceberg":
        return [str(s) for s in _iceberg_snapshots(table)]
    tl = Timeline.load(table, TimelineLayout.V2)
    return [i.time.value for i in tl.completed(Action.COMMIT)]


def _iceberg_snapshots(warehouse: Path) -> list[int]:
    from pyiceberg.exceptions import NoSuchTableError

    from lakesink.formats.iceberg.catalog import CatalogSettings, open_catalog
    from lakesink.formats.iceberg.errors import CatalogNotFoundError

    try:
        catalog = open_catalog(CatalogSettings(warehouse=str(warehouse), create=False))
        table = catalog.load_table(("lakesink", "events"))
    except (CatalogNotFoundError, NoSuchTableError):
        return []  # the first batch has not committed yet
    return [s.snapshot_id for s in table.metadata.snapshots]


def _rollbacks(table: Path, fmt: str) -> int:
    if fmt == "iceberg":
        return 0  # no instants: a dead batch leaves orphan files, nothing to roll back
    return len(Timeline.load(table, TimelineLayout.V2).completed(Action.ROLLBACK))


def _start_standby(cmd: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`cmd --standby`, returned once it says it is warm."""
    log = open(log_path, "wb")  # noqa: SIM115 - the child holds it; closed with the process
    proc = subprocess.Popen(
        [*cmd, "--standby"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    log.close()
    deadline = time.time() + 300
    while "standby warm" not in log_path.read_text(errors="replace"):
        if proc.poll() is not None or time.time() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise RuntimeError(f"the standby did not get warm, see {log_path}")
        time.sleep(0.1)
    return proc


# lakesink's lighter start off (docs/operations.md "A lighter start")
PLAIN_START = {
    "LAKESINK_SPARK_CLASS_ARCHIVE": "false",
    "LAKESINK_SPARK_PYTHON_WORKERS_COMPILED": "false",
}


def run_recovery(
    bootstrap: str,
    work: Path,
    cores: int,
    *,
    fmt: str = "hudi",
    events: int = EVENTS,
    per_batch: int = PER_BATCH,
    topic: str = TOPIC,
    standby: bool = False,
    produce: bool = True,
    plain_start: bool = False,
) -> dict[str, Any]:
    """`fmt`: the table format (`hudi` or `iceberg`); `topic` is produced `events` events
    (unless `produce` is False: it holds them already). `standby`: a warm standby takes over
    instead of a restart. `plain_start`: the restart without the lighter start."""
    work.mkdir(parents=True, exist_ok=True)
    if produce:
        produce_sample_events(bootstrap, topic, events, 8)
    table = work / "table"
    cfg = work / "ingest.toml"
    _config(cfg, bootstrap, table, cores, fmt, topic, per_batch)
    cmd = [sys.executable, "-m", "lakesink.cli.main", "ingest", "--config", str(cfg), "--once"]
    env2 = {k: v for k, v in os.environ.items() if not k.startswith("LAKESINK_CRASH")}
    if plain_start:
        env2.update(PLAIN_START)
    waiting = _start_standby(cmd, work / "standby.log", env2) if standby else None
    env = {**os.environ, "LAKESINK_CRASH_AT": "after-write", "LAKESINK_CRASH_AFTER_BATCHES": "1"}
    log1 = open(work / "crash.log", "wb")  # noqa: SIM115 - closed below
    first = subprocess.Popen(
        cmd, env=env, stdout=log1, stderr=subprocess.STDOUT, start_new_session=True
    )
    first.wait(timeout=600)
    t_kill = time.time()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(first.pid, signal.SIGKILL)  # the JVM and workers die with the driver
    log1.close()
    if first.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the crashing run exited with {first.returncode}, see {work}/crash.log")
    before = set(_completed(table, fmt))
    if waiting is not None:
        second, log_name = waiting, "standby.log"
    else:
        log_name = "restart.log"
        with open(work / log_name, "wb") as log2:
            second = subprocess.Popen(
                cmd, env=env2, stdout=log2, stderr=subprocess.STDOUT, start_new_session=True
            )
    t_next = None
    while second.poll() is None:
        if t_next is None and set(_completed(table, fmt)) - before:
            t_next = time.time()
        time.sleep(0.05)
    t_done = time.time()
    if second.returncode != 0:
        raise RuntimeError(f"the {log_name} run exited with {second.returncode}, see {work}")
    if t_next is None and set(_completed(table, fmt)) - before:
        t_next = t_done
    text = (work / log_name).read_text(errors="replace")
    return {
        "format": fmt,
        "variant": "warm standby"
        if standby
        else "restart, plain start"
        if plain_start
        else "restart",
        "crash_point": "after-write (batch 2 written, not committed)",
        "events": events,
        "records_per_batch": per_batch,
        "commits_before_kill": len(before),
        "kill_to_next_commit_s": round((t_next or t_done) - t_kill, 2),
        "kill_to_caught_up_s": round(t_done - t_kill, 2),
        "rolled_back": _rollbacks(table, fmt),
        "restart_summary": [ln for ln in text.splitlines() if "records in" in ln][-1:],
        "takeover": [ln for ln in text.splitlines() if "taking over" in ln][-1:],
    }


def main() -> None:
    import argparse
    import json
    import shutil
    import tempfile

    from lakesink.kafka.kafka_server import local_broker

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--format", default="hudi", choices=("hudi", "iceberg"))
    ap.add_argument("--events", type=int, default=EVENTS)
    ap.add_argument("--per-batch", type=int, default=PER_BATCH)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--broker", default="kafka", help="kafka (Apache Kafka) or noida")
    ap.add_argument(
        "--variants",
        default="restart,standby",
        help="comma-separated: restart-plain,restart,standby",
    )
    args = ap.parse_args()
    subprocess.run([sys.executable, "-m", "lakesink.spark.prepare"], check=True)
    work = Path(tempfile.mkdtemp(prefix="lakesink-recovery-"))
    rows = []
    try:
        broker = local_broker(args.broker, data_dir=work / "broker")
        broker.start()
        try:
            produce_sample_events(broker.bootstrap_servers, TOPIC, args.events, 8)
            for variant in args.variants.split(","):
                row = run_recovery(
                    broker.bootstrap_servers,
                    work / variant,
                    args.cores,
                    fmt=args.format,
                    events=args.events,
                    per_batch=args.per_batch,
                    standby=variant == "standby",
                    produce=False,
                    plain_start=variant == "restart-plain",
                )
                print(json.dumps(row), flush=True)
                rows.append(row)
        finally:
            broker.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nrecovery after kill -9 at after-write, {args.format}, {args.events:,} events, "
          f"{args.per_batch:,} per batch, load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| variant | kill → next commit s | kill → caught up s | rollbacks |")
    print("| --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['variant']} | {r['kill_to_next_commit_s']} | {r['kill_to_caught_up_s']} | "
              f"{r['rolled_back']} |")  # fmt: skip


if __name__ == "__main__":
    main()
