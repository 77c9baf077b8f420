"""Ingestion into S3 through the fault proxy (tests/s3_faults.py) in front of the S3 server:
transient errors, throttling, dropped connections and timeouts are retried with backoff and the
run lands every record once; a fault that outlasts the retries ends in one clear line and the
next run completes exactly once; a publish whose response is lost is recognised as landed and
never published twice.
Every check reads the table straight from the server (hudi-rs, lakesink's reader) against Kafka."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import audit_config, ingest_config, run_ingestion, write_config_file
from integration.table_stores import table_at
from s3_faults import Delay, Drop, Error, FaultProxy
from s3_server import S3Server

from lakesink.config import LakesinkConfig
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.kafka.producer import produce_sample_events

pytestmark = pytest.mark.integration

PUBLISH = r"\.commit(\?|$)"  # the completed instant file (versions 6 and 8), not .requested


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server.endpoint_url) as p:
        yield p


def _configs(
    proxy: FaultProxy,
    kafka_bootstrap: str,
    topic: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    **overrides: Any,
) -> tuple[LakesinkConfig, LakesinkConfig]:
    """The ingestion's config (through the proxy, short timeouts and backoff) and the same
    table read straight from the server, for the checks."""
    where = table_at("s3", tmp_path, request)
    common = {**where.overrides, "kafka__max__records__per__batch": 100}
    faulty = {
        **common,
        "storage__s3__endpoint": proxy.endpoint_url,
        "storage__request__timeout__s": 2.0,
        "storage__retry__backoff__initial__s": 0.05,
        "storage__retry__backoff__max__s": 0.5,
        **overrides,
    }
    via_proxy = ingest_config(kafka_bootstrap, topic, where.path, **faulty)  # type: ignore[arg-type]
    direct = ingest_config(kafka_bootstrap, topic, where.path, **common)  # type: ignore[arg-type]
    return via_proxy, direct


def _assert_exactly_once(direct: LakesinkConfig, records: int) -> None:
    report = audit_config(direct)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == report.kafka_records == records


def test_s3_transient_errors_throttling_drops_and_timeouts_are_retried_and_land_once(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    proxy: FaultProxy,
) -> None:
    topic = topic_factory("s3faults")
    produce_sample_events(kafka_bootstrap, topic, 600, 3)
    cfg, direct = _configs(proxy, kafka_bootstrap, topic, tmp_path, request)
    # from the store probe and the table's creation on: 6 commits at least
    rules = [
        proxy.inject(Error(503, "SlowDown"), method="PUT", times=4),
        proxy.inject(Error(500, "InternalError"), method="GET", times=3),
        proxy.inject(Error(503, "ServiceUnavailable"), method="GET", path="list-type", times=2),
        proxy.inject(Error(500, "InternalError"), method="HEAD", times=2),
        proxy.inject(Drop(), method="PUT", path=r"\.parquet", times=2),
        proxy.inject(Drop(), method="PUT", path=r"\.hoodie/", skip=5, times=2),
        proxy.inject(Delay(3.0), method="GET", path=r"\.hoodie/", skip=3),  # past the 2 s timeout
        proxy.inject(Error(503, "SlowDown"), method="PUT", path=PUBLISH),
    ]
    assert run_ingestion(cfg, spark).records == 600
    assert all(r.spent for r in rules), [r for r in rules if not r.spent]
    _assert_exactly_once(direct, 600)
    table = HudiTable.open(direct.table_storage)
    assert not table.timeline().inflight_or_requested()


def test_s3_fault_outlasting_the_retries_ends_in_one_line_and_the_next_run_is_exactly_once(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    proxy: FaultProxy,
    s3_server: S3Server,
    cli: Callable[..., Any],
) -> None:
    topic = topic_factory("s3outage")
    produce_sample_events(kafka_bootstrap, topic, 500, 2)
    cfg, direct = _configs(
        proxy,
        kafka_bootstrap,
        topic,
        tmp_path,
        request,
        storage__retry__max=2,
        storage__retry__timeout__s=5.0,
    )
    conf = write_config_file(cfg, tmp_path / "c.toml")
    # the third publish and every retry of it are throttled: the store is down for it
    proxy.inject(Error(503, "SlowDown"), method="PUT", path=PUBLISH, skip=2, times=10_000)
    failed = cli(["ingest", "--config", str(conf), "--once"], timeout_s=300)
    assert failed.returncode != 0, failed.stdout[-3000:]
    errors = [line for line in failed.stdout.splitlines() if line.startswith("lakesink: error:")]
    assert len(errors) == 1, failed.stdout[-3000:]
    assert "Traceback" not in failed.stdout
    assert s3_server.secret_access_key not in failed.stdout
    assert "kept answering 503" in errors[0] and "SlowDown" in errors[0], errors[0]
    # nothing half-visible: the readers see exactly the two published commits' records
    table = HudiTable.open(direct.table_storage)
    assert len(table.timeline().completed_data_instants()) == 2
    _assert_exactly_once(direct, 200)  # kafka_records counts what the commits say they hold

    proxy.clear()
    assert run_ingestion(cfg, spark).records == 300  # the rest, once
    _assert_exactly_once(direct, 500)


def test_s3_publish_whose_response_is_lost_is_recognised_as_landed_and_counted_once(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    proxy: FaultProxy,
) -> None:
    """The publish PUT (If-None-Match: *) lands but its response is lost: the client's retry
    meets 412 on the writer's own commit. The writer reads the object back, finds its own bytes
    and carries on: the run succeeds, every record once, and the next run has nothing to do."""
    topic = topic_factory("s3lost")
    produce_sample_events(kafka_bootstrap, topic, 400, 2)
    cfg, direct = _configs(proxy, kafka_bootstrap, topic, tmp_path, request)
    lost = proxy.inject(Drop(after_forward=True), method="PUT", path=PUBLISH, skip=1)
    assert run_ingestion(cfg, spark).records == 400
    assert lost.spent
    _assert_exactly_once(direct, 400)
    assert run_ingestion(cfg, spark).records == 0
    _assert_exactly_once(direct, 400)
