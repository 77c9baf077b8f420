"""A streaming ingestion (Spark, real broker) and a backfill (Spark batch job) write into one
table at the same time: every row lands once, the streaming writer's exactly-once audit passes,
hudi-rs and lakesink's reader agree, and rerunning the backfill commits nothing twice (also once
its commit was archived).
`lakesink backfill` on the command line is checked for its arguments only (a Spark start in a
subprocess costs half a minute here)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from integration.conftest import audit_config, ingest_config

from lakesink.formats.hudi.audit import COORDINATES, read_with_hudi_rs
from lakesink.formats.hudi.control import LockedCommitControl
from lakesink.formats.hudi.services.archival import ArchivePolicy, archive
from lakesink.formats.hudi.table.avro_schema import META_COLUMNS
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.kafka.producer import produce_sample_events
from lakesink.protocol.instant import Action
from lakesink.spark.backfill import run_backfill
from lakesink.spark.pipeline import Ingestion

pytestmark = pytest.mark.integration


def _history_files(schema: pa.Schema, topic: str, out: Path, events: int) -> None:
    """Backfill input with the table's data columns: rows of another topic (coordinates set,
    other columns null), as three parquet files."""
    data = pa.schema([f for f in schema if f.name not in META_COLUMNS])
    columns = {
        "kafka_topic": pa.array([topic] * events, pa.string()),
        "kafka_partition": pa.array([0] * events, pa.int32()),
        "kafka_offset": pa.array(range(events), pa.int64()),
    }
    rows = pa.table(
        [
            columns[f.name].cast(f.type) if f.name in columns else pa.nulls(events, f.type)
            for f in data
        ],
        schema=data,
    )
    out.mkdir()
    third = events // 3
    for i in range(3):
        end = events if i == 2 else (i + 1) * third
        pq.write_table(rows.slice(i * third, end - i * third), out / f"part-{i}.parquet")


def _wait_for_committed(
    table_path: str, writer_id: str, records: int, timeout_s: float = 120
) -> None:
    """Until `writer_id`'s committed offsets add up to `records` (one producer, no gaps)."""
    from lakesink.formats.hudi.writer_state import committed_offsets_at

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sum(committed_offsets_at(table_path, writer_id).to_json().values()) >= records:
            return
        time.sleep(0.2)
    raise AssertionError(f"the streaming writer did not commit {records} records")


def _first_base_file(table_path: str, timeout_s: float = 90) -> Path:
    # a file a completed commit names: a file merely on disk may still be being written by the
    # stream's next batch (CI once read one at 0 bytes)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        timeline = HudiTable.open(table_path).timeline()
        for instant in timeline.completed():
            writes = timeline.commit_metadata(instant).writes
            if writes:
                return Path(table_path) / writes[0].path
        time.sleep(0.2)
    raise AssertionError("the streaming writer committed nothing")


def test_streaming_and_backfill_together_land_every_row_once(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    java_hudi: Any,
) -> None:
    from interop.compare import assert_java_hudi_agrees

    live, hist = topic_factory("live"), topic_factory("hist")
    source = tmp_path / "history"
    produce_sample_events(kafka_bootstrap, live, 500, 2)
    cfg = ingest_config(
        kafka_bootstrap,
        live,
        tmp_path / "t",
        kafka__max__records__per__batch=100,
        trigger__interval__s=0.5,
    )
    errors: list[BaseException] = []
    # a continuous writer, stopped only once it committed records produced after the backfill
    # committed: the two writers' commits interleave however fast either one runs (the
    # ingestion creates the table before its thread starts)
    ingestion = Ingestion(cfg, spark)

    def stream() -> None:
        try:
            ingestion.run(timeout_s=300)
        except BaseException as e:
            errors.append(e)

    streaming = threading.Thread(target=stream)
    streaming.start()
    try:
        # the backfill starts once the stream committed (its files give the table's schema)
        _history_files(pq.read_schema(_first_base_file(cfg["table.path"])), hist, source, 300)
        services = LockedCommitControl(
            cfg["table.path"], heartbeat_interval_s=1, heartbeat_tolerance_s=10
        )
        result = run_backfill(spark, cfg["table.path"], source, control=services)
        produce_sample_events(kafka_bootstrap, live, 100, 2, first_event_id=500, create=False)
        _wait_for_committed(cfg["table.path"], cfg.writer_id, 600)
    finally:
        ingestion.stop()
        streaming.join(180)
    assert not streaming.is_alive() and not errors, errors
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

    assert any(i.time > result.instant_time for i in table.timeline().completed(Action.COMMIT))

    # the same backfill again: recognised by its id, nothing written twice
    again = run_backfill(spark, cfg["table.path"], source, control=services)
    assert again.instant_time is None and again.backfill_id == result.backfill_id
    assert read_with_hudi_rs(str(table.base_path)).num_rows == 900

    # and once archival moved the backfill's commit out of the active timeline (after one more
    # streamed batch, so every commit before it completed before it)
    produce_sample_events(kafka_bootstrap, live, 100, 2, first_event_id=600, create=False)
    Ingestion(cfg, spark).run(once=True, timeout_s=120)
    moved = archive(table, services, ArchivePolicy(min_instants=1, max_instants=1))
    assert result.instant_time in {i.time for i in moved.archived}, moved.held_back_by
    after_archival = run_backfill(spark, cfg["table.path"], source, control=services)
    assert after_archival.instant_time is None
    assert read_with_hudi_rs(str(table.base_path)).num_rows == 1000
    report = audit_config(cfg)
    assert report.ok and report.kafka_records == 700, report.problems
    assert_java_hudi_agrees(java_hudi, table.base_path)


def test_backfill_command_line_arguments() -> None:
    from lakesink.cli.main import build_parser

    args = build_parser().parse_args(
        ["backfill", "--table", "t", "--from", "src", "--format", "json", "--json"]
    )
    assert (args.command, args.table, args.source, args.format) == ("backfill", "t", "src", "json")


def test_backfill_into_an_iceberg_table_appends_once_beside_the_streaming_writer(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An Iceberg table: the backfill is one snapshot of its own writer whose commit id is the
    backfill id; a rerun (the command line, another writer id) appends nothing, and the
    streaming writer's audit still passes."""
    from integration.conftest import run_ingestion, write_config_file

    from lakesink.cli.main import main
    from lakesink.formats.iceberg.format import open_iceberg_table

    live, hist = topic_factory("ice-live"), topic_factory("ice-hist")
    produce_sample_events(kafka_bootstrap, live, 200, 2)
    cfg = ingest_config(
        kafka_bootstrap, live, tmp_path / "wh", table__format="iceberg", table__name="events"
    )
    assert run_ingestion(cfg, spark).records == 200
    table = open_iceberg_table(cfg.settings, create=False)
    source = tmp_path / "history"
    _history_files(table.schema(), hist, source, 90)

    result = run_backfill(spark, cfg["table.path"], source, cfg=cfg)
    assert (result.records, result.already_committed) == (90, False), result
    assert result.snapshot_id is not None and result.writer_id == f"backfill-{result.backfill_id}"
    table.refresh()
    summary = table.pyiceberg.current_snapshot().summary
    assert summary["lakesink.backfill-id"] == result.backfill_id
    assert summary["lakesink.commit-id"] == result.backfill_id

    # again on the command line, and under another writer id: recognised, nothing appended
    conf = str(write_config_file(cfg, tmp_path / "ingest.toml"))
    args = ["backfill", "--config", conf, "--table", str(tmp_path / "wh"), "--from", str(source)]
    assert main(args) == 0
    assert f"backfill {result.backfill_id} was committed before" in capsys.readouterr().out
    assert run_backfill(
        spark, cfg["table.path"], source, cfg=cfg, writer_id="other"
    ).already_committed

    produce_sample_events(kafka_bootstrap, live, 40, 2, first_event_id=200, create=False)
    assert run_ingestion(cfg, spark).records == 40
    report = audit_config(cfg)  # the streaming writer, past the backfill's snapshot
    assert report.ok, report.problems
    table.refresh()
    rows = table.pyiceberg.scan(selected_fields=COORDINATES).to_arrow()
    coords = sorted(zip(*(rows.column(c).to_pylist() for c in COORDINATES), strict=True))
    assert len(coords) == len(set(coords)) == 330
    assert sorted(o for t, _p, o in coords if t == hist) == list(range(90))
