"""The API examples as users run them: the notebook-style script with the session's own
SparkSession, and the `spark-submit` application on a standalone cluster."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyspark
import pytest
from integration.conftest import SHORT_LIVED_DRIVER_JVM, audit_config, ingest_config
from integration.spark_cluster import StandaloneCluster

from lakesink.kafka.producer import produce_sample_events

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_notebook_example_ingests_into_the_users_spark_session_and_reads_back(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = topic_factory("notebook")
    produce_sample_events(kafka_bootstrap, topic, 500, 2)
    table = tmp_path / "notebook_events"
    monkeypatch.setenv("EXAMPLE_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("EXAMPLE_TOPIC", topic)
    monkeypatch.setenv("EXAMPLE_TABLE", str(table))
    scope = runpy.run_path(str(EXAMPLES / "notebook.py"), run_name="__main__")
    assert scope["spark"] is spark  # the session the notebook already had
    assert scope["status"].records == 500
    rows = {r["kafka_partition"]: r for r in scope["per_partition"].collect()}
    assert {p: (r["rows"], r["distinct_offsets"]) for p, r in rows.items()} == {
        0: (250, 250),
        1: (250, 250),
    }
    assert "500 records" in capsys.readouterr().out
    cfg = ingest_config(kafka_bootstrap, topic, table, writer__id=scope["handle"].writer_id)
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 500


def test_spark_submit_app_on_a_standalone_cluster_ingests_every_record_once(
    spark_cluster: StandaloneCluster,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = topic_factory("submit")
    produce_sample_events(kafka_bootstrap, topic, 1000, 2)
    table = tmp_path / "submitted"
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = {
        **os.environ,
        **SHORT_LIVED_DRIVER_JVM,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_HOME": str(spark_submit.parents[1]),
    }
    run = subprocess.run(
        [
            str(spark_submit),
            "--master",
            spark_cluster.master_url,
            "--conf",
            "spark.driver.host=127.0.0.1",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.executor.memory=1g",
            str(EXAMPLES / "spark_submit_app.py"),
            "--bootstrap-servers",
            kafka_bootstrap,
            "--topic",
            topic,
            "--table",
            str(table),
            "--once",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    # no batch cap of its own: what was produced before the start is one batch, one commit
    assert "ingested 1000 records in 1 commits" in run.stdout, run.stdout
    cfg = ingest_config(kafka_bootstrap, topic, table, writer__id=None)
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == 1000
