"""Debezium's PostgreSQL connector in Debezium's embedded engine, feeding Apache Kafka, for tests.

An `EmbeddedDebezium` runs `jvm/debezium/DebeziumToKafka.java` (launched from source: Java compiles
the single-file program at start) on the jars that `scripts/setup-debezium.sh` resolves into
`$LAKESINK_CACHE/debezium/lib` (override: `$LAKESINK_DEBEZIUM_LIB`): one JVM, one embedded engine
per `DebeziumConnector` against one PostgreSQL (`PostgresSource`; the cluster needs
`wal_level=logical`: `pg_fixture.LOGICAL_DECODING`), and one Kafka producer to one bootstrap
server (the session's Apache Kafka) that sends every change event, as the JSON converter writes
it, to the topic the connector names. A batch's offsets count as processed once Kafka
acknowledged it. The engines are configured by properties files written into the process's
folder, beside their offsets files (`offsets-<connector>.dat`, so a restart resumes where the
last run stopped) and the log (`debezium.log`).

    connectors = [DebeziumConnector("cdc", "cdc", tables=("public.customers",))]
    with EmbeddedDebezium(tmp_path / "debezium", bootstrap, source, connectors) as d:
        d.wait_streaming()  # the initial snapshot is in Kafka, changes from now on stream
        ...                 # run SQL; read the topics `cdc.public.<table>`

Each connector has its own replication slot and publication (`publication.autocreate.mode=
filtered`: the publication names only its tables), `plugin.name=pgoutput`,
`decimal.handling.mode=string`, and the JSON converter for key and value, with or without the
`schema`/`payload` wrapper (`schemas_enable`). `wait_streaming` watches the log for the line
Debezium's coordinator writes when the snapshot has ended and streaming begins ("Starting
streaming", on a thread named after the connector's topic prefix); a process that exits, or an
engine that stops with an error, ends the wait with the log's tail.

Stopping is by the process's PID (SIGTERM: the engines stop and flush their offsets; SIGKILL
after a timeout). The replication slots stay in the database (`slot.drop.on.stop` is false) so a
restarted process resumes; a throw-away cluster takes them with it.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from lakesink.errors import ConfigError, LakesinkError
from lakesink.kafka.kafka_server import cache_dir, java_binary

LIB_ENV = "LAKESINK_DEBEZIUM_LIB"
"""Environment variable naming the folder of the engine's and connector's jars."""

CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
ENGINE_SOURCE = Path(__file__).resolve().parents[2] / "jvm" / "debezium" / "DebeziumToKafka.java"
"""The embedded engine's program, launched from source."""
LOG_FILE_NAME = "debezium.log"

STREAMING_LINE = "Starting streaming"
"""What Debezium's change-event-source coordinator logs once the snapshot has ended."""

FAILURE_LINES = ("Debezium engine stopped with an error",)
"""What DebeziumToKafka.java prints when an engine stops with an error (it then exits)."""

# The process lives for one test or one capture: the JIT's first tier and the serial collector
# spend far less CPU on a short life (as the suite's Spark drivers do). The Kafka clients'
# chatter is kept to warnings; Debezium's INFO lines are what `wait_streaming` reads.
JVM_OPTIONS: tuple[str, ...] = (
    "-Xms64m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
    "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.clients=warn",
    "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.common=warn",
    "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.connect=warn",
)


class DebeziumError(LakesinkError):
    """The embedded Debezium process or one of its connectors did not start or failed."""


def debezium_lib_dir() -> Path:
    """The folder of the engine's and connector's jars; a ConfigError saying how to get them."""
    override = os.environ.get(LIB_ENV)
    lib = Path(override) if override else cache_dir() / "debezium" / "lib"
    needed = ("debezium-connector-postgres-*.jar", "debezium-embedded-*.jar")
    if not all(any(lib.glob(pattern)) for pattern in needed):
        raise ConfigError(
            f"Debezium's PostgreSQL connector and embedded engine are not in {lib}: run "
            f"scripts/setup-debezium.sh (needs Java 17 and Maven), or set ${LIB_ENV} to a folder "
            "that holds them"
        )
    return lib


@dataclass(frozen=True, slots=True)
class PostgresSource:
    """Where the connectors read from: a PostgreSQL server with `wal_level=logical` and a role
    allowed to replicate (and to create publications for the captured tables)."""

    host: str
    port: int
    user: str
    password: str
    dbname: str = "postgres"


@dataclass(frozen=True, slots=True)
class DebeziumConnector:
    """One Debezium PostgreSQL connector: its topics are `<topic_prefix>.<schema>.<table>`."""

    name: str
    """The connector's engine name (and the default slot and publication names)."""
    topic_prefix: str
    tables: tuple[str, ...] = ()
    """`schema.table` names captured (`table.include.list`); empty: every table."""
    schemas_enable: bool = False
    """Whether key and value carry the JSON converter's `schema`/`payload` wrapper."""
    snapshot_mode: str = "initial"
    properties: Mapping[str, str] = field(default_factory=dict)
    """More connector properties; they win over the ones built here."""

    @property
    def slot_name(self) -> str:
        # replication slot names: lower-case letters, digits and underscores only
        return re.sub(r"[^a-z0-9_]", "_", self.name.lower())

    def config(self, source: PostgresSource, offsets_file: Path) -> dict[str, str]:
        """The engine's properties for `source`, its offsets kept in `offsets_file`."""
        schemas = "true" if self.schemas_enable else "false"
        config = {
            "name": self.name,
            "connector.class": CONNECTOR_CLASS,
            "tasks.max": "1",
            "database.hostname": source.host,
            "database.port": str(source.port),
            "database.user": source.user,
            "database.password": source.password,
            "database.dbname": source.dbname,
            "topic.prefix": self.topic_prefix,
            "plugin.name": "pgoutput",
            "slot.name": self.slot_name,
            "publication.name": f"{self.slot_name}_publication",
            "publication.autocreate.mode": "filtered",
            "snapshot.mode": self.snapshot_mode,
            "decimal.handling.mode": "string",
            # the engine's JSON format is Kafka Connect's JSON converter, configured per side
            "key.converter.schemas.enable": schemas,
            "value.converter.schemas.enable": schemas,
            "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
            "offset.storage.file.filename": str(offsets_file),
            "offset.flush.interval.ms": "1000",
        }
        if self.tables:
            config["table.include.list"] = ",".join(re.escape(t) for t in self.tables)
        config.update(self.properties)
        return config


def _properties_text(values: Mapping[str, str]) -> str:
    # java.util.Properties: backslashes escape, so a regular expression's `\.` is written `\\.`
    return "".join(f"{k}={v.replace(chr(92), chr(92) * 2)}\n" for k, v in values.items())


class EmbeddedDebezium:
    """A JVM running Debezium's embedded engine, one per connector, into Kafka (module doc)."""

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        bootstrap_servers: str,
        source: PostgresSource,
        connectors: Sequence[DebeziumConnector],
        *,
        jvm_options: Sequence[str] = (),
        stop_timeout_s: float = 30.0,
    ) -> None:
        if not connectors:
            raise ConfigError("embedded Debezium needs at least one connector")
        names = [c.name for c in connectors]
        if len(set(names)) != len(names):
            raise ConfigError(f"connector names must differ: {names}")
        self.work_dir = Path(work_dir)
        self.bootstrap_servers = bootstrap_servers
        self.source = source
        self.connectors = tuple(connectors)
        self.jvm_options = tuple(jvm_options)
        self.stop_timeout_s = stop_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.work_dir / LOG_FILE_NAME

    def offsets_path(self, connector: DebeziumConnector) -> Path:
        return self.work_dir / f"offsets-{connector.slot_name}.dat"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def producer_properties(self) -> dict[str, str]:
        """The Kafka producer's properties (DebeziumToKafka.java adds acks=all, idempotence)."""
        return {"bootstrap.servers": self.bootstrap_servers, "linger.ms": "5"}

    def command(self) -> list[str]:
        """The process's command line, its properties files written."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        producer = self.work_dir / "producer.properties"
        producer.write_text(_properties_text(self.producer_properties()))
        files = []
        for connector in self.connectors:
            path = self.work_dir / f"connector-{connector.slot_name}.properties"
            config = connector.config(self.source, self.offsets_path(connector))
            path.write_text(_properties_text(config))
            files.append(str(path))
        classpath = str(debezium_lib_dir() / "*")
        java = str(java_binary())
        head = [java, *JVM_OPTIONS, *self.jvm_options, "-cp", classpath, str(ENGINE_SOURCE)]
        return [*head, str(producer), *files]

    def start(self) -> Self:
        """Start the process (its connectors begin their snapshots at once)."""
        if self.running:
            return self
        cmd = self.command()
        with open(self.log_path, "ab") as out:
            out.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(cmd)}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:]) or "(no log)"

    def _streaming(self, connector: DebeziumConnector, log_text: str) -> bool:
        # the coordinator's thread name holds the topic prefix:
        # debezium-postgresconnector-<topic.prefix>-change-event-source-coordinator
        tag = f"-{connector.topic_prefix}-"
        return any(STREAMING_LINE in line and tag in line for line in log_text.splitlines())

    def wait_streaming(self, timeout_s: float = 120.0) -> None:
        """Wait until every connector has ended its snapshot and streams; a DebeziumError
        with the log's tail if the process exits, an engine fails or the time runs out."""
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.log_text()
            failed = next((line for line in FAILURE_LINES if line in text), None)
            if failed is not None:
                raise DebeziumError(
                    f"a Debezium connector failed ({failed!r}); last log lines of "
                    f"{self.log_path}:\n{self.log_tail()}"
                )
            if not self.running:
                code = None if self._proc is None else self._proc.returncode
                raise DebeziumError(
                    f"the embedded Debezium process exited with code {code}; last log lines of "
                    f"{self.log_path}:\n{self.log_tail()}"
                )
            waiting = [c.name for c in self.connectors if not self._streaming(c, text)]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise DebeziumError(
                    f"connectors {waiting} did not start streaming within {timeout_s:.0f} s; "
                    f"last log lines of {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM to the process's PID (the engines stop, their offsets are flushed), SIGKILL
        if it has not exited within the timeout."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=self.stop_timeout_s)

    def kill(self) -> None:
        """SIGKILL to the process's PID, as a crash would (offsets since the last flush are lost,
        so a restart sends those changes again)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=self.stop_timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
