"""Apache Kafka on loopback: one combined KRaft broker+controller process, for tests and benchmarks.

A KafkaServer runs `kafka.Kafka` from the jars that `scripts/setup-kafka.sh` resolves with Maven
into `$LAKESINK_CACHE/kafka/lib` (`.cache/kafka/lib` in a source checkout by default; point
`$LAKESINK_KAFKA_LIB` elsewhere). On first start it writes `server.properties` into its data
directory and formats the KRaft storage there (`kafka.tools.StorageTool format --standalone`);
`restart()` keeps data directory and ports, so acknowledged records survive a `kill()` (SIGKILL).
The process log goes to `broker.log` in the data directory.

Every replication factor is 1 and consumer-group rebalances start at once. More listeners (e.g. a
SASL_SSL one) come in as `extra_listeners` (name → security protocol, each on a free loopback port),
any server property as `server_properties`, extra `StorageTool format` arguments (e.g.
`--add-scram`) as `format_args`, and JVM flags as `jvm_options`.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from lakesink.errors import ConfigError, KafkaError
from lakesink.kafka.broker_process import BrokerProcess, free_port, port_open
from lakesink.kafka.embedded_broker import EmbeddedBroker

log = logging.getLogger(__name__)

LIB_ENV = "LAKESINK_KAFKA_LIB"
"""Environment variable naming the folder of Apache Kafka's jars (kafka_2.13 and dependencies)."""

CACHE_ENV = "LAKESINK_CACHE"
"""Environment variable naming lakesink's cache folder (`.cache/` in a source checkout)."""

PROPERTIES_FILE_NAME = "server.properties"
BROKER_LISTENER = "PLAINTEXT"
CONTROLLER_LISTENER = "CONTROLLER"

_SOURCE_ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """lakesink's cache of downloaded environments: $LAKESINK_CACHE, else `.cache/` in the
    source checkout (the scripts/setup-*.sh fill it)."""
    cache = os.environ.get(CACHE_ENV)
    return Path(cache) if cache else _SOURCE_ROOT / ".cache"


def kafka_lib_dir() -> Path:
    """The folder of Apache Kafka's jars; a ConfigError saying how to get them if missing."""
    override = os.environ.get(LIB_ENV)
    if override:
        lib = Path(override)
        how = f"${LIB_ENV} names {lib}"
    else:
        lib = cache_dir() / "kafka" / "lib"
        how = "run scripts/setup-kafka.sh (needs Java 17 and Maven) to resolve them into it"
    if not any(lib.glob("kafka_2.13-*.jar")):
        raise ConfigError(
            f"Apache Kafka's jars (kafka_2.13-*.jar and its dependencies) are not in {lib}: {how}, "
            f"or set ${LIB_ENV} to a folder that holds them"
        )
    return lib


def java_binary() -> Path:
    """`$JAVA_HOME/bin/java`, else `java` on the PATH; a ConfigError if neither exists."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return Path(home) / "bin" / "java"
    found = shutil.which("java")
    if found is None:
        raise ConfigError(
            "Apache Kafka needs Java 17 or newer: no java on the PATH and no $JAVA_HOME/bin/java "
            "(apt-get install openjdk-17-jre-headless)"
        )
    return Path(found)


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64 without padding, as Kafka makes."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):  # Kafka avoids ids a command line would take for an option
            return cid


DEFAULT_SERVER_PROPERTIES: Mapping[str, str] = {
    "num.partitions": "1",
    "auto.create.topics.enable": "true",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    # after a kill -9 the controller refuses the broker's new registration until the old one's
    # session expires (9 s by default)
    "broker.heartbeat.interval.ms": "500",
    "broker.session.timeout.ms": "4000",
    # retention and compaction act within seconds, so tests can watch them happen
    "log.initial.task.delay.ms": "1000",
    "log.retention.check.interval.ms": "1000",
    "log.cleaner.backoff.ms": "1000",
    "log.segment.delete.delay.ms": "1000",
    "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
    "num.network.threads": "2",
    "num.io.threads": "4",
    "background.threads": "4",
    "num.recovery.threads.per.data.dir": "1",
}
"""Server properties every KafkaServer starts with unless `server_properties` overrides them."""

DEFAULT_JVM_OPTIONS: tuple[str, ...] = (
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
    "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.clients=warn",
)


class KafkaServer(BrokerProcess):
    """One Apache Kafka process (KRaft, broker and controller) on `host`, data in `data_dir`."""

    NAME = "Apache Kafka"

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        extra_listeners: Mapping[str, str] | None = None,
        server_properties: Mapping[str, str] | None = None,
        format_args: Sequence[str] = (),
        jvm_options: Sequence[str] = (),
        startup_timeout_s: float = 60.0,
        stop_timeout_s: float = 30.0,
    ) -> None:
        super().__init__(
            data_dir=data_dir,
            host=host,
            temp_prefix="lakesink-kafka-",
            startup_timeout_s=startup_timeout_s,
            stop_timeout_s=stop_timeout_s,
        )
        self.listeners: dict[str, str] = {
            BROKER_LISTENER: "PLAINTEXT",
            CONTROLLER_LISTENER: "PLAINTEXT",
        }
        for name, protocol in (extra_listeners or {}).items():
            if name.upper() in self.listeners:
                raise ConfigError(
                    f"listener name {name!r} is taken: extra listeners need names other than "
                    f"{BROKER_LISTENER} and {CONTROLLER_LISTENER}"
                )
            self.listeners[name.upper()] = protocol.upper()
        self.ports: dict[str, int] = {name: free_port(host) for name in self.listeners}
        if port is not None:
            self.ports[BROKER_LISTENER] = port
        self.server_properties = dict(server_properties or {})
        self.format_args = tuple(format_args)
        self.jvm_options = tuple(jvm_options)

    @property
    def port(self) -> int:
        """The PLAINTEXT listener's port."""
        return self.ports[BROKER_LISTENER]

    @property
    def bootstrap_servers(self) -> str:
        """bootstrap.servers of the PLAINTEXT listener."""
        return self.address(BROKER_LISTENER)

    def listening_ports(self) -> Sequence[int]:
        return tuple(self.ports.values())

    def address(self, listener: str) -> str:
        """`host:port` of the named listener."""
        return f"{self.host}:{self.ports[listener.upper()]}"

    @property
    def properties_path(self) -> Path:
        return self.data_dir / PROPERTIES_FILE_NAME

    @property
    def log_dir(self) -> Path:
        """Where Kafka keeps the partitions' segments and the KRaft metadata log."""
        return self.data_dir / "kraft-logs"

    def properties(self) -> dict[str, str]:
        """The server properties this broker runs with."""
        urls = ",".join(f"{n}://{self.host}:{p}" for n, p in self.ports.items())
        advertised = ",".join(
            f"{n}://{self.host}:{p}" for n, p in self.ports.items() if n != CONTROLLER_LISTENER
        )
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": self.address(CONTROLLER_LISTENER),
            "controller.listener.names": CONTROLLER_LISTENER,
            "inter.broker.listener.name": BROKER_LISTENER,
            "listeners": urls,
            "advertised.listeners": advertised,
            "listener.security.protocol.map": ",".join(
                f"{n}:{proto}" for n, proto in self.listeners.items()
            ),
            "log.dirs": str(self.log_dir),
            **DEFAULT_SERVER_PROPERTIES,
        }
        props.update(self.server_properties)
        return props

    def _java(self, main: str, *args: str) -> list[str]:
        classpath = str(kafka_lib_dir() / "*")
        return [
            str(java_binary()),
            *DEFAULT_JVM_OPTIONS,
            *self.jvm_options,
            "-cp",
            classpath,
            main,
            *args,
        ]

    def _write_properties(self) -> None:
        lines = [f"{k}={v}" for k, v in self.properties().items()]
        self.properties_path.write_text("\n".join(lines) + "\n")

    def _format(self) -> None:
        """Format the KRaft storage unless an earlier start did."""
        if (self.log_dir / "meta.properties").exists():
            return
        cmd = self._java(
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            new_cluster_id(),
            "--config",
            str(self.properties_path),
            "--standalone",
            "--ignore-formatted",
            *self.format_args,
        )
        with open(self.log_path, "ab") as out:
            out.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} storage format\n".encode())
            out.flush()
            done = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, check=False
            )
        if done.returncode != 0:
            raise KafkaError(
                f"formatting Kafka's storage in {self.log_dir} failed with code "
                f"{done.returncode}; last log lines:\n{self.log_tail()}"
            )

    def start(self) -> KafkaServer:
        """Format the storage if new, start the process, wait until it serves metadata."""
        if self.running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for name, port in self.ports.items():
            if port_open(self.host, port):
                raise KafkaError(
                    f"cannot start Apache Kafka: {self.host}:{port} ({name} listener) is already "
                    "in use"
                )
        started = time.monotonic()
        self._write_properties()
        self._format()
        self._spawn(self._java("kafka.Kafka", str(self.properties_path)))
        try:
            self._wait_ready(self.port)
        except KafkaError:
            self.kill()
            raise
        log.info(
            "Apache Kafka pid %s serves %s after %.1f s",
            self.pid,
            self.bootstrap_servers,
            time.monotonic() - started,
        )
        return self


BROKER_KINDS = ("kafka", "noida")
"""Local brokers lakesink can start: Apache Kafka (needs Java and the cached jars) or noida-db."""


class LocalBroker(Protocol):
    """What tests and benchmarks use of a local broker process, whichever kind it is."""

    data_dir: Path

    @property
    def bootstrap_servers(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def log_path(self) -> Path: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def running(self) -> bool: ...
    def start(self) -> LocalBroker: ...
    def stop(self) -> None: ...
    def kill(self) -> None: ...
    def restart(self) -> None: ...
    def close(self) -> None: ...


def local_broker(
    kind: str = "kafka", *, data_dir: str | os.PathLike[str] | None = None
) -> LocalBroker:
    """A local broker of `kind` (not started yet): `kafka` (Apache Kafka) or `noida` (noida-db)."""
    if kind == "kafka":
        return KafkaServer(data_dir=data_dir)
    if kind == "noida":
        return EmbeddedBroker(data_dir=data_dir)
    raise ConfigError(f"unknown broker kind {kind!r}: use one of {', '.join(BROKER_KINDS)}")
