"""A throw-away PostgreSQL server for tests, on loopback, in a temp dir.

Use it from a test module with

    pytest_plugins = ["tests.integration.pg_fixture"]

and ask for the session-scoped `postgres_server` fixture (started lazily, by the first test
that needs it; stopped at the end of the session). Set `LAKESINK_TEST_PG_DSN` to use an
external server instead (tests that stop/restart the server are then skipped).

The server comes from Debian's `postgresql` package (`scripts/install-postgres.sh`). As root it
runs as the `postgres` user (PostgreSQL refuses root), through `runuser -u postgres --`:

    initdb -D DIR/data -U postgres --auth=scram-sha-256 --pwfile=DIR/pwfile -E UTF8 \
        --locale=C --no-sync
    pg_ctl -D DIR/data -l DIR/server.log -w -t 60 \
        -o "-p PORT -k DIR/sock -c listen_addresses=127.0.0.1" start
    pg_ctl -D DIR/data -m fast -w -t 60 stop
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PASSWORD = "lakesink-test-secret"
RUN_AS = "postgres"

LOGICAL_DECODING: dict[str, str] = {"wal_level": "logical"}
"""Server settings for a change-data-capture source (Debezium's pgoutput): logical decoding.
The superuser `postgres` may replicate, and initdb's pg_hba.conf lets it from loopback."""


def postgres_bin_dir() -> Path:
    """The directory of `initdb` and `pg_ctl`: $LAKESINK_PG_BIN, the newest Debian
    `/usr/lib/postgresql/*/bin`, or the PATH."""
    env = os.environ.get("LAKESINK_PG_BIN")
    if env:
        return Path(env)
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if found:
        return Path(found[-1]).parent
    which = shutil.which("initdb")
    if which:
        return Path(which).parent
    raise RuntimeError(
        "PostgreSQL server binaries not found: run scripts/install-postgres.sh "
        "(apt-get install postgresql) or set LAKESINK_PG_BIN"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", RUN_AS, "--", *cmd]


@dataclass
class PostgresServer:
    """One PostgreSQL cluster in `base_dir`, listening on 127.0.0.1:`port`."""

    base_dir: Path
    port: int
    bin_dir: Path
    external_dsn: str | None = None
    password: str = PASSWORD
    settings: dict[str, str] = field(default_factory=dict)
    """Server settings given at start (`-c name=value`), e.g. LOGICAL_DECODING."""
    running: bool = field(default=False, init=False)

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def socket_dir(self) -> Path:
        return self.base_dir / "sock"

    @property
    def log_file(self) -> Path:
        return self.base_dir / "server.log"

    @property
    def dsn(self) -> str:
        if self.external_dsn:
            return self.external_dsn
        return (
            f"host=127.0.0.1 port={self.port} user=postgres password={self.password} "
            "dbname=postgres"
        )

    def _run(self, *args: str, timeout: float = 90) -> None:
        cmd = _as_server_user([str(self.bin_dir / args[0]), *args[1:]])
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            log = self.log_file.read_text() if self.log_file.exists() else ""
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n"
                f"server log:\n{log[-4000:]}"
            )

    def init(self) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        pwfile = self.base_dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        if os.geteuid() == 0:
            user = pwd.getpwnam(RUN_AS)
            for p in (self.base_dir, self.socket_dir, pwfile):
                os.chown(p, user.pw_uid, user.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data_dir),
            "-U",
            "postgres",
            "--auth=scram-sha-256",
            f"--pwfile={pwfile}",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1"
        opts += "".join(f" -c {name}={value}" for name, value in self.settings.items())
        self._run(
            "pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-t", "60",
            "-o", opts, "start",
        )  # fmt: skip
        self.running = True

    def stop(self) -> None:
        if self.running:
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "60", "stop")
            self.running = False

    def wait_ready(self, timeout_s: float = 30) -> None:
        import psycopg

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with psycopg.connect(self.dsn, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def start_postgres(
    base_dir: Path | None = None, *, settings: dict[str, str] | None = None
) -> PostgresServer:
    """Create and start a fresh cluster (retrying on a port taken in the meantime), with
    server `settings` (LOGICAL_DECODING for a change-data-capture source)."""
    base = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="lakesink-pg-"))
    os.chmod(base, 0o755)
    server = PostgresServer(base, free_port(), postgres_bin_dir(), settings=dict(settings or {}))
    server.init()
    for attempt in range(3):
        try:
            server.start()
            break
        except RuntimeError:
            if attempt == 2:
                raise
            server.port = free_port()
    server.wait_ready()
    return server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole test session (or $LAKESINK_TEST_PG_DSN)."""
    external = os.environ.get("LAKESINK_TEST_PG_DSN")
    if external:
        yield PostgresServer(Path("."), 0, Path("."), external_dsn=external)
        return
    # logical decoding on: the change-data-capture tests' Debezium connectors read this server
    server = start_postgres(settings=LOGICAL_DECODING)
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        shutil.rmtree(server.base_dir, ignore_errors=True)


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> str:
    return postgres_server.dsn
