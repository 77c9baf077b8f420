"""Iceberg tables on the DataFrame path and with dead-letter tables (shared broker and Spark): a
`transform.sql` ingestion lands every Kafka record once across a replayed batch and a rerun,
with the transformed values those of a plain Python reference; a transformation the table's
schema cannot take is refused naming the column; retried tasks commit only the successful
attempts' files; records that fail to decode land in the Iceberg dead-letter table once."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import ingest_config, run_ingestion, write_config_file

from lakesink.cli.status import collect_status
from lakesink.cli.verify import audit_config
from lakesink.config import LakesinkConfig
from lakesink.errors import LakesinkError
from lakesink.formats.iceberg.format import (
    dead_letter_coordinates_of,
    open_dead_letter_table,
    open_iceberg_table,
)
from lakesink.kafka.client import create_topic, watermarks
from lakesink.kafka.deserializers import make_deserializer
from lakesink.kafka.producer import produce_sample_events, produce_values, sample_event_bytes
from lakesink.kafka.reader import read_range
from lakesink.protocol.offsets import OffsetRange, TopicPartition

pytestmark = pytest.mark.integration

TRANSFORM = (
    "SELECT kafka_topic, kafka_partition, kafka_offset, kafka_timestamp, event_id, "
    "upper(event_type) AS kind, CAST(amount * 100 AS BIGINT) AS cents FROM source"
)
Coordinate = tuple[str, int, int]
# A run's first batch starts Python workers that import pyiceberg: on a loaded 2-core machine
# that alone has taken a minute, so a run gets more than the suite's usual two minutes.
RUN_TIMEOUT_S = 300


def _reference(event: dict[str, Any]) -> dict[str, Any]:
    """TRANSFORM in plain Python (Spark's cast of a double to BIGINT truncates toward zero)."""
    return {
        "event_id": event["event_id"],
        "kind": event["event_type"].upper(),
        "cents": int(event["amount"] * 100),
    }


def _config(bootstrap: str, topic: str, warehouse: Path, **overrides: Any) -> LakesinkConfig:
    return ingest_config(
        bootstrap, topic, warehouse, table__format="iceberg", table__name="events", **overrides
    )


def _kafka_values(bootstrap: str, topic: str, partitions: int) -> dict[Coordinate, bytes]:
    """Every record Kafka holds in the topic now: its coordinates and its value."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    out: dict[Coordinate, bytes] = {}
    for tp, (low, high) in watermarks(bootstrap, tps).items():
        for batch in read_range(
            bootstrap, OffsetRange(tp, low, high), deserializer=make_deserializer("raw")
        ):
            rows = batch.to_pydict()
            for o, v in zip(rows["kafka_offset"], rows["value"], strict=True):
                out[(tp.topic, tp.partition, int(o))] = v
    return out


def _table_rows(cfg: LakesinkConfig) -> list[dict[str, Any]]:
    return open_iceberg_table(cfg.settings, create=False).pyiceberg.scan().to_arrow().to_pylist()


def _replay_last_batch(cfg: LakesinkConfig) -> None:
    """Spark forgets that its last batch committed (commits/N lost): the next run replays it."""
    commits = sorted(
        (cfg.checkpoint_location / "commits").glob("[0-9]*"), key=lambda p: int(p.name)
    )
    commits[-1].unlink()
    (commits[-1].parent / f".{commits[-1].name}.crc").unlink(missing_ok=True)


def test_sql_transformation_lands_every_record_once_with_the_reference_values(
    kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path, spark: Any
) -> None:
    topic = topic_factory("ice-sql")
    produce_sample_events(kafka_bootstrap, topic, 300, 3)
    cfg = _config(
        kafka_bootstrap,
        topic,
        tmp_path / "wh",
        transform__sql=TRANSFORM,
        iceberg__partition__spec="kind",
        kafka__max__records__per__batch=150,  # two batches, the second one replayed
    )
    assert run_ingestion(cfg, spark, RUN_TIMEOUT_S).records == 300
    _replay_last_batch(cfg)
    produce_sample_events(kafka_bootstrap, topic, 90, 3, first_event_id=300, create=False)
    assert run_ingestion(cfg, spark, RUN_TIMEOUT_S).records == 90
    # a transformation whose rows the table cannot take (a type change that is no widening, so
    # schema.evolution's default cannot evolve it): refused by name, nothing written
    changed = cfg.with_overrides(
        {"transform.sql": TRANSFORM.replace("AS BIGINT) AS cents", "AS STRING) AS cents")}
    )
    assert changed["transform.sql"] != TRANSFORM
    with pytest.raises(LakesinkError, match="cents"):
        run_ingestion(changed, spark, RUN_TIMEOUT_S)

    rows = _table_rows(cfg)
    table = open_iceberg_table(cfg.settings, create=False)
    assert [f.name for f in table.pyiceberg.spec().fields] == ["kind"]
    assert set(rows[0]) == {
        "kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp",
        "event_id", "kind", "cents",
    }  # fmt: skip
    got = {(r["kafka_topic"], r["kafka_partition"], r["kafka_offset"]): r for r in rows}
    assert len(got) == len(rows)  # no coordinate twice
    expected = {
        at: _reference(json.loads(value))
        for at, value in _kafka_values(kafka_bootstrap, topic, 3).items()
    }
    assert len(expected) == 390
    assert {at: {k: r[k] for k in ("event_id", "kind", "cents")} for at, r in got.items()} == (
        expected
    )
    report = audit_config(cfg)
    assert report.ok, report.problems


def test_retried_tasks_on_the_dataframe_path_commit_only_the_successful_attempts_files(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    topic = topic_factory("ice-df-retry")
    produce_sample_events(kafka_bootstrap, topic, 90, 3)
    cfg = _config(
        kafka_bootstrap,
        topic,
        tmp_path / "wh",
        transform__sql=TRANSFORM,
        spark__master="local[2,2]",
    )
    conf = write_config_file(cfg, tmp_path / "c.toml")
    run = cli(["ingest", "--config", str(conf), "--once"], env={"LAKESINK_FAIL_TASK_ATTEMPTS": "1"})
    assert run.returncode == 0, run.stdout[-3000:]
    report = audit_config(cfg)
    assert report.ok, report.problems
    rows = _table_rows(cfg)
    assert sorted(r["event_id"] for r in rows) == list(range(90))
    table = open_iceberg_table(cfg.settings, create=False)
    referenced = {t.file.file_path for t in table.pyiceberg.scan().plan_files()}
    written = {p.as_uri() for p in Path(table.location.removeprefix("file://")).rglob("*.parquet")}
    # the failed first attempts' files stay unreferenced (orphans for remove-orphan-files)
    assert referenced and referenced < written


GOOD = [sample_event_bytes(i) for i in range(20)]
BAD_AT = (4, 13)  # offsets of the garbled records in partition 0


@pytest.mark.parametrize("write_path", ["direct", "dataframe"])
def test_bad_records_land_in_the_iceberg_dead_letter_table_exactly_once(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    spark: Any,
    write_path: str,
) -> None:
    topic = topic_factory(f"ice-dlq-{write_path}")
    create_topic(kafka_bootstrap, topic, 1)
    values = list(GOOD)
    for at in BAD_AT:
        values[at] = b'{"event_id": "not a number", '
    produce_values(kafka_bootstrap, topic, values)
    cfg = _config(
        kafka_bootstrap,
        topic,
        tmp_path / "wh",
        write__path=write_path,
        errors__tolerance="all",
        errors__deadletter__table="events_dead_letters",
        kafka__max__records__per__batch=10,  # two batches, one dead letter in each
    )
    first = run_ingestion(cfg, spark, RUN_TIMEOUT_S)
    assert (first.records, first.dead_letters) == (len(GOOD) - len(BAD_AT), len(BAD_AT))
    _replay_last_batch(cfg)
    replayed = run_ingestion(cfg, spark, RUN_TIMEOUT_S)
    assert replayed.dead_letters == 0 and replayed.records == 0
    dead = open_dead_letter_table(cfg.settings, create=False)
    assert dead.name == "lakesink.events_dead_letters"
    letters = dead.pyiceberg.scan().to_arrow().to_pylist()
    assert sorted(r["kafka_offset"] for r in letters) == list(BAD_AT)
    assert all(r["kafka_value"] == values[r["kafka_offset"]] and r["error"] for r in letters)
    assert dead_letter_coordinates_of(cfg.settings) == sorted((topic, 0, at) for at in BAD_AT)
    shown = collect_status(cfg)["dead_letter_table"]
    assert (shown["name"], shown["records"]) == (dead.name, len(BAD_AT)), shown
    assert shown["committed"] == {f"{topic}:0": len(GOOD)}, shown  # the main table's ranges
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.dead_letters == len(BAD_AT)
    assert sorted(r["event_id"] for r in _table_rows(cfg)) == [
        i for i in range(len(GOOD)) if i not in BAD_AT
    ]
