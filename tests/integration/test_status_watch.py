"""`lakesink status --watch` against a real table and broker, rendered by rich into a console
object for a couple of refreshes."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import ingest_config, run_ingestion, write_config_file
from rich.console import Console

from lakesink.cli.main import main
from lakesink.cli.status import collect_status
from lakesink.cli.watch import instant_columns, watch_status
from lakesink.kafka.producer import produce_sample_events

pytestmark = pytest.mark.integration


def test_status_watch_shows_lag_rates_and_recent_instants_on_each_refresh(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    topic = topic_factory("watch")
    produce_sample_events(kafka_bootstrap, topic, 300, 2)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t", kafka__max__records__per__batch=100)
    run_ingestion(cfg, spark)
    produce_sample_events(kafka_bootstrap, topic, 40, 2, first_event_id=300, create=False)
    st = collect_status(cfg)
    instants = st["table"]["instants"]
    assert len(instants) >= 3

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=140, color_system=None)
    frames = watch_status(cfg, interval_s=0.2, collect=collect_status, console=console, refreshes=2)
    text = out.getvalue()
    assert frames == 2
    assert "refresh 1" in text and "refresh 2" in text
    for p in (0, 1):  # committed 150, high watermark 170, lag 20 on each partition
        row = next(ln for ln in text.splitlines() if f"{topic}:{p}" in ln)
        assert [c for c in row.replace("│", " ").split() if c[0].isdigit()][:3] == [
            "150",
            "170",
            "20",
        ], row
    assert "total lag 40" in text
    assert "0 offsets/s" in text  # nothing ingested between the two refreshes
    for instant in instants[-3:]:  # as UTC times, with the raw instant time beside
        when, _, _, raw = instant_columns(instant)
        assert when and raw and when in text and raw in text


def test_status_watch_refuses_json_and_a_non_positive_interval(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = ingest_config(kafka_bootstrap, "t", tmp_path / "t")
    conf = str(write_config_file(cfg, tmp_path / "c.toml"))
    assert main(["status", "--config", conf, "--watch", "--json"]) == 2
    assert "--watch and --json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["status", "--config", conf, "--watch", "0"])
    assert usage.value.code == 2
    assert "not a positive number" in capsys.readouterr().err
