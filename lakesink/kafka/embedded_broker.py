"""An embedded Kafka-protocol broker (noida-db) on loopback, for the demo and the tests.

An EmbeddedBroker owns one `noida-db` process serving only Kafka on a free loopback port, with its
own data directory. Its log goes to `broker.log` inside that directory. `restart()` keeps port and
data, so the records survive; `stop()` terminates the process, then kills it after a timeout.

noida-db keeps every record in memory and saves its state as files in the data directory: about
1.1 GB of memory and 10 s to stop (5 s to start again) with 1 M records of 250 bytes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path

from lakesink.errors import ConfigError, KafkaError
from lakesink.extras import is_installed, missing
from lakesink.kafka.broker_process import (
    LOG_FILE_NAME,
    BrokerProcess,
    answers_metadata,
    free_port,
    port_open,
)

__all__ = [
    "BINARY_ENV",
    "LOG_FILE_NAME",
    "EmbeddedBroker",
    "answers_metadata",
    "free_port",
    "noida_db_binary",
    "port_open",
]

log = logging.getLogger(__name__)

BINARY_ENV = "LAKESINK_NOIDA_DB_BINARY"
"""Environment variable overriding the path of the `noida-db` executable."""


def noida_db_binary() -> Path:
    """The `noida-db` executable of the `noida-db` wheel (or `$LAKESINK_NOIDA_DB_BINARY`)."""
    override = os.environ.get(BINARY_ENV)
    if override:
        path = Path(override)
    else:
        spec = find_spec("noida_db") if is_installed("noida_db") else None
        if spec is None or spec.origin is None:
            raise missing(
                "noida_db", f"the embedded broker (or {BINARY_ENV} set to the noida-db executable)"
            )
        path = Path(spec.origin).parent / "noida-db"
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ConfigError(f"noida-db executable {path} does not exist or is not executable")
    return path


class EmbeddedBroker(BrokerProcess):
    """One noida-db process serving the Kafka protocol on `host:port`, data in `data_dir`."""

    NAME = "noida-db"
    READY_POLL_S = 0.05

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 30.0,
        stop_timeout_s: float = 30.0,
    ) -> None:
        super().__init__(
            data_dir=data_dir,
            host=host,
            temp_prefix="lakesink-broker-",
            startup_timeout_s=startup_timeout_s,
            stop_timeout_s=stop_timeout_s,
        )
        self._fixed_port = port is not None
        self.port = port if port is not None else free_port(host)

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def listening_ports(self) -> Sequence[int]:
        return (self.port,)

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
            self._spawn(
                [
                    str(noida_db_binary()),
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
            )
            log.info(
                "started noida-db pid %s on %s, data in %s",
                self.pid,
                self.bootstrap_servers,
                self.data_dir,
            )
            try:
                self._wait_ready(self.port)
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

    def restart(self) -> None:
        """Stop and start again on the same port with the same data directory."""
        self.stop()
        self._fixed_port = True
        self.start()
