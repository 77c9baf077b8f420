"""Integration fixtures: one SparkSession (local[2]) for the whole session, ingestion helpers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from lakesink.config import LakesinkConfig, SparkStart, build_config
from lakesink.formats.hudi.audit import AuditReport
from lakesink.kafka.producer import SAMPLE_EVENT_DDL


@pytest.fixture(scope="session", autouse=True)
def spark_start(request: pytest.FixtureRequest) -> SparkStart:
    """The suite starts a Spark driver JVM a few hundred times: each maps Spark's classes from
    one class-data archive (lakesink's spark.class.archive) made here, before the first start,
    in the cache the set-up scripts reuse, and its Python workers import compiled pyspark.
    Every CLI run of the suite finds both through the environment; if the archive cannot be
    made, the runs start without one (and never write one). While it is made (a Spark start
    and a small job: a minute on a fresh checkout), the session's broker starts, and the schema
    registry's JVM launches, if a test of the session needs them."""
    from lakesink.kafka.kafka_server import cache_dir

    folder = str(cache_dir() / "spark-start")
    os.environ["LAKESINK_SPARK_START_CACHE_DIR"] = folder
    with tempfile.TemporaryFile(mode="w+") as log:
        making = subprocess.Popen(
            [sys.executable, "-m", "lakesink.spark.prepare", folder],
            env={**os.environ, **SHORT_LIVED_DRIVER_JVM},
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            if any("schema_registry" in item.fixturenames for item in request.session.items):
                # launched, not waited for (registry_fixture.py): its JVM starts beside these
                with contextlib.suppress(Exception):
                    request.getfixturevalue("schema_registry_launched")
            if any("kafka_bootstrap" in item.fixturenames for item in request.session.items):
                # a broker that fails to start fails the tests that need it, not this one
                with contextlib.suppress(Exception):
                    request.getfixturevalue("kafka_bootstrap")
            returncode = making.wait(timeout=600)
        finally:
            if making.poll() is None:
                making.kill()
                making.wait()
        log.seek(0)
        output = log.read()
    ok = returncode == 0 and any(Path(folder).glob("*.jsa"))
    os.environ["LAKESINK_SPARK_CLASS_ARCHIVE"] = "true" if ok else "false"
    if not ok:
        print(f"no class-data archive, Spark starts slower: {output}")
    return SparkStart.from_env()


@pytest.fixture(scope="session")
def spark(spark_start: SparkStart) -> Iterator[Any]:
    from lakesink.spark.session import get_spark

    session = get_spark("local[2]", {"spark.sql.shuffle.partitions": "2"}, start=spark_start)
    yield session
    session.stop()


def ingest_config(bootstrap: str, topic: str, table: Path, **overrides: Any) -> LakesinkConfig:
    raw: dict[str, Any] = {
        "kafka.bootstrap.servers": bootstrap,
        "kafka.topics": topic,
        "value.format": "json",
        "value.schema": SAMPLE_EVENT_DDL,
        "table.path": str(table),
        "kafka.max.records.per.batch": 400,
        "writer.id": "test-writer",
        "heartbeat.interval.s": 1,
        "heartbeat.tolerance.s": 10,
        "lock.lease.s": 10,
    }
    raw.update({k.replace("__", "."): v for k, v in overrides.items()})
    return build_config(raw)


def run_ingestion(cfg: LakesinkConfig, spark: Any, timeout_s: float = 120) -> Any:
    from lakesink.spark.pipeline import Ingestion

    return Ingestion(cfg, spark).run(once=True, timeout_s=timeout_s)


def audit_config(cfg: LakesinkConfig) -> AuditReport:
    from lakesink.cli.verify import audit_config as audit_of

    return audit_of(cfg)


def write_config_file(cfg: LakesinkConfig, path: Path) -> Path:
    import json

    from lakesink.security import Secret

    def plain(v: Any) -> Any:
        return v.reveal() if isinstance(v, Secret) else list(v) if isinstance(v, tuple) else v

    def dotted(key: str, value: Any) -> list[str]:  # a section (tables) as dotted keys
        if isinstance(value, dict):
            return [line for k, v in value.items() for line in dotted(f"{key}.{k}", v)]
        return [f'"{key}" = {json.dumps(plain(value))}']

    lines = [line for k, v in cfg.values.items() if v is not None for line in dotted(k, v)]
    path.write_text("\n".join(lines) + "\n")
    return path


# A CLI run's Spark driver lives for seconds, not the session: the JIT's first tier alone
# (and the serial collector) spends far less CPU on it than the full tiered compiler, and on
# a 2-core CI machine that CPU is the tests' own time. Semantics are the JVM's either way;
# a SPARK_SUBMIT_OPTS of the caller's own wins.
SHORT_LIVED_DRIVER_JVM = {
    "SPARK_SUBMIT_OPTS": os.environ.get(
        "SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    )
}


def run_cli_subprocess(
    args: list[str], env: Mapping[str, str] | None = None, timeout_s: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run `lakesink ARGS` as its own process group; when the driver ends (or is killed by an
    injected crash), its JVM and workers are killed too, as a crashed machine would lose them."""
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lakesink.cli.main", *args],
            env={**os.environ, **SHORT_LIVED_DRIVER_JVM, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout_s)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.seek(0)
        out = log.read()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_cli_subprocess


def run_side_by_side(
    chains: Mapping[str, Callable[[], None]], meanwhile: Callable[[], object] | None = None
) -> None:
    """Run each named chain of restarts in a thread of its own and wait for all of them. A CLI
    run is mostly one busy process while its JVM and Python start (and idle while it waits on
    the broker), so chains on tables, topics and checkpoints of their own share a 2-core
    machine's cores far better than one after another. `meanwhile` runs in the calling thread
    while they do (a session fixture's start, say). Every chain runs to its end; a chain's
    failure is raised with its name (several: an exception group naming each)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(chains)) as pool:
        running = {name: pool.submit(chain) for name, chain in chains.items()}
        failed: dict[str, BaseException] = {}
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException as error:  # the chains still run to their end
                error.add_note("in the work done while the chains ran")
                failed["meanwhile"] = error
        for name, future in running.items():
            error = future.exception()
            if error is not None:
                error.add_note(f"in the chain {name!r}")
                failed[name] = error
    if len(failed) == 1:
        raise next(iter(failed.values()))
    if failed:
        raise BaseExceptionGroup(f"chains failed: {', '.join(failed)}", list(failed.values()))


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Spark standalone cluster for the session (master and two one-core workers on
    loopback, each worker and its executors in a folder of its own), for the tests whose
    executors must be processes of their own: started once, not once per test."""
    from integration.spark_cluster import StandaloneCluster

    cluster = StandaloneCluster(
        tmp_path_factory.mktemp("spark-cluster"), workers=2, cores_per_worker=1
    )
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def java_hudi() -> Iterator[Any]:
    """One Java Hudi session (Spark with the Hudi bundle, in the interop environment of
    scripts/setup-interop.sh) for every interop test; a missing environment fails the test."""
    from interop.java_hudi import JavaHudi

    session = JavaHudi()
    assert session.java_version.startswith("17."), session.java_version
    yield session
    session.close()
