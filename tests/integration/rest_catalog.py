"""Apache Iceberg's REST catalog server for the tests: `RESTCatalogServer`, the server of the
iceberg-open-api test fixtures (the code of the apache/iceberg-rest-fixture image), from the jars
that scripts/setup-iceberg-rest.sh resolves into `$LAKESINK_CACHE/iceberg-rest/lib`.

It runs as a Java 17 process on a free port, with a JdbcCatalog on a SQLite file and a local
warehouse in its own folder (both configured through its `CATALOG_*` environment variables), and
is stopped by its PID. Clients reach it on 127.0.0.1. It checks no credentials: a client's token
is accepted and ignored. Its log is `server.log` in its folder.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

from s3_server import free_port

MAIN_CLASS = "org.apache.iceberg.rest.RESTCatalogServer"
_SOURCE_ROOT = Path(__file__).resolve().parents[2]


def rest_lib_dir() -> Path:
    """The folder of the server's jars; an error saying how to get them if it is missing."""
    cache = os.environ.get("LAKESINK_CACHE") or str(_SOURCE_ROOT / ".cache")
    lib = Path(cache) / "iceberg-rest" / "lib"
    if not any(lib.glob("iceberg-open-api-*-test-fixtures.jar")):
        raise RuntimeError(
            f"Apache Iceberg's REST catalog server is not in {lib}: run "
            "scripts/setup-iceberg-rest.sh (Java 17 and Maven) to resolve it"
        )
    return lib


def java_binary() -> str:
    """`$JAVA_HOME/bin/java`, else `java` on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise RuntimeError("the REST catalog server needs Java 17: no java on the PATH")
    return found


class RestCatalogServer:
    """`start()`, `uri`, `warehouse`, `stop()`; the catalog and warehouse live in `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.warehouse = root / "warehouse"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("the REST catalog server is not running")
        return self._proc.pid

    def start(self, timeout_s: float = 90.0) -> RestCatalogServer:
        self.warehouse.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "CATALOG_REST_PORT": str(self.port),
            "CATALOG_WAREHOUSE": self.warehouse.as_uri(),
            # a file, not the default in-memory database: the catalog's connection pool opens
            # several connections and each must see the same catalog
            "CATALOG_URI": f"jdbc:sqlite:{self.root / 'catalog.db'}",
        }
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        self._proc = subprocess.Popen(
            [
                java_binary(),
                "-Xmx512m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-cp",
                str(rest_lib_dir() / "*"),
                MAIN_CLASS,
            ],
            cwd=self.root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"the REST catalog server exited with code {self._proc.returncode}:\n"
                    + self.log_tail()
                )
            if self._answers():
                return self
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(
            f"the REST catalog server did not answer on {self.uri} in {timeout_s:.0f} s:\n"
            + self.log_tail()
        )

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/v1/config", timeout=2) as response:
                return int(response.status) == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM to the server's PID, SIGKILL if it has not exited after 10 s."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
