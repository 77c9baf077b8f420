"""Randomized crash soak: streaming ingestion under injected faults, then the exactly-once audit.

    python benchmarks/soak.py --minutes 30 [--partitions 8] [--seed S] [--second-writer]
                              [--services-every N] [--json out.json] [--workdir DIR] [--keep]
                              [--format hudi|iceberg]

For `--minutes` minutes it produces continuously (bounded rate, acks=all, idempotent) to a
multi-partition topic of its own broker on loopback (Apache Kafka; `--broker noida` for
noida-db), runs `python -m lakesink.cli.main ingest` (streaming, no --once) as a subprocess in
its own process group, and at random moments injects a fault:

- kill-driver: SIGKILL the driver's process group (driver, its JVM and Python workers);
- kill-python-worker: SIGKILL one Python process under the driver's JVM (daemon, worker or the
  streaming-source runner): an executor-side crash;
- broker-restart: stop and start the broker (same port and data);
- broker-kill: SIGKILL the broker and start it again (Apache Kafka only: noida-db loses
  acknowledged records that way);
- kill-lock-holder: wait for a driver to hold the table lock (filesystem lease) and SIGKILL it;
- crash-at-<point>: a restarted driver runs with LAKESINK_CRASH_AT=<point> (random commit step,
  after a random number of batches) and kills itself there;
- task-failure: a restarted driver runs with LAKESINK_FAIL_TASK_ATTEMPTS=1 (every sink task's
  first attempt fails after writing its files; counted per failed attempt seen in its log).

With `--second-writer`, a second ingestion (another writer id, another topic) writes into the
same table concurrently (lock.provider=filesystem). With `--services-every N`, the drivers run
clean, clustering and archival inline every N commits, and crash-at points include
during-archival. Every dead driver is restarted. At the end
production stops, each writer runs `ingest --once` to catch up, and the audit runs: for every
writer `lakesink.formats.hudi.audit.audit` (hudi-rs + lakesink's reader against Kafka), plus
this script's own count of table rows, duplicates and missing records against the Kafka logs and
against the events the producer saw acknowledged (acknowledged events that are not in the
broker's log at all were lost by the broker over a restart; they are counted apart, not as
lakesink's loss; with Apache Kafka any such loss fails the soak). Exit status 0 only with zero
loss and zero duplicates.

With `--format iceberg` the table is an Iceberg table (`table.format=iceberg`, the work dir's
`table/` folder the warehouse with its SQLite catalog): no lock, so no kill-lock-holder; the
crash points are the engine's up to after-publish (after the catalog commit, before Spark's commit
log); `--services-every N` runs inline expire-snapshots and rewrite-data-files every N commits;
the audit is `lakesink.formats.iceberg.audit` (pyiceberg and DuckDB against Kafka) and this
script's own count reads the table with pyiceberg.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lakesink.kafka.producer import SAMPLE_EVENT_DDL, sample_event_bytes

CRASH_POINTS = (
    "before-begin",
    "after-begin",
    "after-write",
    "after-reconcile",
    "after-publish",
    "during-rollback",
)
FAULT_WEIGHTS = {
    "kill-driver": 2,
    "kill-python-worker": 4,
    "broker-restart": 3,
    "kill-lock-holder": 1,
}
BROKER_FAULTS = ("broker-restart", "broker-kill")
# faults that (may) end the driver: only injected into a driver that published a batch in this
# run (or ran for --patience-s), so the soak keeps committing between driver deaths
DRIVER_FAULTS = ("kill-driver", "kill-lock-holder", "kill-python-worker")
TASK_FAULT_TEXT = "RuntimeError: lakesink test fault: failing task attempt"
DRIVER_ENV: dict[str, str] = {}  # PYTHONPATH of a code snapshot (--snapshot-code)


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------------


def _ppid_map() -> dict[int, int]:
    out: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # the command may hold spaces and parentheses: fields follow the last ')'
        rest = stat.rsplit(")", 1)[-1].split()
        if len(rest) >= 2:
            out[int(name)] = int(rest[1])
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def descendants(root: int) -> list[int]:
    ppids = _ppid_map()
    children: dict[int, list[int]] = {}
    for pid, ppid in ppids.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def python_workers(driver_pid: int) -> list[tuple[int, str]]:
    """Python processes under the driver's JVM (all executor side in local mode), each with its
    kind: `task-worker` (a forked pyspark worker running tasks), `worker-daemon` (the pyspark
    daemon forking them), `source-runner` (the streaming data source's planner process) or
    `datasource-worker` (data-source lookup/planning workers)."""
    ppids = _ppid_map()
    out = []
    for pid in descendants(driver_pid):
        cmd = _cmdline(pid)
        if not cmd or "java" in cmd.split(" ", 1)[0] or "python" not in cmd:
            continue
        parent_cmd = _cmdline(ppids.get(pid, 0))
        if "python_streaming_source_runner" in cmd:
            kind = "source-runner"
        elif "pyspark.sql.worker" in cmd:
            kind = "datasource-worker"
        elif "pyspark.daemon" in parent_cmd:
            kind = "task-worker"
        else:
            kind = "worker-daemon"
        out.append((pid, kind))
    return out


WORKER_KIND_WEIGHTS = {
    "task-worker": 8,
    "worker-daemon": 2,
    "source-runner": 1,
    "datasource-worker": 1,
}


# --------------------------------------------------------------------------------------------
# producer
# --------------------------------------------------------------------------------------------


class Producer(threading.Thread):
    """Produces sample events at about `rate` per second, round-robin over the partitions of
    each topic; remembers which event ids the broker acknowledged."""

    def __init__(self, bootstrap: str, topics: list[str], partitions: int, rate: float) -> None:
        super().__init__(name="soak-producer", daemon=True)
        from confluent_kafka import Producer as KafkaProducer

        self.topics = topics
        self.partitions = partitions
        self.rate = rate
        self.producer = KafkaProducer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 20,
                "message.timeout.ms": 900_000,  # survive broker restarts
                "retry.backoff.ms": 200,
                "reconnect.backoff.max.ms": 1000,
                "log_level": 0,
            }
        )
        self.acked: dict[str, set[int]] = {t: set() for t in topics}
        self.failed = 0
        self.sent = 0
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def _on_delivery(self, err: Any, msg: Any) -> None:
        with self._lock:
            if err is not None:
                self.failed += 1
            else:
                self.acked[msg.topic()].add(int(msg.key()))

    def run(self) -> None:
        step = 0.1
        per_step = max(1, round(self.rate * step))
        next_id = dict.fromkeys(self.topics, 0)
        while not self._halt.is_set():
            t0 = time.monotonic()
            for topic in self.topics:
                for _ in range(per_step):
                    i = next_id[topic]
                    next_id[topic] += 1
                    value = sample_event_bytes(i, payload_bytes=120)
                    while True:
                        try:
                            self.producer.produce(
                                topic,
                                value,
                                str(i).encode(),
                                partition=i % self.partitions,
                                on_delivery=self._on_delivery,
                            )
                            break
                        except BufferError:
                            self.producer.poll(0.1)
                    self.sent += 1
            self.producer.poll(0)
            self._halt.wait(max(0.0, step - (time.monotonic() - t0)))

    def stop(self, timeout_s: float = 300.0) -> int:
        self._halt.set()
        self.join()
        return int(self.producer.flush(timeout_s))

    @property
    def acked_count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self.acked.values())


# --------------------------------------------------------------------------------------------
# drivers
# --------------------------------------------------------------------------------------------


@dataclass
class Run:
    proc: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str]
    started: float
    killed_by_us: bool = False


@dataclass
class Writer:
    """One ingestion (writer id, topic, config file) and its current driver process."""

    name: str
    writer_id: str
    topic: str
    config: Path
    logs: Path
    run: Run | None = None
    runs: int = 0
    exits: Counter[str] = field(default_factory=Counter)
    task_faults: int = 0

    def start(self, env: dict[str, str] | None = None) -> None:
        self.runs += 1
        log_path = self.logs / f"{self.name}-{self.runs:04d}.log"
        extra = env or {}
        with open(log_path, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "lakesink.cli.main", "ingest", "--config", str(self.config)],
                env={**os.environ, **DRIVER_ENV, **extra},
                cwd=self.logs,  # not the repo: `-m` puts the cwd first on sys.path
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.run = Run(proc, log_path, extra, time.monotonic())
        desc = " ".join(f"{k}={v}" for k, v in extra.items())
        log(f"{self.name}: started driver pid {proc.pid} (run {self.runs}) {desc}")

    @property
    def pid(self) -> int | None:
        return self.run.proc.pid if self.run else None

    def alive(self) -> bool:
        return self.run is not None and self.run.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the driver's whole process group (driver, JVM, Python workers)."""
        if self.run is None:
            return
        self.run.killed_by_us = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.run.proc.pid, signal.SIGKILL)
        self.run.proc.wait()

    def batches_this_run(self) -> int:
        """Batches the current driver has published (its progress lines)."""
        if self.run is None:
            return 0
        try:
            text = self.run.log_path.read_text(errors="replace")
        except OSError:
            return 0
        return sum(1 for ln in text.splitlines() if ln.startswith("batch "))

    def killable(self, patience_s: float) -> bool:
        """Alive and either published a batch in this run or running for `patience_s`: killing
        drivers only then keeps the soak making progress between driver deaths."""
        if not self.alive() or self.run is None:
            return False
        if time.monotonic() - self.run.started > patience_s:
            return True
        return self.batches_this_run() > 0

    def reap(self) -> tuple[int, Run] | None:
        """If the driver ended: kill what is left of its group, return its exit code."""
        if self.run is None or self.run.proc.poll() is None:
            return None
        run, self.run = self.run, None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.proc.pid, signal.SIGKILL)
        code = run.proc.returncode
        try:
            text = run.log_path.read_text(errors="replace")
        except OSError:
            text = ""
        if run.env.get("LAKESINK_FAIL_TASK_ATTEMPTS"):
            self.task_faults += text.count(TASK_FAULT_TEXT)
        if code != 0 and code != -signal.SIGKILL:
            last = [ln for ln in text.splitlines() if "error" in ln.lower()][-1:]
            self.exits[f"exit {code}"] += 1
            log(f"{self.name}: driver exited {code}: {last[0][:300] if last else ''}")
        else:
            self.exits["killed" if code == -signal.SIGKILL else "exit 0"] += 1
        return code, run


# --------------------------------------------------------------------------------------------
# the soak
# --------------------------------------------------------------------------------------------


def write_config(path: Path, values: dict[str, Any]) -> None:
    lines = [f'"{k}" = {json.dumps(v)}' for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")


ICEBERG_TABLE = "soak"


def completed_commits(table_path: Path, table_format: str = "hudi") -> int:
    if table_format == "iceberg":  # a new metadata file a commit (the creation's first one too)
        return max(0, sum(1 for _ in table_path.glob("*/*/metadata/*.metadata.json")) - 1)
    folder = table_path / ".hoodie" / "timeline"
    try:
        return sum(1 for n in os.listdir(folder) if n.endswith(".commit"))
    except FileNotFoundError:
        return 0


def lock_holder_pid(table_path: Path) -> int | None:
    """The pid of the process holding the table's filesystem lease right now, if any."""
    lock_dir = table_path / ".hoodie" / ".lakesink" / "lock"
    try:
        names = os.listdir(lock_dir)
    except FileNotFoundError:
        return None
    seqs = sorted(int(n[:12]) for n in names if n.endswith(".lease") and n[:12].isdigit())
    if not seqs:
        return None
    seq = seqs[-1]
    if (lock_dir / f"{seq:012d}.released").exists():
        return None
    try:
        rec = json.loads((lock_dir / f"{seq:012d}.lease").read_text())
    except (OSError, ValueError):
        return None
    if float(rec.get("expires_at", 0)) < time.time():
        return None
    owner = str(rec.get("owner", ""))
    pid = owner.rsplit(":", 1)[-1]
    return int(pid) if pid.isdigit() else None


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.faults: Counter[str] = Counter()
        self.worker_kinds: Counter[str] = Counter()
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self.workdir = Path(args.workdir or tempfile.mkdtemp(prefix="lakesink-soak-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.table = self.workdir / "table"
        self.logs = self.workdir / "logs"
        self.logs.mkdir(exist_ok=True)
        self.broker: Any = None
        self.producer: Producer | None = None
        self.writers: list[Writer] = []
        self.last_progress = time.monotonic()
        self.last_commits = 0
        self.code_commit: str | None = None
        self.last_broker_restart = -1e9

    # -- setup -------------------------------------------------------------------------------

    def snapshot_code(self) -> str:
        """Extract the committed `lakesink` package into the work dir; drivers run on it."""
        repo = Path(__file__).resolve().parents[1]
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
        code = self.workdir / "code"
        code.mkdir(exist_ok=True)
        archive = subprocess.run(
            ["git", "archive", commit, "lakesink"], cwd=repo, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(code)], input=archive, check=True)
        DRIVER_ENV["PYTHONPATH"] = os.pathsep.join(
            [str(code), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        log(f"drivers run lakesink at commit {commit} from {code}")
        return commit

    def setup(self) -> None:
        from lakesink.kafka.client import create_topic

        if self.args.snapshot_code:
            self.code_commit = self.snapshot_code()
        from lakesink.kafka.kafka_server import local_broker

        self.broker = local_broker(self.args.broker, data_dir=self.workdir / "broker")
        self.broker.start()
        log(
            f"{self.args.broker} broker {self.broker.bootstrap_servers} pid {self.broker.pid}, "
            f"work in {self.workdir}"
        )
        names = ["a", "b"] if self.args.second_writer else ["a"]
        for name in names:
            topic = f"soak-{name}"
            create_topic(self.broker.bootstrap_servers, topic, self.args.partitions)
            conf = self.workdir / f"writer-{name}.toml"
            write_config(
                conf,
                {
                    "kafka.bootstrap.servers": self.broker.bootstrap_servers,
                    "kafka.topics": topic,
                    "value.format": "json",
                    "value.schema": SAMPLE_EVENT_DDL,
                    "table.path": str(self.table),
                    "writer.id": f"soak-writer-{name}",
                    "kafka.max.records.per.batch": self.args.max_batch,
                    "trigger.interval.s": 1,
                    "spark.master": "local[2,4]",
                    "spark.conf": "spark.sql.shuffle.partitions=2,spark.driver.memory=1g",
                    **self.format_config(),
                    **self.services_config(),
                },
            )
            self.writers.append(Writer(name, f"soak-writer-{name}", topic, conf, self.logs))
        self.producer = Producer(
            self.broker.bootstrap_servers,
            [w.topic for w in self.writers],
            self.args.partitions,
            self.args.rate,
        )
        self.producer.start()

    @property
    def iceberg(self) -> bool:
        return bool(self.args.format == "iceberg")

    def format_config(self) -> dict[str, Any]:
        """Hudi: the filesystem lease lock with short leases (so kill-lock-holder has a holder
        to find); Iceberg: its table in the warehouse (catalog OCC, no lock)."""
        if self.iceberg:
            return {"table.format": "iceberg", "table.name": ICEBERG_TABLE}
        return {
            "lock.provider": "filesystem",
            "lock.lease.s": 6,
            "lock.timeout.s": 90,
            "heartbeat.interval.s": 1,
            "heartbeat.tolerance.s": 15,
        }

    def services_config(self) -> dict[str, Any]:
        """With --services-every N: inline clean, cluster and archive every N commits, keeping
        few instants and packing the archive in small packs, and clustering size tiers of two
        files, so that archival, packing and clustering run (and are crashed into) often."""
        if self.args.services_every <= 0:
            return {}
        if self.iceberg:  # expire (keeping each writer's newest) and rewrite small files
            return {
                "table.services.inline.every.commits": self.args.services_every,
                "table.services.clean.retain.hours": 0.002,  # snapshots older than 7 s
                "table.services.clustering.small.file.bytes": 10_000_000,
                "table.services.clustering.min.files": 2,
                "table.services.clustering.tier.ratio": 2,  # size tiers, filled quickly
            }
        return {
            "table.services.inline.every.commits": self.args.services_every,
            "table.services.clean.retain.commits": 3,
            "table.services.archive.min.instants": 4,
            "table.services.archive.max.instants": 8,
            "table.services.archive.pack.files": 12,
            "table.services.archive.pack.fan.in": 3,
            "table.services.clustering.tier.ratio": 2,  # size tiers, filled quickly
        }

    # -- faults ------------------------------------------------------------------------------

    def restart_env(self) -> dict[str, str]:
        """The environment of a restarted driver: sometimes a crash point or failing tasks."""
        r = self.rng.random()
        if r < self.args.crash_step_prob:
            points = CRASH_POINTS
            if self.iceberg:  # nothing to roll back: an unfinished batch leaves orphan files only
                points = tuple(p for p in CRASH_POINTS if p != "during-rollback")
            elif self.args.services_every > 0:
                points += ("during-archival",)
            return {
                "LAKESINK_CRASH_AT": self.rng.choice(points),
                "LAKESINK_CRASH_AFTER_BATCHES": str(self.rng.randint(0, 1)),
            }
        if r < self.args.crash_step_prob + self.args.task_fail_prob:
            return {"LAKESINK_FAIL_TASK_ATTEMPTS": "1"}
        return {}

    def ensure_drivers(self) -> None:
        for w in self.writers:
            ended = w.reap()
            if ended is not None:
                code, run = ended
                point = run.env.get("LAKESINK_CRASH_AT")
                if code == -signal.SIGKILL and not run.killed_by_us and point:
                    self.faults[f"crash-at-{point}"] += 1
                    log(f"{w.name}: driver crashed itself at {point}")
                elif code == -signal.SIGKILL and not run.killed_by_us:
                    self.problems.append(
                        f"{w.name}: driver killed by someone else ({run.log_path})"
                    )
            if w.run is None:
                w.start(self.restart_env() if w.runs else {})

    def pick_fault(self) -> str:
        kinds = [k for k in FAULT_WEIGHTS if not (self.iceberg and k == "kill-lock-holder")]
        weights = [FAULT_WEIGHTS[k] for k in kinds]
        return self.rng.choices(kinds, weights)[0]

    def inject(self, kind: str) -> str | None:
        """Inject a fault of `kind` (or a milder one when no driver may be killed now); returns
        the kind injected, None if none could be."""
        live = [w for w in self.writers if w.alive()]
        killable = [w for w in live if w.killable(self.args.patience_s)]
        if kind in DRIVER_FAULTS and not killable:
            # a task worker's death only fails a task (Spark retries it); else the broker
            if any(k == "task-worker" for w in live for _, k in python_workers(w.pid or 0)):
                return self._kill_worker(live, only="task-worker")
            kind = "broker-restart"
        if kind in BROKER_FAULTS and (
            time.monotonic() - self.last_broker_restart < self.args.broker_restart_gap_s
        ):
            return None  # back to back, the drivers would never get a batch through
        if kind in BROKER_FAULTS and self.args.broker == "kafka":
            # Apache Kafka keeps what it acknowledged (acks=all) through a SIGKILL: every other
            # broker fault, the first included, is a kill
            kills, restarts = self.faults["broker-kill"], self.faults["broker-restart"]
            kind = "broker-kill" if kills <= restarts else "broker-restart"
        live = killable if kind in DRIVER_FAULTS else live
        if kind == "kill-python-worker":
            return self._kill_worker(live)
        return kind if self._inject(kind, live) else None

    def _kill_worker(self, live: list[Writer], only: str | None = None) -> str | None:
        candidates = [(w, p, k) for w in live for p, k in python_workers(w.pid or 0)]
        candidates = [c for c in candidates if only is None or c[2] == only]
        if not candidates:
            return None
        kinds = sorted({k for _, _, k in candidates})
        chosen = self.rng.choices(kinds, [WORKER_KIND_WEIGHTS[k] for k in kinds])[0]
        w, pid, kind = self.rng.choice([c for c in candidates if c[2] == chosen])
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.worker_kinds[kind] += 1
        log(f"FAULT kill-python-worker {w.name} pid {pid} ({kind})")
        return "kill-python-worker"

    def _inject(self, kind: str, live: list[Writer]) -> bool:
        if kind == "kill-driver":
            if not live:
                return False
            w = self.rng.choice(live)
            log(f"FAULT kill-driver {w.name} pid {w.pid}")
            w.kill()
            return True
        if kind == "broker-restart":
            log("FAULT broker-restart")
            self.broker.restart()
            self.last_broker_restart = time.monotonic()
            return True
        if kind == "broker-kill":
            log(f"FAULT broker-kill pid {self.broker.pid}")
            self.broker.kill()
            self.broker.start()
            self.last_broker_restart = time.monotonic()
            return True
        if kind == "kill-lock-holder":
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                pid = lock_holder_pid(self.table)
                for w in live:
                    if pid is not None and w.alive() and w.pid == pid:
                        log(f"FAULT kill-lock-holder {w.name} pid {pid}")
                        w.kill()
                        return True
                time.sleep(0.005)
            return False
        raise AssertionError(kind)

    # -- main loop ---------------------------------------------------------------------------

    def loop(self) -> None:
        end = time.monotonic() + self.args.minutes * 60
        lo, hi = self.args.fault_interval
        next_fault = time.monotonic() + self.rng.uniform(lo, hi) + 10
        while time.monotonic() < end:
            self.ensure_drivers()
            commits = completed_commits(self.table, self.args.format)
            if commits != self.last_commits:
                self.last_commits, self.last_progress = commits, time.monotonic()
            elif time.monotonic() - self.last_progress > self.args.stall_s:
                self.warnings.append(
                    f"no commit for {self.args.stall_s:.0f}s at {commits} commits (slow machine?)"
                )
                log(self.warnings[-1])
                self.last_progress = time.monotonic()
            if time.monotonic() >= next_fault:
                injected = self.inject(self.pick_fault())
                if injected:
                    self.faults[injected] += 1
                    next_fault = time.monotonic() + self.rng.uniform(lo, hi)
                else:  # nothing to inject it into right now: try again soon
                    next_fault = time.monotonic() + 1.0
            time.sleep(0.2)
        for w in self.writers:
            w.reap()
            if w.alive():
                w.kill()
            w.reap()

    # -- final catch-up and audit ------------------------------------------------------------

    def finish(self) -> dict[str, Any]:
        assert self.producer is not None
        if not self.broker.running:
            self.broker.start()
        unflushed = self.producer.stop()
        log(
            f"producer stopped: {self.producer.sent} sent, {self.producer.acked_count} acked, "
            f"{self.producer.failed} failed, {unflushed} unflushed"
        )
        for w in self.writers:
            ok = False
            for attempt in range(3):
                log(f"{w.name}: final ingest --once (attempt {attempt + 1})")
                out = self.logs / f"{w.name}-final-{attempt}.log"
                with open(out, "wb") as f:
                    proc = subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "lakesink.cli.main",
                            "ingest",
                            "--config",
                            str(w.config),
                            "--once",
                        ],
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                        env={**os.environ, **DRIVER_ENV},
                        cwd=self.logs,
                    )
                try:
                    code = proc.wait(timeout=self.args.final_timeout_s)
                except subprocess.TimeoutExpired:
                    code = None
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                if code == 0:
                    ok = True
                    break
                log(f"{w.name}: final ingest ended with {code}; see {out}")
            if not ok:
                self.problems.append(f"{w.name}: the final catch-up (ingest --once) failed")
        return self.audit()

    def audit(self) -> dict[str, Any]:
        if self.iceberg:
            return self.audit_iceberg()
        return self.audit_hudi()

    def audit_iceberg(self) -> dict[str, Any]:
        """Each writer: lakesink's Iceberg audit (pyiceberg and DuckDB against Kafka), and this
        script's own count of the pyiceberg rows against Kafka's logs and the acked events."""
        from lakesink.config import load_config
        from lakesink.formats.iceberg.audit import audit_iceberg
        from lakesink.formats.iceberg.format import IcebergFormat, open_iceberg_table

        assert self.producer is not None
        bootstrap = self.broker.bootstrap_servers
        table = open_iceberg_table(load_config(self.writers[0].config).settings, create=False)
        rows = table.pyiceberg.scan(
            selected_fields=("kafka_topic", "kafka_partition", "kafka_offset", "event_id")
        ).to_arrow()
        result: dict[str, Any] = {"writers": {}}
        totals: Counter[str] = Counter()
        for w in self.writers:
            report = audit_iceberg(table, w.writer_id, bootstrap=bootstrap, from_log_start=True)
            counted = self.count_against_kafka(
                w, rows, IcebergFormat(table).committed_offsets, reader="pyiceberg"
            )
            result["writers"][w.name] = {
                "writer_id": w.writer_id,
                "topic": w.topic,
                "audit_ok": report.ok,
                "audit_problems": report.problems,
                "audit_readers": report.readers,
                "commits": report.commits,
                **counted,
                "driver_runs": w.runs,
                "driver_ends": dict(w.exits),
            }
            if not report.ok:
                self.problems.append(f"{w.name}: audit: {report.problems}")
            totals.update({k: v for k, v in counted.items() if isinstance(v, int)})
            self.faults["task-failure"] += w.task_faults
        result.update(
            self.summed(totals, rows_key="rows_pyiceberg"),
            snapshots=len(table.pyiceberg.metadata.snapshots),
        )
        return result

    def summed(self, totals: Counter[str], *, rows_key: str) -> dict[str, int]:
        """The whole run's figures from the writers' `count_against_kafka` counts summed;
        `rows_key`: the count of the reader whose rows are the table's."""
        assert self.producer is not None
        return {
            "records_produced": self.producer.acked_count,
            "records_in_kafka": totals["kafka_records"],
            "records_in_table": totals[rows_key],
            **{
                k: totals[k]
                for k in (
                    "duplicates",
                    "missing",
                    "rows_not_in_kafka",
                    "acked_events_missing",
                    "acked_events_lost_by_broker",
                    "offsets_rewritten_by_broker",
                )
            },
            "producer_failed_deliveries": self.producer.failed,
        }

    def count_against_kafka(
        self, w: Writer, rows: Any, committed_offsets: Any, *, reader: str, id_rows: Any = None
    ) -> dict[str, Any]:
        """The writer's rows against Kafka's logs and the events the producer saw acknowledged;
        problems are recorded. `rows` (kafka_topic, kafka_partition, kafka_offset, ...) are what
        `reader` read: duplicates and gaps are counted on them; `id_rows` (the same coordinates
        plus event_id; default `rows`) tell which acknowledged events the table holds."""
        from lakesink.kafka.client import OffsetClient
        from lakesink.protocol.offsets import TopicPartition

        assert self.producer is not None
        bootstrap = self.broker.bootstrap_servers
        parts = [TopicPartition(w.topic, p) for p in range(self.args.partitions)]
        with OffsetClient(bootstrap) as client:
            hw = {tp: hi for tp, (_lo, hi) in client.watermarks(parts).items()}
        kafka_at = kafka_records(bootstrap, parts, hw)
        in_kafka = set(kafka_at)
        kafka_ids = {i for i in kafka_at.values() if i is not None}
        coords = [
            (t, int(p), int(o))
            for t, p, o in zip(*(rows.column(i).to_pylist() for i in range(3)), strict=True)
            if t == w.topic
        ]
        counts = Counter(coords)
        id_source = rows if id_rows is None else id_rows
        with_ids = [
            (int(p), int(o), e)
            for t, p, o, e in zip(*(id_source.column(i).to_pylist() for i in range(4)), strict=True)
            if t == w.topic
        ]
        table_ids = {e for *_, e in with_ids}
        # an offset whose record the broker replaced after lakesink read it (noida-db can lose
        # acked records over a restart and give their offsets to later ones): the table holds
        # what the broker served there; the new record is the broker's loss to report
        rewritten = {now for p, o, e in with_ids if (now := kafka_at.get((w.topic, p, o), e)) != e}
        committed = committed_offsets(w.writer_id)
        behind = {
            tp.key(): (committed.get(tp) or 0, hw[tp])
            for tp in parts
            if (committed.get(tp) or 0) != hw[tp]
        }
        acked = self.producer.acked[w.topic]
        # acknowledged by the broker but not in its log (noida-db can lose acked records over a
        # restart): not lakesink's loss, reported apart
        broker_lost = len(acked - kafka_ids)
        acked_missing = len((acked & kafka_ids) - table_ids - rewritten)
        out = {
            "kafka_records": len(in_kafka),
            "acked_events": len(acked),
            f"rows_{reader}": len(coords),
            "duplicates": sum(n - 1 for n in counts.values() if n > 1),
            "missing": len(in_kafka - set(counts)),
            "rows_not_in_kafka": len(set(counts) - in_kafka),
            "acked_events_missing": acked_missing,
            "acked_events_lost_by_broker": broker_lost,
            "offsets_rewritten_by_broker": len(rewritten),
            "not_caught_up": behind,
        }
        if behind:
            self.problems.append(f"{w.name}: committed offsets are not at the end: {behind}")
        if acked_missing:
            self.problems.append(f"{w.name}: {acked_missing} acknowledged events missing")
        if self.args.broker == "kafka" and (broker_lost or rewritten):
            self.problems.append(
                f"{w.name}: Apache Kafka lost {broker_lost} acknowledged events and replaced "
                f"the records at {len(rewritten)} offsets"
            )
        if rewritten:
            self.warnings.append(
                f"{w.name}: the broker replaced the records at {len(rewritten)} offsets after "
                "lakesink read them (the table holds what it served there)"
            )
        return out

    def audit_hudi(self) -> dict[str, Any]:
        """Each writer: lakesink's audit (hudi-rs and lakesink's reader against Kafka), and this
        script's own count of the hudi-rs rows against Kafka's logs and the acked events."""
        from lakesink.formats.hudi import writer_state as commit_state
        from lakesink.formats.hudi.audit import audit, read_with_hudi_rs
        from lakesink.formats.hudi.table.hudi_table import HudiTable
        from lakesink.formats.hudi.table.reader import TableReader

        assert self.producer is not None
        bootstrap = self.broker.bootstrap_servers
        table = HudiTable.open(self.table)
        rows_rs = read_with_hudi_rs(str(self.table))
        own = TableReader(table).snapshot(
            columns=["kafka_topic", "kafka_partition", "kafka_offset", "event_id"]
        )
        result: dict[str, Any] = {"writers": {}}
        totals: Counter[str] = Counter()
        for w in self.writers:
            report = audit(str(self.table), w.writer_id, bootstrap=bootstrap)
            counted = self.count_against_kafka(
                w,
                rows_rs,
                lambda writer_id: commit_state.committed_offsets(table, writer_id),
                reader="hudi_rs",
                id_rows=own,
            )
            rows_lakesink = own.column("kafka_topic").to_pylist().count(w.topic)
            if rows_lakesink != counted["rows_hudi_rs"]:
                self.problems.append(
                    f"{w.name}: hudi-rs read {counted['rows_hudi_rs']} rows, lakesink's reader "
                    f"{rows_lakesink}"
                )
            result["writers"][w.name] = {
                "writer_id": w.writer_id,
                "topic": w.topic,
                "audit_ok": report.ok,
                "audit_problems": report.problems,
                "commits": report.commits,
                **counted,
                "rows_lakesink": rows_lakesink,
                "driver_runs": w.runs,
                "driver_ends": dict(w.exits),
            }
            if not report.ok:
                self.problems.append(f"{w.name}: audit: {report.problems}")
            totals.update({k: v for k, v in counted.items() if isinstance(v, int)})
            self.faults["task-failure"] += w.task_faults
        pending = table.timeline().inflight_or_requested()
        result.update(
            self.summed(totals, rows_key="rows_hudi_rs"),
            pending_instants_left=[str(i) for i in pending],
            completed_commits=len(table.timeline().completed()),
        )
        return result


def kafka_records(
    bootstrap: str, parts: list[Any], hw: dict[Any, int]
) -> dict[tuple[str, int, int], int | None]:
    """Every record in Kafka's logs [0, high watermark): coordinates -> event id (the key)."""
    from lakesink.kafka.deserializers import make_deserializer
    from lakesink.kafka.reader import read_range
    from lakesink.protocol.offsets import OffsetRange

    out: dict[tuple[str, int, int], int | None] = {}
    raw = make_deserializer("raw")
    for tp in parts:
        for batch in read_range(bootstrap, OffsetRange(tp, 0, hw[tp]), deserializer=raw):
            offsets = batch.column("kafka_offset").to_pylist()
            keys = batch.column("kafka_key").to_pylist()
            for o, k in zip(offsets, keys, strict=True):
                out[(tp.topic, tp.partition, int(o))] = None if k is None else int(k)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, required=True, help="how long to inject faults")
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--broker",
        choices=("kafka", "noida"),
        default="kafka",
        help="the local broker: Apache Kafka (scripts/setup-kafka.sh) or noida-db",
    )
    p.add_argument("--second-writer", action="store_true")
    p.add_argument(
        "--format",
        choices=("hudi", "iceberg"),
        default="hudi",
        help="table.format of the soaked table",
    )
    p.add_argument(
        "--services-every",
        type=int,
        default=0,
        help="run inline clean, cluster and archive every N commits (0: no table services)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.add_argument("--rate", type=float, default=200.0, help="events per second per topic")
    p.add_argument("--max-batch", type=int, default=3000, help="kafka.max.records.per.batch")
    p.add_argument(
        "--fault-interval",
        type=float,
        nargs=2,
        default=(2.0, 6.0),
        metavar=("MIN_S", "MAX_S"),
        help="seconds between faults, uniformly random",
    )
    p.add_argument("--crash-step-prob", type=float, default=0.3)
    p.add_argument("--task-fail-prob", type=float, default=0.15)
    p.add_argument("--stall-s", type=float, default=300.0)
    p.add_argument(
        "--broker-restart-gap-s",
        type=float,
        default=25.0,
        help="at least this many seconds between broker restarts",
    )
    p.add_argument(
        "--patience-s",
        type=float,
        default=90.0,
        help="a driver is killed only after its first batch or after this many seconds",
    )
    p.add_argument("--final-timeout-s", type=float, default=600.0)
    p.add_argument("--workdir", default=None)
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument(
        "--snapshot-code",
        action="store_true",
        help="run the drivers on `git archive HEAD lakesink` (stable while the tree changes)",
    )
    args = p.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    soak = Soak(args)
    started = time.monotonic()
    log(f"seed {args.seed}, {args.minutes} min, {args.partitions} partitions")
    result: dict[str, Any] = {}
    try:
        soak.setup()
        soak.loop()
        result = soak.finish()
    finally:
        for w in soak.writers:
            if w.alive():
                w.kill()
        if soak.broker is not None:
            soak.broker.kill()
    result.update(
        seed=args.seed,
        minutes=args.minutes,
        partitions=args.partitions,
        broker=args.broker,
        second_writer=args.second_writer,
        seconds=round(time.monotonic() - started, 1),
        faults=dict(sorted(soak.faults.items())),
        faults_total=sum(soak.faults.values()),
        python_workers_killed=dict(soak.worker_kinds),
        problems=soak.problems,
        warnings=soak.warnings,
        workdir=str(soak.workdir),
        code_commit=soak.code_commit,
    )
    ok = (
        not soak.problems
        and result.get("duplicates") == 0
        and result.get("missing") == 0
        and result.get("acked_events_missing") == 0
    )
    result["ok"] = ok
    print(json.dumps(result, indent=2))
    print(
        f"soak {'PASSED' if ok else 'FAILED'}: {result['seconds']}s, "
        f"{result['faults_total']} faults {result['faults']}, "
        f"produced {result.get('records_produced')}, in table {result.get('records_in_table')}, "
        f"duplicates {result.get('duplicates')}, missing {result.get('missing')}, "
        f"acked events lost by the broker {result.get('acked_events_lost_by_broker')}",
        flush=True,
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if ok and not args.keep and not args.workdir:
        shutil.rmtree(soak.workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
