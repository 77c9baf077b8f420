"""A streaming ingestion (Spark, real broker) and a backfill (Spark batch job) write into one
table at the same time: every row lands once, the streaming writer's exactly-once audit passes,
hudi-rs and lakesink's reader agree, and rerunning the backfill commits nothing twice."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from integration.conftest import audit_config, ingest_config, run_ingestion
from lakesink.audit import COORDINATES, read_with_hudi_rs
from lakesink.kafka.producer import produce_sample_events
from lakesink.services.host import StandaloneServices
from lakesink.spark.backfill import run_backfill
from lakesink.spark.pipeline import Ingestion, table_config_for
from lakesink.table.avro_schema import META_COLUMNS
from lakesink.table.hudi_table import HudiTable
from lakesink.table.reader import TableReader

pytestmark = pytest.mark.integration


def _history_files(
    spark: Any, bootstrap: str, topic: str, scratch: Path, out: Path, events: int
) -> None:
    """Backfill input: rows of another topic, exported as parquet files without meta columns."""
    produce_sample_events(bootstrap, topic, events, 1)
    cfg = ingest_config(bootstrap, topic, scratch, writer__id="history-export")
    run_ingestion(cfg, spark)
    rows = TableReader(HudiTable.open(scratch)).snapshot()
    rows = rows.drop_columns([c for c in META_COLUMNS if c in rows.column_names])
    out.mkdir()
    third = rows.num_rows // 3
    for i in range(3):
        end = rows.num_rows if i == 2 else (i + 1) * third
        pq.write_table(rows.slice(i * third, end - i * third), out / f"part-{i}.parquet")


def test_streaming_and_backfill_together_land_every_row_once(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    live, hist = topic_factory("live"), topic_factory("hist")
    source = tmp_path / "history"
    _history_files(spark, kafka_bootstrap, hist, tmp_path / "scratch", source, 300)
    produce_sample_events(kafka_bootstrap, live, 600, 2)
    cfg = ingest_config(kafka_bootstrap, live, tmp_path / "t", kafka__max__records__per__batch=100)
    HudiTable.create(cfg["table.path"], table_config_for(cfg))
    errors: list[BaseException] = []

    def stream() -> None:
        try:
            Ingestion(cfg, spark).run(once=True, timeout_s=120)
        except BaseException as e:
            errors.append(e)

    streaming = threading.Thread(target=stream)
    streaming.start()
    services = StandaloneServices(
        cfg["table.path"], heartbeat_interval_s=1, heartbeat_tolerance_s=10
    )
    result = run_backfill(spark, cfg["table.path"], source, services=services)
    streaming.join(180)
    assert not errors, errors
    assert result.instant_time is not None and result.records == 300

    report = audit_config(cfg)  # the streaming writer: exactly once against Kafka
    assert report.ok, report.problems
    assert report.kafka_records == 600
    table = HudiTable.open(cfg["table.path"])
    by_rs = read_with_hudi_rs(str(table.base_path))
    by_ls = TableReader(table).snapshot(columns=COORDINATES)
    coords = lambda t: sorted(zip(*(t.column(c).to_pylist() for c in COORDINATES), strict=True))  # noqa: E731
    assert coords(by_rs) == coords(by_ls)
    assert len(coords(by_rs)) == len(set(coords(by_rs))) == 900
    assert sum(1 for c in coords(by_rs) if c[0] == hist) == 300
    writers = {
        table.timeline().commit_metadata(i).extra.get("lakesink.writer_id")
        for i in table.timeline().completed()
    }
    assert result.writer_id in writers and cfg.writer_id in writers

    # the same backfill again, through the CLI: recognised, nothing written twice
    again = cli(["backfill", "--table", cfg["table.path"], "--from", str(source), "--json"])
    assert again.returncode == 0, again.stdout
    assert json.loads(again.stdout[again.stdout.index("{") :])["already_committed"] is True
    assert read_with_hudi_rs(str(table.base_path)).num_rows == 900
