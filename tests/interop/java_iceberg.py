"""Read Iceberg tables with Java Iceberg (Spark 4.1 with Iceberg's Spark runtime) from tests.

The environment (scripts/setup-iceberg-reader.sh) is the peers' Python with pyspark 4.1 plus
Iceberg's runtime jar and the SQLite JDBC driver; `JavaIceberg` starts
tests/interop/java_iceberg_server.py there once and sends it batches of reads, so many tables
are read in one Spark session. Spark opens lakesink's SQL catalog (a SQLite file) through
Iceberg's JdbcCatalog. A missing piece of the environment raises, never skips.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from interop.java_hudi import _java_17_home, _read_result, _readline, cache_dir

REPO = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).resolve().parent / "java_iceberg_server.py"


class JavaIcebergError(RuntimeError):
    """Spark or Iceberg rejected a request; the message is the JVM's."""


@dataclass(frozen=True)
class IcebergRead:
    """`spark.read.format("iceberg").options(options).load(table)`."""

    table: str
    options: Mapping[str, str] = field(default_factory=dict)


def ensure_environment() -> tuple[Path, list[Path]]:
    """Run scripts/setup-iceberg-reader.sh (fast when cached); the Python and the jars."""
    subprocess.run(["bash", str(REPO / "scripts" / "setup-iceberg-reader.sh")], check=True)
    python = cache_dir() / "peers-venv" / "bin" / "python"
    jars = sorted((cache_dir() / "iceberg-jars").glob("*.jar"))
    if not python.exists() or not jars:
        raise JavaIcebergError(f"Iceberg reader environment incomplete under {cache_dir()}")
    return python, jars


class JavaIceberg:
    """One long-lived Spark session with Iceberg in a subprocess."""

    def __init__(self, start_timeout_s: float = 240) -> None:
        python, jars = ensure_environment()
        self._work = Path(tempfile.mkdtemp(prefix="lakesink-java-iceberg-"))
        self._n = 0
        self._lock = threading.Lock()
        self._stderr_path = self._work / "server.log"
        self._stderr = self._stderr_path.open("wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_"))}
        env["PYTHONUNBUFFERED"] = "1"
        java_home = _java_17_home()
        if java_home is not None:
            env["JAVA_HOME"] = str(java_home)
        env.pop("VIRTUAL_ENV", None)
        self._proc = subprocess.Popen(
            [str(python), str(SERVER), ",".join(str(j) for j in jars)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            text=True,
            cwd=self._work,
        )
        self.spark_version = str(self._reply(start_timeout_s)["spark"])

    def _reply(self, timeout_s: float) -> dict[str, Any]:
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(_readline(self._proc.stdout)))
        reader.start()
        reader.join(timeout_s)
        if not box or not box[0]:
            raise JavaIcebergError(
                f"Java Iceberg server gave no reply in {timeout_s:.0f}s (exit "
                f"{self._proc.poll()}); log tail:\n{self.log_tail()}"
            )
        return dict(json.loads(box[0]))

    def log_tail(self, chars: int = 6000) -> str:
        self._stderr.flush()
        return self._stderr_path.read_text(errors="replace")[-chars:]

    def _call(self, ops: list[dict[str, Any]], timeout_s: float) -> list[dict[str, Any]]:
        with self._lock:
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps({"ops": ops}) + "\n")
            self._proc.stdin.flush()
            return list(self._reply(timeout_s)["results"])

    def register_catalog(self, name: str, sqlite_file: Path, warehouse: str) -> None:
        """Open lakesink's SQL catalog `name` (a SQLite file) as Spark catalog `name`."""
        op = {
            "op": "catalog",
            "name": name,
            "uri": f"jdbc:sqlite:{sqlite_file}",
            "warehouse": warehouse,
        }
        (res,) = self._call([op], 60)
        if not res["ok"]:
            raise JavaIcebergError(str(res["error"]))

    def run(
        self, reads: Sequence[IcebergRead], timeout_s: float = 600
    ) -> list[pa.Table | JavaIcebergError]:
        """Every read in one round trip; each result is the rows or the JVM's error."""
        ops, outs = [], []
        for r in reads:
            self._n += 1
            out = self._work / f"out-{self._n}"
            outs.append(out)
            ops.append(
                {"op": "read", "table": r.table, "options": dict(r.options), "out": str(out)}
            )
        results: list[pa.Table | JavaIcebergError] = []
        for out, res in zip(outs, self._call(ops, timeout_s), strict=True):
            if not res["ok"]:
                results.append(JavaIcebergError(f"{res['error']}\n{res.get('trace', '')}"))
                continue
            results.append(_read_result(out))
            shutil.rmtree(out, ignore_errors=True)
        return results

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()
        shutil.rmtree(self._work, ignore_errors=True)
