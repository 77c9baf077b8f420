"""An embedded Kafka-protocol broker (noida-db) on loopback, for the demo and the tests.

An EmbeddedBroker owns one `noida-db` process serving only Kafka on a free loopback port, with its
own data directory. Its log goes to `broker.log` inside that directory. `restart()` keeps port and
data, so the records survive; `stop()` terminates the process, then kills it after a timeout.

noida-db keeps every record in memory and saves its state as files in the data directory: about
1.1 GB of memory and 10 s to stop (5 s to start again) with 1 M records of 250 bytes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path
from types import TracebackType

from lakesink.errors import ConfigError, KafkaError

log = logging.getLogger(__name__)

BINARY_ENV = "LAKESINK_NOIDA_DB_BINARY"
"""Environment variable overriding the path of the `noida-db` executable."""

LOG_FILE_NAME = "broker.log"


def noida_db_binary() -> Path:
    """The `noida-db` executable of the `noida-db` wheel (or `$LAKESINK_NOIDA_DB_BINARY`)."""
    override = os.environ.get(BINARY_ENV)
    if override:
        path = Path(override)
    else:
        spec = find_spec("noida_db")
        if spec is None or spec.origin is None:
            raise ConfigError(
                "the embedded broker needs the 'noida-db' package (pip install noida-db==0.2.3), "
                f"or set {BINARY_ENV} to the noida-db executable"
            )
        path = Path(spec.origin).parent / "noida-db"
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ConfigError(f"noida-db executable {path} does not exist or is not executable")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def answers_metadata(bootstrap: str, timeout: float) -> bool:
    """Whether a broker at `bootstrap` answers a metadata request naming at least one broker."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        metadata = admin.list_topics(timeout=timeout)
    except Exception:
        return False
    return bool(metadata.brokers)


class EmbeddedBroker:
    """One noida-db process serving the Kafka protocol on `host:port`, data in `data_dir`."""

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 30.0,
        stop_timeout_s: float = 30.0,
    ) -> None:
        self._owns_data_dir = data_dir is None
        self.data_dir = Path(
            tempfile.mkdtemp(prefix="lakesink-broker-") if data_dir is None else data_dir
        )
        self.host = host
        self._fixed_port = port is not None
        self.port = port if port is not None else free_port(host)
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_FILE_NAME

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> EmbeddedBroker:
        """Start the process and wait until it answers metadata requests."""
        if self.running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._fixed_port else 3
        for attempt in range(attempts):
            if attempt:
                self.port = free_port(self.host)
            if port_open(self.host, self.port):
                if self._fixed_port:
                    raise KafkaError(
                        "cannot start the embedded broker: "
                        f"{self.bootstrap_servers} is already in use"
                    )
                continue
            self._spawn()
            try:
                self._wait_ready()
                return self
            except KafkaError:
                exited = self._proc is not None and self._proc.poll() is not None
                self.stop()
                if not exited or attempt == attempts - 1:
                    raise
                log.warning(
                    "embedded broker exited at start on port %d; trying another port", self.port
                )
        raise KafkaError(f"cannot start the embedded broker; see {self.log_path}")

    def _spawn(self) -> None:
        binary = noida_db_binary()
        cmd = [
            str(binary),
            "start",
            "--only",
            "kafka",
            "--host",
            self.host,
            "--kafka-port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
        ]
        with open(self.log_path, "ab") as out:
            out.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(cmd)}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in a terminal must not reach it before we stop it
            )
        log.info(
            "started noida-db pid %d on %s, data in %s",
            self._proc.pid,
            self.bootstrap_servers,
            self.data_dir,
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise KafkaError(
                    f"embedded broker exited with code {code} while starting on "
                    f"{self.bootstrap_servers}; last log lines:\n{self.log_tail()}"
                )
            if port_open(self.host, self.port) and answers_metadata(self.bootstrap_servers, 1.0):
                return
            time.sleep(0.05)
        raise KafkaError(
            f"embedded broker on {self.bootstrap_servers} did not answer metadata requests within "
            f"{self.startup_timeout_s:.0f} s; last log lines:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Terminate the process (SIGTERM), then kill it if it has not exited within the timeout."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                log.warning(
                    "noida-db pid %d ignored SIGTERM for %.0f s; killing it",
                    proc.pid,
                    self.stop_timeout_s,
                )
                proc.kill()
                proc.wait(timeout=self.stop_timeout_s)
        # the port must be free before a restart on the same port
        deadline = time.monotonic() + self.stop_timeout_s
        while port_open(self.host, self.port) and time.monotonic() < deadline:
            time.sleep(0.05)
        log.info("stopped noida-db pid %d (%s)", proc.pid, self.bootstrap_servers)

    def kill(self) -> None:
        """Kill the process at once (SIGKILL), as a crash would."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=self.stop_timeout_s)
        self.stop()

    def restart(self) -> None:
        """Stop and start again on the same port with the same data directory."""
        self.stop()
        self._fixed_port = True
        self.start()

    def close(self) -> None:
        """Stop, and delete the data directory if this broker created it (then the process is
        killed at once: a graceful noida-db shutdown saves its state, seconds per GB, for
        nothing)."""
        if self._owns_data_dir:
            self.kill()
            shutil.rmtree(self.data_dir, ignore_errors=True)
        else:
            self.stop()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()
