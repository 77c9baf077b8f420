"""The crash matrix: the driver is killed with SIGKILL at each step of the commit lifecycle
(its JVM and Python workers die with it); a restart must finish or roll back the inflight
instant, and the exactly-once audit (hudi-rs and lakesink's reader against Kafka) must pass.
Local tables get one test per step; on S3 the steps run as one chain of restarts on one table,
each restart recovering the previous crash before it is killed at the next step."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import audit_config, ingest_config, write_config_file
from integration.table_stores import table_at
from interop.compare import assert_java_hudi_agrees

from lakesink.faults import SYNC_CRASH_POINTS
from lakesink.kafka.producer import produce_sample_events
from lakesink.table.hudi_table import HudiTable

pytestmark = pytest.mark.integration

KILLED = -signal.SIGKILL
STEPS = [p for p in SYNC_CRASH_POINTS if p != "during-rollback"]
LEAVES_INFLIGHT = ("after-begin", "after-write", "after-reconcile")


# Local tables: one test per step, batches on the direct task path (spark/direct.py); the
# DataFrame path (transformations) once, where a batch's files are written and not yet
# reconciled. S3: one chain over every step, below.
KILL_CASES = [pytest.param("local", point, "direct", id=f"{point}-local") for point in STEPS] + [
    pytest.param("local", "after-write", "dataframe", id="after-write-local-dataframe")
]


@pytest.mark.parametrize(("store", "point", "write_path"), KILL_CASES)
def test_driver_killed_at_each_commit_step_then_restart_is_exactly_once(
    point: str,
    store: str,
    write_path: str,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
    request: pytest.FixtureRequest,
) -> None:
    topic = topic_factory(point)
    produce_sample_events(kafka_bootstrap, topic, 900, 3)
    where = table_at(store, tmp_path, request)
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        where.path,  # type: ignore[arg-type]
        write__path=write_path,
        **where.overrides,
    )
    conf = write_config_file(cfg, tmp_path / "c.toml")
    # One batch commits cleanly, the second dies at `point`.
    crashed = cli(
        ["ingest", "--config", str(conf), "--once"],
        env={"LAKESINK_CRASH_AT": point, "LAKESINK_CRASH_AFTER_BATCHES": "1"},
    )
    assert crashed.returncode == KILLED, crashed.stdout[-3000:]
    if point in LEAVES_INFLIGHT:
        assert HudiTable.open(cfg.table_storage).timeline().inflight_or_requested()
    # A reader sees a consistent table even before recovery.
    assert audit_config(cfg).ok
    restarted = cli(["ingest", "--config", str(conf), "--once"])
    assert restarted.returncode == 0, restarted.stdout[-3000:]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == 900
    assert not HudiTable.open(cfg.table_storage).timeline().inflight_or_requested()
    if point in ("after-write", "after-publish"):
        # a rolled-back and a replayed instant
        assert_java_hudi_agrees(request.getfixturevalue("java_hudi"), cfg["table.path"])


def test_s3_driver_killed_at_each_commit_step_in_turn_each_restart_recovers_and_ends_exactly_once(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
    request: pytest.FixtureRequest,
) -> None:
    """The S3 half of the matrix on one table: run N commits one batch and is killed at step N
    in its second; run N+1 must first finish or roll back what run N left (else it could not
    commit its own first batch and reach step N+1). After every kill a reader sees a
    consistent table; the last run, without a crash, lands the rest exactly once."""
    topic = topic_factory("s3chain")
    records = 1500  # 15 batches of 100: two per killed run, the rest for the last run
    produce_sample_events(kafka_bootstrap, topic, records, 3)
    where = table_at("s3", tmp_path, request)
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        where.path,  # type: ignore[arg-type]
        kafka__max__records__per__batch=100,
        **where.overrides,
    )
    conf = write_config_file(cfg, tmp_path / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    for point in STEPS:
        crashed = cli(args, env={"LAKESINK_CRASH_AT": point, "LAKESINK_CRASH_AFTER_BATCHES": "1"})
        assert crashed.returncode == KILLED, (point, crashed.stdout[-3000:])
        inflight = HudiTable.open(cfg.table_storage).timeline().inflight_or_requested()
        assert bool(inflight) == (point in LEAVES_INFLIGHT), (point, inflight)
        # A reader sees a consistent table before recovery.
        report = audit_config(cfg)
        assert report.ok, (point, report.problems)
        assert report.rows_hudi_rs == report.rows_lakesink < records, point
    restarted = cli(args)
    assert restarted.returncode == 0, restarted.stdout[-3000:]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == report.kafka_records == records
    assert not HudiTable.open(cfg.table_storage).timeline().inflight_or_requested()


def test_crash_during_rollback_then_restart_finishes_it(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    topic = topic_factory("rb")
    produce_sample_events(kafka_bootstrap, topic, 600, 2)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t")
    conf = write_config_file(cfg, tmp_path / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    assert cli(args, env={"LAKESINK_CRASH_AT": "after-write"}).returncode == KILLED
    assert cli(args, env={"LAKESINK_CRASH_AT": "during-rollback"}).returncode == KILLED
    restarted = cli(args)
    assert restarted.returncode == 0, restarted.stdout[-3000:]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 600


def test_broker_restart_between_runs_loses_nothing(
    fresh_broker: Any, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    bootstrap = fresh_broker.bootstrap_servers
    produce_sample_events(bootstrap, "restart", 500, 2)
    cfg = ingest_config(bootstrap, "restart", tmp_path / "t")
    conf = write_config_file(cfg, tmp_path / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    assert (
        cli(
            args, env={"LAKESINK_CRASH_AT": "after-write", "LAKESINK_CRASH_AFTER_BATCHES": "0"}
        ).returncode
        == KILLED
    )
    fresh_broker.restart()
    produce_sample_events(bootstrap, "restart", 100, 2, first_event_id=500, create=False)
    run = cli(args)
    assert run.returncode == 0, run.stdout[-3000:]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 600
