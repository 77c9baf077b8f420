"""The test side of a long-lived Spark session in another Python (tests/interop/java_*.py).

A setup script (scripts/setup-*.sh) builds that Python and the jars once, cached under
$LAKESINK_CACHE; `JvmSession` starts a server script there (its protocol in
tests/interop/jvm_server.py), sends it batches of operations as JSON lines and reads one JSON
reply a batch. Rows come back as Parquet under a work folder and are returned as Arrow tables.
A missing piece of the environment raises, never skips.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    return Path(os.environ.get("LAKESINK_CACHE", REPO / ".cache"))


def ensure_environment(
    script: str, venv: str, jars: str, error: type[Exception]
) -> tuple[Path, list[Path]]:
    """Run scripts/`script` (fast when cached); the Python of `venv` and the jars of `jars`
    under the cache, or `error` when either is missing."""
    subprocess.run(["bash", str(REPO / "scripts" / script)], check=True)
    python = cache_dir() / venv / "bin" / "python"
    found = sorted((cache_dir() / jars).glob("*.jar"))
    if not python.exists() or not found:
        raise error(f"{script} left its environment incomplete under {cache_dir()}")
    return python, found


def java_17_home() -> Path | None:
    """The Java 17 the interop session runs on: $LAKESINK_INTEROP_JAVA_HOME, else a Java 17
    under /usr/lib/jvm, else None (the java on PATH)."""
    named = os.environ.get("LAKESINK_INTEROP_JAVA_HOME")
    if named:
        return Path(named)
    found = sorted(Path("/usr/lib/jvm").glob("java-17-openjdk*"))
    return found[0] if found else None


class JvmSession:
    """One server script in its own Python; `what` names it in errors, `error` is the class
    raised and returned for the JVM's failures."""

    def __init__(
        self,
        what: str,
        error: type[Exception],
        python: Path,
        server: Path,
        args: list[str],
        start_timeout_s: float,
    ) -> None:
        self._what = what
        self._error = error
        self._work = Path(tempfile.mkdtemp(prefix=f"lakesink-{what.lower().replace(' ', '-')}-"))
        self._n = 0
        self._lock = threading.Lock()
        self._stderr_path = self._work / "server.log"
        self._stderr = self._stderr_path.open("wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_"))}
        env["PYTHONUNBUFFERED"] = "1"
        java_home = java_17_home()
        if java_home is not None:
            env["JAVA_HOME"] = str(java_home)
        env.pop("VIRTUAL_ENV", None)
        self._proc = subprocess.Popen(
            [str(python), str(server), *(a.replace("{work}", str(self._work)) for a in args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            text=True,
            cwd=self._work,
        )
        self.hello = self._reply(start_timeout_s)
        self.spark_version = str(self.hello["spark"])

    def _reply(self, timeout_s: float) -> dict[str, Any]:
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(_readline(self._proc.stdout)))
        reader.start()
        reader.join(timeout_s)
        if not box or not box[0]:
            raise self._error(
                f"{self._what} server gave no reply in {timeout_s:.0f}s (exit "
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

    def _call_one(self, op: dict[str, Any], timeout_s: float, trace: bool = True) -> dict[str, Any]:
        """One operation; its reply, or the JVM's error raised (with its trace unless `trace`
        is false)."""
        (res,) = self._call([op], timeout_s)
        if not res["ok"]:
            raise self._failure(res, trace)
        return res

    def _failure(self, res: dict[str, Any], trace: bool = True) -> Exception:
        if not trace:
            return self._error(str(res["error"]))
        return self._error(f"{res['error']}\n{res.get('trace', '')}")

    def _next_path(self, stem: str) -> Path:
        self._n += 1
        return self._work / f"{stem}-{self._n}"

    def _rows(self, ops: list[dict[str, Any]], timeout_s: float) -> list[pa.Table | Exception]:
        """Operations that each write rows under their "out" folder, in one round trip; each
        result is the rows or the JVM's error."""
        results: list[pa.Table | Exception] = []
        for op, res in zip(ops, self._call(ops, timeout_s), strict=True):
            out = Path(op["out"])
            results.append(self._read_rows(out) if res["ok"] else self._failure(res))
            shutil.rmtree(out, ignore_errors=True)
        return results

    def _read_rows(self, out: Path) -> pa.Table:
        files = sorted(out.glob("*.parquet"))
        if not files:
            raise self._error(f"{self._what} wrote no Parquet under {out}")
        tables = [pq.read_table(f) for f in files]
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]

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


def _readline(stream: IO[str] | None) -> str:
    assert stream is not None
    return stream.readline()
