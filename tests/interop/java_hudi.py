"""Read tables with Java Hudi (Spark with the Hudi bundle) from tests.

The interop environment (scripts/setup-interop.sh) is a second Python with pyspark 3.5 and the
Hudi Spark bundle; `JavaHudi` starts tests/interop/java_hudi_server.py there once and sends it
batches of reads, so many tables are read in one Spark session. Rows come back as Parquet and
are returned as Arrow tables. A missing piece of the environment raises, never skips.
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
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).resolve().parent / "java_hudi_server.py"


class JavaHudiError(RuntimeError):
    """Java Hudi rejected a read or write; the message is the JVM's."""


@dataclass(frozen=True)
class Read:
    """One Java Hudi read: `spark.read.format("hudi").options(options).load(path)`; the path
    is a local one or a URI such as `s3a://bucket/prefix` (see `JavaHudi.configure_s3a`)."""

    path: Path | str
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Sql:
    """Spark SQL statements run in order; the last one's rows are returned."""

    statements: Sequence[str]


def cache_dir() -> Path:
    return Path(os.environ.get("LAKESINK_CACHE", REPO / ".cache"))


def ensure_environment() -> tuple[Path, list[Path]]:
    """Run scripts/setup-interop.sh (fast when cached); return the interop Python and the jars."""
    subprocess.run(["bash", str(REPO / "scripts" / "setup-interop.sh")], check=True)
    python = cache_dir() / "interop-venv" / "bin" / "python"
    jars = sorted((cache_dir() / "hudi-jars").glob("*.jar"))
    if not python.exists() or not jars:
        raise JavaHudiError(f"interop environment incomplete under {cache_dir()}")
    return python, jars


class JavaHudi:
    """One long-lived Java Hudi session in a subprocess."""

    def __init__(self, start_timeout_s: float = 240) -> None:
        python, jars = ensure_environment()
        self._work = Path(tempfile.mkdtemp(prefix="lakesink-java-hudi-"))
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
            [str(python), str(SERVER), ",".join(str(j) for j in jars), str(self._work / "wh")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            text=True,
            cwd=self._work,
        )
        hello = self._reply(start_timeout_s)
        self.spark_version = str(hello["spark"])
        self.java_version = str(hello["java"])

    def _reply(self, timeout_s: float) -> dict[str, Any]:
        assert self._proc.stdout is not None
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(_readline(self._proc.stdout)))
        reader.start()
        reader.join(timeout_s)
        if not box or not box[0]:
            raise JavaHudiError(
                f"Java Hudi server gave no reply in {timeout_s:.0f}s (exit {self._proc.poll()}); "
                f"log tail:\n{self.log_tail()}"
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

    def run(
        self, requests: Sequence[Read | Sql], timeout_s: float = 600
    ) -> list[pa.Table | JavaHudiError]:
        """Send every request in one round trip; each result is the rows or the JVM's error."""
        ops, outs = [], []
        for r in requests:
            self._n += 1
            out = self._work / f"out-{self._n}"
            outs.append(out)
            if isinstance(r, Read):
                ops.append(
                    {
                        "op": "read",
                        "path": location(r.path),
                        "options": dict(r.options),
                        "out": str(out),
                    }
                )
            else:
                ops.append({"op": "sql", "statements": list(r.statements), "out": str(out)})
        results: list[pa.Table | JavaHudiError] = []
        for out, res in zip(outs, self._call(ops, timeout_s), strict=True):
            if not res["ok"]:
                results.append(JavaHudiError(f"{res['error']}\n{res.get('trace', '')}"))
                continue
            results.append(_read_result(out))
            shutil.rmtree(out, ignore_errors=True)
        return results

    def read(self, path: Path | str, options: Mapping[str, str] | None = None) -> pa.Table:
        (res,) = self.run([Read(path, options or {})])
        if isinstance(res, JavaHudiError):
            raise res
        return res

    def sql(self, *statements: str) -> pa.Table:
        (res,) = self.run([Sql(statements)])
        if isinstance(res, JavaHudiError):
            raise res
        return res

    def write(
        self, rows: pa.Table, path: Path | str, options: Mapping[str, str], mode: str = "append"
    ) -> None:
        """Write `rows` to the Hudi table at `path` with Java Hudi (`df.write.format("hudi")`)."""
        self._n += 1
        source = self._work / f"in-{self._n}.parquet"
        pq.write_table(rows, source)
        (res,) = self._call(
            [
                {
                    "op": "write",
                    "source": str(source),
                    "path": location(path),
                    "options": dict(options),
                    "mode": mode,
                }
            ],
            600,
        )
        if not res["ok"]:
            raise JavaHudiError(f"{res['error']}\n{res.get('trace', '')}")

    def time_read(
        self, path: Path | str, options: Mapping[str, str] | None = None, repeat: int = 3
    ) -> tuple[list[float], int]:
        """Seconds of each of `repeat` full reads (every row materialised in the JVM) and the
        row count."""
        op = {"op": "time", "path": location(path), "options": dict(options or {})}
        (res,) = self._call([{**op, "repeat": repeat}], 1800)
        if not res["ok"]:
            raise JavaHudiError(f"{res['error']}\n{res.get('trace', '')}")
        return [float(s) for s in res["seconds"]], int(res["rows"])

    def pending_clustering(self, path: Path | str) -> dict[str, set[tuple[str, str]]]:
        """Java Hudi's view of the pending clustering plans (ClusteringUtils): instant time ->
        (partition path, file id) of each file group the plan rewrites."""
        op = {"op": "pending_clustering", "path": location(path)}
        (res,) = self._call([op], 600)
        if not res["ok"]:
            raise JavaHudiError(f"{res['error']}\n{res.get('trace', '')}")
        return {t: {(p, f) for p, f in groups} for t, groups in res["plans"].items()}

    def configure_s3a(
        self, bucket: str, endpoint: str, access_key: str, secret_key: str, region: str
    ) -> None:
        """Read and write `s3a://bucket/...` at an S3-compatible `endpoint` (path-style access,
        plain http for an http:// URL) with these credentials; they go to the JVM on its stdin
        and are never logged."""
        op = {
            "op": "s3a",
            "bucket": bucket,
            "endpoint": endpoint,
            "region": region,
            "access_key": access_key,
            "secret_key": secret_key,
        }
        (res,) = self._call([op], 60)
        if not res["ok"]:
            raise JavaHudiError(str(res["error"]))

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


def location(path: Path | str) -> str:
    """A URI (`s3a://bucket/prefix`, `file:///...`) unchanged; a local path made absolute."""
    if isinstance(path, str) and "://" in path:
        return path
    return str(Path(path).resolve())


def _java_17_home() -> Path | None:
    """The Java 17 the interop session runs on: $LAKESINK_INTEROP_JAVA_HOME, else a Java 17
    under /usr/lib/jvm, else None (the java on PATH)."""
    named = os.environ.get("LAKESINK_INTEROP_JAVA_HOME")
    if named:
        return Path(named)
    found = sorted(Path("/usr/lib/jvm").glob("java-17-openjdk*"))
    return found[0] if found else None


def _readline(stream: IO[str] | None) -> str:
    assert stream is not None
    return stream.readline()


def _read_result(out: Path) -> pa.Table:
    files = sorted(out.glob("*.parquet"))
    if not files:
        raise JavaHudiError(f"Java Hudi wrote no Parquet under {out}")
    tables = [pq.read_table(f) for f in files]
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
