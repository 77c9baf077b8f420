"""The short crash soak (the long one is `python benchmarks/soak.py --minutes 30`): streaming
ingestion under randomized faults for about a minute and a half with a fixed seed, with inline
clean, clustering and archival every 3 commits, then the exactly-once audit. Zero loss, zero
duplicates, and faults must really have been injected."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def run_soak(tmp_path: Path, *args: str) -> tuple[dict[str, Any], str, int]:
    """Run benchmarks/soak.py with `args` in its own process group (killed whole if it
    outlives 10 minutes); its JSON result, its output and its exit status."""
    out = tmp_path / "soak.json"
    proc = subprocess.Popen(
        [sys.executable, str(SOAK), *args, "--workdir", str(tmp_path / "work"), "--json", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        stdout, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert out.exists(), stdout[-5000:]
    return json.loads(out.read_text()), stdout, proc.returncode


def test_short_soak_with_random_faults_loses_and_duplicates_nothing(
    tmp_path: Path, broker_kind: str
) -> None:
    result, stdout, returncode = run_soak(
        tmp_path,
        *("--minutes", "1", "--seed", "20240611", "--broker", broker_kind),
        *("--partitions", "4", "--fault-interval", "3", "7", "--patience-s", "40"),
        *("--broker-restart-gap-s", "8", "--services-every", "3", "--final-timeout-s", "240"),
    )
    assert result["ok"], (result["problems"], stdout[-5000:])
    assert result["duplicates"] == 0
    assert result["missing"] == 0
    assert result["acked_events_missing"] == 0
    assert result["records_in_table"] == result["records_in_kafka"] > 0
    # the producer kept producing through the faults (200 events/s nominal for 60 s)
    assert result["records_produced"] >= 200 * 60 // 3, stdout[-5000:]
    broker_lost = result["acked_events_lost_by_broker"]
    if broker_kind == "kafka":  # Apache Kafka keeps every acknowledged record (acks=all)
        assert result["faults"].get("broker-kill", 0) >= 1, result["faults"]
        assert broker_lost == 0 and result["offsets_rewritten_by_broker"] == 0
        assert result["records_produced"] <= result["records_in_kafka"]
    else:  # noida-db may lose acknowledged records over a restart: its loss, not lakesink's
        assert result["records_produced"] - broker_lost <= result["records_in_kafka"]
    assert result["faults_total"] >= 5, result["faults"]
    assert len([k for k, n in result["faults"].items() if n]) >= 2, result["faults"]
    assert returncode == 0


def test_short_soak_into_an_iceberg_table_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """The same soak into an Iceberg table on Apache Kafka: killed drivers and Python workers,
    broker kills, crash points up to after the catalog commit, failing task attempts, inline
    expire-snapshots and rewrite-data-files every 3 commits; then every record exactly once by
    pyiceberg, DuckDB and the soak's own count against Kafka's logs and the acked events."""
    result, stdout, returncode = run_soak(
        tmp_path,
        *("--minutes", "1", "--seed", "20261125", "--broker", "kafka", "--format", "iceberg"),
        *("--partitions", "3", "--fault-interval", "3", "7", "--patience-s", "40"),
        *("--broker-restart-gap-s", "8", "--services-every", "3", "--final-timeout-s", "240"),
    )
    assert result["ok"], (result["problems"], stdout[-5000:])
    assert result["duplicates"] == result["missing"] == result["acked_events_missing"] == 0
    assert result["records_in_table"] == result["records_in_kafka"] > 0
    assert result["records_produced"] <= result["records_in_kafka"]
    assert result["acked_events_lost_by_broker"] == 0
    (writer,) = result["writers"].values()
    assert writer["audit_ok"] and set(writer["audit_readers"]) >= {"pyiceberg", "duckdb"}
    assert "kill-lock-holder" not in result["faults"]
    assert result["faults_total"] >= 3, result["faults"]
    assert len([k for k, n in result["faults"].items() if n]) >= 2, result["faults"]
    assert returncode == 0
