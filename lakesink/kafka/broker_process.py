"""A local broker process on loopback: what noida-db's EmbeddedBroker and Apache Kafka's
KafkaServer share.

A BrokerProcess owns one child process with its own data directory and its log in
`broker.log` there. Subclasses say how to start it (`start()`, building the command line and
calling `_spawn`) and which ports it listens on; stopping (SIGTERM, then SIGKILL after a timeout),
killing as a crash would, and cleaning up are the same for both.
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
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from lakesink.errors import KafkaError

log = logging.getLogger(__name__)

LOG_FILE_NAME = "broker.log"


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


class BrokerProcess:
    """One broker process on `host`, data in `data_dir` (a temporary folder of its own, deleted
    by `close()`, unless given)."""

    NAME = "broker"
    """How log lines and errors name this kind of broker."""

    READY_POLL_S = 0.1

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike[str] | None,
        host: str,
        temp_prefix: str,
        startup_timeout_s: float,
        stop_timeout_s: float,
    ) -> None:
        self._owns_data_dir = data_dir is None
        self.data_dir = Path(tempfile.mkdtemp(prefix=temp_prefix) if data_dir is None else data_dir)
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        raise NotImplementedError

    def listening_ports(self) -> Sequence[int]:
        """Every port the process listens on: free again before `stop()` returns."""
        raise NotImplementedError

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_FILE_NAME

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        raise NotImplementedError

    def _spawn(self, cmd: Sequence[str]) -> None:
        """Start `cmd` with its output appended to the log, in a session of its own (Ctrl-C in
        a terminal must not reach it before we stop it)."""
        with open(self.log_path, "ab") as out:
            out.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(cmd)}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_ready(self, port: int) -> None:
        """Wait until `port` accepts connections and the broker answers metadata requests."""
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise KafkaError(
                    f"{self.NAME} exited with code {code} while starting on "
                    f"{self.bootstrap_servers}; last log lines:\n{self.log_tail()}"
                )
            if port_open(self.host, port) and answers_metadata(self.bootstrap_servers, 1.0):
                return
            time.sleep(self.READY_POLL_S)
        raise KafkaError(
            f"{self.NAME} on {self.bootstrap_servers} did not answer metadata requests within "
            f"{self.startup_timeout_s:.0f} s; last log lines:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Terminate the process (SIGTERM), then kill it if it has not exited within the timeout;
        return once its ports are free (a restart binds them again)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                log.warning(
                    "%s pid %d ignored SIGTERM for %.0f s; killing it",
                    self.NAME,
                    proc.pid,
                    self.stop_timeout_s,
                )
                proc.kill()
                proc.wait(timeout=self.stop_timeout_s)
        deadline = time.monotonic() + self.stop_timeout_s
        while any(port_open(self.host, p) for p in self.listening_ports()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        log.info("stopped %s pid %d (%s)", self.NAME, proc.pid, self.bootstrap_servers)

    def kill(self) -> None:
        """Kill the process at once (SIGKILL), as a crash would."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=self.stop_timeout_s)
        self.stop()

    def restart(self) -> None:
        """Stop and start again with the same ports and data directory."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop, and delete the data directory if this broker created it (killed at once then:
        nothing of it is kept, so a graceful shutdown would only cost time)."""
        if self._owns_data_dir:
            self.kill()
            shutil.rmtree(self.data_dir, ignore_errors=True)
        else:
            self.stop()

    def __enter__(self) -> Self:
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
