"""Read tables with Java Hudi (Spark with the Hudi bundle) from tests.

The interop environment (scripts/setup-interop.sh) is a second Python with pyspark 3.5 and the
Hudi Spark bundle; `JavaHudi` starts tests/interop/java_hudi_server.py there once and sends it
batches of reads, so many tables are read in one Spark session. Rows come back as Parquet and
are returned as Arrow tables. A missing piece of the environment raises, never skips.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from interop.jvm_session import REPO, JvmSession, cache_dir, java_17_home
from interop.jvm_session import ensure_environment as _ensure

__all__ = ["REPO", "JavaHudi", "JavaHudiError", "Read", "Sql", "cache_dir", "java_17_home"]

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


def ensure_environment() -> tuple[Path, list[Path]]:
    """Run scripts/setup-interop.sh (fast when cached); return the interop Python and the jars."""
    return _ensure("setup-interop.sh", "interop-venv", "hudi-jars", JavaHudiError)


class JavaHudi(JvmSession):
    """One long-lived Java Hudi session in a subprocess."""

    def __init__(self, start_timeout_s: float = 240) -> None:
        python, jars = ensure_environment()
        args = [",".join(str(j) for j in jars), "{work}/wh"]
        super().__init__("Java Hudi", JavaHudiError, python, SERVER, args, start_timeout_s)
        self.java_version = str(self.hello["java"])

    def run(
        self, requests: Sequence[Read | Sql], timeout_s: float = 600
    ) -> list[pa.Table | JavaHudiError]:
        """Send every request in one round trip; each result is the rows or the JVM's error."""
        ops = []
        for r in requests:
            out = str(self._next_path("out"))
            if isinstance(r, Read):
                ops.append(
                    {"op": "read", "path": location(r.path), "options": dict(r.options), "out": out}
                )
            else:
                ops.append({"op": "sql", "statements": list(r.statements), "out": out})
        return self._rows(ops, timeout_s)  # type: ignore[return-value]

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
        source = self._next_path("in").with_suffix(".parquet")
        pq.write_table(rows, source)
        op = {"source": str(source), "path": location(path), "options": dict(options)}
        self._call_one({"op": "write", **op, "mode": mode}, 600)

    def time_read(
        self, path: Path | str, options: Mapping[str, str] | None = None, repeat: int = 3
    ) -> tuple[list[float], int]:
        """Seconds of each of `repeat` full reads (every row materialised in the JVM) and the
        row count."""
        op = {"op": "time", "path": location(path), "options": dict(options or {})}
        res = self._call_one({**op, "repeat": repeat}, 1800)
        return [float(s) for s in res["seconds"]], int(res["rows"])

    def pending_clustering(self, path: Path | str) -> dict[str, set[tuple[str, str]]]:
        """Java Hudi's view of the pending clustering plans (ClusteringUtils): instant time ->
        (partition path, file id) of each file group the plan rewrites."""
        op = {"op": "pending_clustering", "path": location(path)}
        res = self._call_one(op, 600)
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
        self._call_one(op, 60, trace=False)


def location(path: Path | str) -> str:
    """A URI (`s3a://bucket/prefix`, `file:///...`) unchanged; a local path made absolute."""
    if isinstance(path, str) and "://" in path:
        return path
    return str(Path(path).resolve())
