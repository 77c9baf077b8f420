"""commit.mode=async: the writer pre-commits each batch to a durable pending-commit store and a
committer publishes in order. The driver is killed at every point between pre-commit and
publish, and during recovery itself, with both stores (SQLite and a real PostgreSQL server);
after a restart the exactly-once audit must pass and no epoch may stay Pending."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import audit_config, ingest_config, write_config_file
from interop.compare import assert_java_hudi_agrees

from lakesink.config import LakesinkConfig
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.kafka.producer import produce_sample_events
from lakesink.spark.pipeline import pending_store_for

pytestmark = pytest.mark.integration
pytest_plugins = ["pg_fixture"]

KILLED = -signal.SIGKILL


def async_config(
    bootstrap: str, topic: str, tmp_path: Path, store: str, dsn: str | None, **overrides: Any
) -> LakesinkConfig:
    extra: dict[str, Any] = {"commit__mode": "async", "commit__pending__store": store, **overrides}
    if dsn:
        extra["postgres__dsn"] = dsn
    return ingest_config(bootstrap, topic, tmp_path / "t", **extra)


def pending_epochs(cfg: LakesinkConfig) -> list[int]:
    store = pending_store_for(cfg)
    try:
        return [e.epoch for e in store.pending(cfg.writer_id)]
    finally:
        store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def store_kind(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    if request.param == "postgres":
        return "postgres", str(request.getfixturevalue("postgres_dsn"))
    return "sqlite", None


def test_async_ingestion_is_exactly_once_and_leaves_nothing_pending(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    store_kind: tuple[str, str | None],
) -> None:
    from integration.conftest import run_ingestion

    topic = topic_factory("async")
    produce_sample_events(kafka_bootstrap, topic, 1000, 2)
    cfg = async_config(kafka_bootstrap, topic, tmp_path, *store_kind)
    result = run_ingestion(cfg, spark)
    assert result.records == 1000
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 1000
    assert pending_epochs(cfg) == []


# One chain of restarts per store: each run commits a batch (recovering what the run before
# left), then is killed at its point; N+1 driver starts prove what N kill-and-restart pairs
# would. (point, batches let through first)
ASYNC_CHAIN = [
    ("after-reconcile", "1"),  # written and reconciled, never pre-committed: dirty
    ("after-precommit", "1"),  # durable Pending, not published: recovery publishes it
    ("during-recovery", "0"),  # killed while publishing that Pending epoch: the next run does
    ("after-publish", "1"),  # published, never marked Committed: recovery is idempotent
]


def test_killed_between_precommit_and_publish_and_in_recovery_each_restart_ends_exactly_once(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
    store_kind: tuple[str, str | None],
    java_hudi: Any,
) -> None:
    topic = topic_factory("async-chain")
    records = 1200  # batches of 100: at most two per killed run, the rest for the last run
    produce_sample_events(kafka_bootstrap, topic, records, 3)
    cfg = async_config(
        kafka_bootstrap, topic, tmp_path, *store_kind, kafka__max__records__per__batch=100
    )
    conf = write_config_file(cfg, tmp_path / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    for point, after_batches in ASYNC_CHAIN:
        crashed = cli(
            args, env={"LAKESINK_CRASH_AT": point, "LAKESINK_CRASH_AFTER_BATCHES": after_batches}
        )
        assert crashed.returncode == KILLED, (point, crashed.stdout[-3000:])
        if point in ("after-precommit", "during-recovery"):
            assert pending_epochs(cfg), f"{point}: the pre-committed epoch is not Pending"
        report = audit_config(cfg)  # readers see a consistent table before recovery
        assert report.ok, (point, report.problems)
        assert report.rows_hudi_rs == report.rows_lakesink < records, point
    # the last run takes the rest in one batch: its many small commits would prove nothing more
    restarted = cli([*args, "--set", "kafka.max.records.per.batch=5000"])
    assert restarted.returncode == 0, restarted.stdout[-3000:]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == report.kafka_records == records
    assert pending_epochs(cfg) == []
    assert not HudiTable.open(cfg["table.path"]).timeline().inflight_or_requested()
    if store_kind[0] == "sqlite":  # epochs published by recovery, read by Java Hudi too
        assert_java_hudi_agrees(java_hudi, cfg["table.path"])


def test_postgres_store_down_gives_clear_error_and_loses_nothing(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
    postgres_server: Any,
) -> None:
    topic = topic_factory("pgdown")
    produce_sample_events(kafka_bootstrap, topic, 500, 2)
    cfg = async_config(kafka_bootstrap, topic, tmp_path, "postgres", postgres_server.dsn)
    conf = write_config_file(cfg, tmp_path / "c.toml")
    args = ["ingest", "--config", str(conf), "--once"]
    postgres_server.stop()
    try:
        down = cli(args, timeout_s=120)
    finally:
        postgres_server.start()
    assert down.returncode not in (0, KILLED)
    assert "unreachable" in down.stdout or "PendingStore" in down.stdout, down.stdout[-3000:]
    assert audit_config(cfg).ok
    up = cli(args)
    assert up.returncode == 0, up.stdout[-3000:]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 500
