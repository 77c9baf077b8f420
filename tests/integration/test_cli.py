"""The `lakesink` command as a user runs it: the demo, status, verify (and its failure exit code),
table inspection, config errors without tracebacks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import ingest_config, run_ingestion, write_config_file

from lakesink.audit import COORDINATES, read_with_hudi_rs
from lakesink.kafka.producer import produce_sample_events

pytestmark = pytest.mark.integration


def test_status_verify_and_table_commands_after_an_async_ingestion(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    topic = topic_factory("cli")
    produce_sample_events(kafka_bootstrap, topic, 200, 2)
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        tmp_path / "t",
        commit__mode="async",
        kafka__max__records__per__batch=50,
    )
    run_ingestion(cfg, spark)
    produce_sample_events(kafka_bootstrap, topic, 10, 2, first_event_id=200, create=False)
    conf = str(write_config_file(cfg, tmp_path / "c.toml"))

    status = cli(["status", "--config", conf, "--json"])
    assert status.returncode == 0, status.stdout
    st = json.loads(status.stdout[status.stdout.index("{") :])
    assert sum(p["lag"] for p in st["partitions"]) == 10
    assert st["pending"]["pending_epochs"] == []

    verify = cli(["verify", "--config", conf])
    assert verify.returncode == 0 and "PASS" in verify.stdout, verify.stdout

    timeline = cli(["table", "timeline", cfg["table.path"], "--json"])
    assert timeline.returncode == 0
    rows = json.loads(timeline.stdout[timeline.stdout.index("[") :])
    assert sum(int(r["records"] or 0) for r in rows) == 200

    # archival from the command line: status shows it, verify reads the archived commits
    archived = cli(
        ["table", "archive", cfg["table.path"], "--min-instants", "1", "--max-instants", "1"]
    )
    assert archived.returncode == 0 and "archive: moved" in archived.stdout, archived.stdout
    status = cli(["status", "--config", conf, "--json"])
    st = json.loads(status.stdout[status.stdout.index("{") :])
    assert st["table"]["archived_up_to"] is not None
    assert st["table"]["active_instants"] < len(rows)
    verify = cli(["verify", "--config", conf])
    assert verify.returncode == 0 and "PASS" in verify.stdout, verify.stdout

    # Damage the table behind lakesink's back: verify must fail and say where.
    victim = next(Path(cfg["table.path"]).rglob("*.parquet"))
    victim.unlink()
    broken = cli(["verify", "--config", conf])
    assert broken.returncode != 0
    assert str(victim.name) in broken.stdout or "missing" in broken.stdout, broken.stdout


def test_bad_config_value_is_one_clear_line(tmp_path: Path, cli: Callable[..., Any]) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text(
        '"kafka.bootstrap.servers" = "x:1"\n"kafka.topics" = "t"\n'
        '"value.schema" = "id BIGINT"\n"table.path" = "/tmp/x"\n"commit.mode" = "later"\n'
    )
    run = cli(["ingest", "--config", str(conf)])
    assert run.returncode == 2
    assert "commit.mode='later' is not valid" in run.stdout
    assert "Traceback" not in run.stdout


def test_demo_ingests_its_sample_events_exactly_once(
    tmp_path: Path, cli: Callable[..., Any]
) -> None:
    # the README's first command on embedded defaults: its own broker, sample events, Spark
    # ingestion into a Hudi table, the audit's verdict
    run = cli(["demo", "--events", "3000", "--dir", str(tmp_path / "lake")])
    assert run.returncode == 0, run.stdout[-3000:]
    assert "hudi-rs reads 3,000 rows" in run.stdout and "PASS" in run.stdout, run.stdout[-3000:]
    rows = read_with_hudi_rs(str(tmp_path / "lake" / "demo_events"))
    assert rows.num_rows == 3000
    assert len(set(zip(*(rows.column(c).to_pylist() for c in COORDINATES), strict=True))) == 3000
