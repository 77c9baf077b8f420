"""Read Iceberg tables with Java Iceberg (Spark 4.1 with Iceberg's Spark runtime) from tests.

The environment (scripts/setup-iceberg-reader.sh) is the peers' Python with pyspark 4.1 plus
Iceberg's runtime jar and the SQLite JDBC driver; `JavaIceberg` starts
tests/interop/java_iceberg_server.py there once and sends it batches of reads, so many tables
are read in one Spark session. Spark opens lakesink's SQL catalog (a SQLite file) through
Iceberg's JdbcCatalog. A missing piece of the environment raises, never skips.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from interop.jvm_session import REPO, JvmSession
from interop.jvm_session import ensure_environment as _ensure

__all__ = ["REPO", "IcebergRead", "JavaIceberg", "JavaIcebergError"]

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
    return _ensure("setup-iceberg-reader.sh", "peers-venv", "iceberg-jars", JavaIcebergError)


class JavaIceberg(JvmSession):
    """One long-lived Spark session with Iceberg in a subprocess."""

    def __init__(self, start_timeout_s: float = 240) -> None:
        python, jars = ensure_environment()
        args = [",".join(str(j) for j in jars)]
        super().__init__("Java Iceberg", JavaIcebergError, python, SERVER, args, start_timeout_s)

    def register_catalog(self, name: str, sqlite_file: Path, warehouse: str) -> None:
        """Open lakesink's SQL catalog `name` (a SQLite file) as Spark catalog `name`."""
        op = {
            "op": "catalog",
            "name": name,
            "uri": f"jdbc:sqlite:{sqlite_file}",
            "warehouse": warehouse,
        }
        self._call_one(op, 60, trace=False)

    def run(
        self, reads: Sequence[IcebergRead], timeout_s: float = 600
    ) -> list[pa.Table | JavaIcebergError]:
        """Every read in one round trip; each result is the rows or the JVM's error."""
        ops = [
            {
                "op": "read",
                "table": r.table,
                "options": dict(r.options),
                "out": str(self._next_path("out")),
            }
            for r in reads
        ]
        return self._rows(ops, timeout_s)  # type: ignore[return-value]
