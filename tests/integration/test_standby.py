"""A warm standby (`lakesink ingest --standby`) of the same config and writer id, as two OS
processes with their own Spark drivers, against the suite's broker:

- the active driver is killed with SIGKILL in the middle of a batch (its files written, not
  committed; its JVM and workers die with it): the standby takes over, rolls the dead instant
  back and ingests the rest; the exactly-once audit against Kafka passes;
- the active driver is paused (SIGSTOP) while a batch waits to publish, longer than
  standby.takeover.after.s: the standby takes over and ingests everything; when the paused
  driver resumes it must fail with FencedError (exit code 6) and publish nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from integration.conftest import (
    SHORT_LIVED_DRIVER_JVM,
    audit_config,
    ingest_config,
    write_config_file,
)

from lakesink.errors import FencedError
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.kafka.producer import produce_sample_events
from lakesink.protocol.instant import Action

pytestmark = pytest.mark.integration


class Driver:
    """`lakesink ingest ARGS` as a process group of its own, its output in a file."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._out: IO[bytes] = open(log, "wb")  # noqa: SIM115 - closed in kill()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lakesink.cli.main", "ingest", *args],
            env={**os.environ, **SHORT_LIVED_DRIVER_JVM, **(env or {})},
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.output:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.output}"
            assert time.monotonic() < deadline, f"no {text!r} in {timeout_s}s:\n{self.output}"
            time.sleep(0.1)

    def wait(self, timeout_s: float = 120) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running after {timeout_s}s:\n{self.output[-3000:]}")

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGCONT)
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._out.close()


@pytest.fixture
def drivers() -> Iterator[Callable[..., Driver]]:
    started: list[Driver] = []

    def start(args: list[str], log: Path, env: dict[str, str] | None = None) -> Driver:
        started.append(Driver(args, log, env))
        return started[-1]

    yield start
    for d in started:
        d.kill()


def completed_commits(cfg: Any) -> set[str]:
    timeline = HudiTable.open(cfg.table_storage).timeline()
    return {i.time.value for i in timeline.completed(Action.COMMIT)}


def takeover_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if "standby taking over writer" in ln]


def test_active_killed_mid_batch_standby_takes_over_and_every_record_lands_once(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    drivers: Callable[..., Driver],
) -> None:
    topic = topic_factory("standby-kill")
    produce_sample_events(kafka_bootstrap, topic, 1200, 3)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "table")
    conf = str(write_config_file(cfg, tmp_path / "c.toml"))
    standby = drivers(["--config", conf, "--once", "--standby"], tmp_path / "standby.log")
    standby.wait_for("standby warm")
    # The active writer commits one batch and is killed after writing the files of its second.
    active = drivers(
        ["--config", conf, "--once"],
        tmp_path / "active.log",
        {"LAKESINK_CRASH_AT": "after-write", "LAKESINK_CRASH_AFTER_BATCHES": "1"},
    )
    assert active.wait() == -signal.SIGKILL, active.output[-3000:]
    killed_at = time.monotonic()
    active.kill()  # its JVM and Python workers, as a lost machine would lose them
    assert len(completed_commits(cfg)) == 1
    assert HudiTable.open(cfg.table_storage).timeline().inflight_or_requested()

    assert standby.wait() == 0, standby.output[-3000:]
    took_s = time.monotonic() - killed_at
    [line] = takeover_lines(standby.output)  # one clear line says who took over and why
    assert "has not renewed its liveness" in line and cfg.writer_id in line, line
    timeline = HudiTable.open(cfg.table_storage).timeline()
    assert not timeline.inflight_or_requested()
    assert len(timeline.completed(Action.ROLLBACK)) == 1  # the dead batch, rolled back
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == 1200
    print(f"kill to caught up through the standby: {took_s:.1f}s")


def test_paused_active_is_taken_over_and_fenced_when_it_resumes(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    drivers: Callable[..., Driver],
) -> None:
    topic = topic_factory("standby-pause")
    produce_sample_events(kafka_bootstrap, topic, 1200, 3)
    # Every commit of the active waits 2 s before it takes the lock and publishes: the pause
    # lands in that wait, with the batch's files written and its instant inflight.
    # (this standby warms its Python workers only, no warm-up query: the other test has one)
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        tmp_path / "table",
        trigger__interval__s=0.5,
        standby__warmup__query=False,
    )
    conf = str(write_config_file(cfg, tmp_path / "c.toml"))
    active_conf = str(
        write_config_file(
            cfg.with_overrides({"commit.publish.delay.s": 2.0}), tmp_path / "active.toml"
        )
    )
    standby = drivers(["--config", conf, "--once", "--standby"], tmp_path / "standby.log")
    standby.wait_for("standby warm")
    active = drivers(["--config", active_conf], tmp_path / "active.log")  # continuous
    deadline = time.monotonic() + 120
    while not completed_commits(cfg) or not (
        HudiTable.open(cfg.table_storage).timeline().inflight_or_requested()
    ):
        assert active.proc.poll() is None, active.output[-3000:]
        assert time.monotonic() < deadline, active.output[-3000:]
        time.sleep(0.1)
    time.sleep(0.5)  # the second batch is written (a few hundred rows) and waits to publish
    os.kill(active.proc.pid, signal.SIGSTOP)  # the driver only: its JVM keeps running
    paused = completed_commits(cfg)

    assert standby.wait() == 0, standby.output[-3000:]  # took over and caught up
    [line] = takeover_lines(standby.output)
    assert "has not renewed its liveness" in line, line
    taken_over = completed_commits(cfg)
    assert taken_over > paused
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_lakesink == 1200

    os.kill(active.proc.pid, signal.SIGCONT)
    assert active.wait(60) == FencedError.exit_code, active.output[-3000:]
    assert "fenced" in active.output.lower() or "took over" in active.output
    # The resumed zombie published nothing: the table is as the standby left it.
    assert completed_commits(cfg) == taken_over
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == 1200


def test_the_liveness_file_is_kept_by_default_and_not_when_turned_off(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """An ingestion leaves its liveness file marked stopped (a standby takes over at once);
    with standby.liveness.enabled=false it writes none (no PUT per interval on an object
    store), and `ingest --standby` refuses that setting in one line."""
    from integration.conftest import run_ingestion

    from lakesink.cli.ingest import run_ingest
    from lakesink.errors import ConfigError
    from lakesink.spark.liveness_file import liveness_key

    topic = topic_factory("liveness")
    produce_sample_events(kafka_bootstrap, topic, 20, 1)
    kept = ingest_config(kafka_bootstrap, topic, tmp_path / "kept")
    assert run_ingestion(kept, spark).records == 20
    stopped = kept.table_storage.read(liveness_key(kept))
    assert b"stopped" in stopped, stopped
    off = ingest_config(kafka_bootstrap, topic, tmp_path / "off", standby__liveness__enabled=False)
    assert run_ingestion(off, spark).records == 20
    assert not off.table_storage.exists(liveness_key(off))
    with pytest.raises(ConfigError, match=r"standby\.liveness\.enabled=false"):
        run_ingest(off, once=True, standby=True)
