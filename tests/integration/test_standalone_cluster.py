"""The same ingestion on a Spark standalone cluster with no shared disk: master and two workers
on loopback, each worker and its executors in their own working folder, the table on the S3
server (Spark's checkpoint stays on the driver), one executor killed mid-run: still exactly
once."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import audit_config, ingest_config, write_config_file
from integration.spark_cluster import StandaloneCluster
from integration.table_stores import table_at

from lakesink.kafka.producer import produce_sample_events

pytestmark = pytest.mark.integration


def test_ingestion_into_s3_on_a_cluster_without_shared_disk_survives_an_executor_kill(
    spark_cluster: StandaloneCluster,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
    request: pytest.FixtureRequest,
) -> None:
    cluster = spark_cluster  # the session's: other applications may have run on it before
    apps_before = {p.name for p in cluster.work_dir.glob("work*/app-*")}
    where = table_at("s3", tmp_path, request)
    topic = topic_factory("cluster")
    produce_sample_events(kafka_bootstrap, topic, 3000, 4)
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        where.path,  # type: ignore[arg-type]
        spark__master=cluster.master_url,
        kafka__max__records__per__batch=500,
        **where.overrides,
    )
    conf = write_config_file(cfg, tmp_path / "c.toml")
    killed: list[int] = []

    def kill_one_executor() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            pids = cluster.executor_pids()
            if pids and (cfg.checkpoint_location / "commits" / "0").exists():
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])
            time.sleep(0.2)

    killer = threading.Thread(target=kill_one_executor, daemon=True)
    killer.start()
    run = cli(["ingest", "--config", str(conf), "--once"], timeout_s=400)
    killer.join(timeout=5)
    assert run.returncode == 0, run.stdout[-4000:]
    assert killed, "no executor process was found to kill"
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == 3000
    # both workers ran executors of this run, each in its own folder, and no table file is on
    # local disk
    ours = {p.name for p in cluster.work_dir.glob("work*/app-*")} - apps_before
    assert len(ours) == 1, ours
    assert all(
        list((cluster.work_dir / f"work{n}").glob(f"{next(iter(ours))}/*")) for n in range(2)
    )
    assert not list(tmp_path.rglob("*.parquet"))
    assert not list(cluster.work_dir.rglob("*.parquet"))
