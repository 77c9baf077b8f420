"""The peers of the throughput benchmark, run from `run.py` beside lakesink on the same topic,
broker and cores, each in its own Python (scripts/setup-peers.sh builds them once, cached under
$LAKESINK_CACHE, default .cache/):

- `delta`: Spark 4.1 Structured Streaming, spark-sql-kafka-0-10 → Delta Lake (delta-spark);
- `parquet`: the same into Spark's Parquet file sink (Spark's at-least-once baseline);
- `hudi-insert`, `hudi-bulk_insert`: Spark 3.5 Structured Streaming, spark-sql-kafka-0-10 → Hudi
  1.2.0's streaming sink, copy-on-write (Hudi Streamer needs hudi-utilities, which Maven Central
  does not serve for Hudi 1.2.0: see jvm/peers/hudi/pom.xml).

`kill_and_audit` is the correctness column: the writer is SIGKILLed (its whole process group)
mid-batch, restarted on the same checkpoint/table, and its table's Kafka coordinates are counted
against the topic's end offsets (duplicates, missing).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peer_job import count_coordinates

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PEERS = ("delta", "parquet", "hudi-insert", "hudi-bulk_insert")
LABELS = {
    "delta": "Spark SS → Delta",
    "parquet": "Spark SS → Parquet",
    "hudi-insert": "Hudi sink insert",
    "hudi-bulk_insert": "Hudi sink bulk_insert",
}


@dataclass(frozen=True)
class PeerEnv:
    python: str
    jars: tuple[str, ...]
    spark_line: str

    @staticmethod
    def for_mode(mode: str) -> PeerEnv:
        cache = Path(os.environ.get("LAKESINK_CACHE", REPO / ".cache"))
        if mode.startswith("hudi"):
            jars = sorted(
                str(p) for d in ("hudi-jars", "peers-hudi-jars") for p in (cache / d).glob("*.jar")
            )
            return PeerEnv(str(cache / "interop-venv/bin/python"), tuple(jars), "3.5")
        jars = sorted(str(p) for p in (cache / "peers-jars").glob("*.jar"))
        return PeerEnv(str(cache / "peers-venv/bin/python"), tuple(jars), "4.1")


def ensure_envs() -> dict[str, Any]:
    """Build the peers' environments if they are not cached yet; return their versions."""
    subprocess.run(["bash", str(REPO / "scripts/setup-peers.sh")], check=True)
    versions: dict[str, Any] = {}
    for mode in ("delta", "hudi-insert"):
        env = PeerEnv.for_mode(mode)
        out = subprocess.run(
            [env.python, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        wanted = {"pyspark", "delta-spark", "deltalake", "pyarrow"}
        pkgs = {p["name"]: p["version"] for p in json.loads(out) if p["name"] in wanted}
        versions[f"spark {env.spark_line} env"] = {
            "python packages": pkgs,
            "jars": [Path(j).name for j in env.jars],
        }
    return versions


def peer_cmd(mode: str, cfg: dict[str, Any]) -> list[str]:
    env = PeerEnv.for_mode(mode)
    return [
        env.python,
        str(HERE / "peer_job.py"),
        "run",
        mode,
        json.dumps(cfg | {"jars": env.jars}),
    ]


def peer_config(
    mode: str,
    bootstrap: str,
    topic: str,
    ends: dict[int, int],
    per_batch: int,
    cores: int,
    out: Path,
) -> dict[str, Any]:
    from lakesink.kafka.producer import SAMPLE_EVENT_DDL

    return {
        "bootstrap": bootstrap,
        "topic": topic,
        "ends": {str(p): n for p, n in ends.items()},
        "per_batch": per_batch,
        "master": f"local[{cores}]",
        "value_ddl": SAMPLE_EVENT_DDL,
        "path": str(out / "table"),
        "checkpoint": str(out / "checkpoint"),
    }


def kill_and_audit(
    cmd: list[str],
    log_dir: Path,
    audit: Any,
    kill_after_batches: int = 2,
    restarts: int = 3,
) -> dict[str, Any]:
    """Run `cmd` until it printed `kill_after_batches` BENCH-BATCH lines, then, half a batch
    later, SIGKILL its process group; run it again to the end; `audit()` the table."""
    log_dir.mkdir(parents=True, exist_ok=True)
    first_log = log_dir / "first.log"
    with first_log.open("w") as log:
        first = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True
        )
        assert first.stdout is not None
        seen: list[float] = []
        killed_at = None
        for line in first.stdout:
            log.write(line)
            if line.startswith("BENCH-BATCH"):
                seen.append(time.time())
                if len(seen) >= kill_after_batches:
                    gap = seen[-1] - seen[-2] if len(seen) > 1 else 2.0
                    time.sleep(max(0.2, gap / 2))
                    os.killpg(first.pid, signal.SIGKILL)
                    killed_at = time.time()
                    break
            if line.startswith("BENCH-RESULT"):
                break
        first.wait()
    if killed_at is None:
        raise RuntimeError(f"the writer finished before it could be killed (see {first_log})")
    # A writer whose restart fails is started again, as a supervisor would, up to `restarts`
    # times; each failure's cause is kept. (Spark 4.1.1's Kafka source fails the first batch
    # after such a restart in progress reporting, after the batch committed: SPARK-55271.)
    failures: list[str] = []
    t0 = time.time()
    for attempt in range(1, restarts + 1):
        with (log_dir / f"restart-{attempt}.log").open("w+") as log:
            code = subprocess.run(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            ).returncode
            if code == 0:
                break
            log.seek(0)
            failures.append(_cause(log.read()))
    else:
        raise RuntimeError(f"{restarts} restarts after SIGKILL failed: {failures}")
    res = dict(audit())
    res["killed_after_batches"] = len(seen)
    res["restart_s"] = round(time.time() - t0, 1)
    res["failed_restarts"] = failures
    return res


def _cause(log_text: str) -> str:
    """The first line naming an exception in a failed run's output."""
    for line in log_text.splitlines():
        if "Exception" in line or "Error:" in line:
            return line.strip()[:400]
    return log_text.strip().splitlines()[-1][:400] if log_text.strip() else "no output"


def audit_with_peer_python(mode: str, path: Path, ends: dict[int, int]) -> dict[str, Any]:
    env = PeerEnv.for_mode("delta")
    out = subprocess.run(
        [env.python, str(HERE / "peer_job.py"), "audit", mode, str(path), json.dumps(ends)],
        capture_output=True,
        text=True,
    )
    for line in out.stdout.splitlines():
        if line.startswith("BENCH-RESULT "):
            return json.loads(line[len("BENCH-RESULT ") :])  # type: ignore[no-any-return]
    raise RuntimeError(f"audit of {path} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")


def audit_hudi(path: Path, ends: dict[int, int]) -> dict[str, Any]:
    """Count a Hudi table's Kafka coordinates with hudi-rs (lakesink's tables and Hudi's own)."""
    import hudi
    import pyarrow as pa

    table = hudi.HudiTableBuilder.from_base_uri(str(path)).build()
    batches = table.read()
    t = pa.Table.from_batches(batches) if batches else None
    parts = t["kafka_partition"].to_pylist() if t is not None else []
    offs = t["kafka_offset"].to_pylist() if t is not None else []
    res = count_coordinates(parts, offs, ends)
    return {"format": "hudi", "reader": f"hudi-rs {hudi.__version__}", **res}


def audit_for(mode: str, out: Path, ends: dict[int, int]) -> dict[str, Any]:
    if mode in ("delta", "parquet"):
        return audit_with_peer_python(mode, out / "table", ends)
    return audit_hudi(out / "table", ends)
