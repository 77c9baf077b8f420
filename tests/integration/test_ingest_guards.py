"""What the pipeline refuses or routes whatever the decoders let through (real broker, Spark
local[2]): strings that are not valid UTF-8 never reach a base file, and dead letters and
tombstones never meet a non-nullable column (JSON `NOT NULL`, an Avro field without a null
union), under both error tolerances."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from integration.conftest import audit_config, ingest_config, run_ingestion

from lakesink.config import LakesinkConfig
from lakesink.errors import LakesinkError
from lakesink.formats.hudi.audit import read_with_hudi_rs
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.writer_state import committed_offsets_at
from lakesink.kafka.client import create_topic
from lakesink.kafka.producer import produce_sample_events, produce_values

pytestmark = pytest.mark.integration

AVRO_SCHEMA = {
    "type": "record",
    "name": "Item",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
}


def _avro(record: dict[str, Any]) -> bytes:
    import fastavro

    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(AVRO_SCHEMA), record)
    return buf.getvalue()


def _values(fmt: str, bad: bytes | None) -> list[bytes | None]:
    """Two good values around `bad` (offset 1)."""
    if fmt == "json":
        return [b'{"id": 1, "name": "a"}', bad, b'{"id": 2, "name": "b"}']
    return [_avro({"id": 1, "name": "a"}), bad, _avro({"id": 2, "name": "b"})]


def _config(fmt: str, bootstrap: str, topic: str, tmp_path: Path, **extra: Any) -> LakesinkConfig:
    if fmt == "json":
        schema: dict[str, Any] = {"value__schema": "id BIGINT NOT NULL, name STRING NOT NULL"}
    else:
        schema_file = tmp_path / "item.avsc"
        schema_file.write_text(json.dumps(AVRO_SCHEMA))
        schema = {
            "value__format": "avro",
            "value__schema": None,
            "value__schema__file": str(schema_file),
            "value__avro__wire__format": "plain",
        }
    return ingest_config(bootstrap, topic, tmp_path / "t", **schema, **extra)


def _hudi_rs(path: str) -> pa.Table:
    """Every column as hudi-rs reads it (it coerces to the commit's Avro schema)."""
    import hudi

    batches = hudi.HudiTableBuilder.from_base_uri(path).build().read()
    return pa.Table.from_batches(batches)


def _table_field(path: str, name: str) -> pa.Field:
    """The field as hudi-rs reads it (the commit's Avro schema decides nullability)."""
    return _hudi_rs(path).schema.field(name)


def test_sql_cast_to_invalid_utf8_fails_the_batch_naming_the_column_and_publishes_nothing(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    topic = topic_factory("utf8")
    produce_sample_events(kafka_bootstrap, topic, 20, 1)
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        tmp_path / "t",
        transform__sql="SELECT *, CAST(unhex('C328') AS STRING) AS label FROM source",
    )
    with pytest.raises(LakesinkError, match=r"string column 'label' .*not valid UTF-8") as caught:
        run_ingestion(cfg, spark)
    assert f"{topic}:0 offset 0" in str(caught.value)
    assert committed_offsets_at(cfg["table.path"], cfg.writer_id).to_json() == {}
    table = HudiTable.open(cfg["table.path"])
    assert not table.timeline().completed_data_instants()
    assert not table.timeline().inflight_or_requested()  # rolled back by the usual path
    assert read_with_hudi_rs(cfg["table.path"]).num_rows == 0


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_dead_letter_beside_required_columns_ingests_exactly_once(
    fmt: str,
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
) -> None:
    from lakesink.formats.hudi.audit import dead_letter_table_coordinates

    topic = topic_factory(f"required-dl-{fmt}")
    create_topic(kafka_bootstrap, topic, 1)
    produce_values(kafka_bootstrap, topic, _values(fmt, b"garbage"))
    dlq = tmp_path / "dead_letters"
    cfg = _config(
        fmt,
        kafka_bootstrap,
        topic,
        tmp_path,
        errors__tolerance="all",
        errors__deadletter__table=str(dlq),
    )
    result = run_ingestion(cfg, spark)
    assert result.records == 2 and result.dead_letters == 1
    main = TableReader(HudiTable.open(cfg["table.path"])).snapshot(columns=["kafka_offset", "id"])
    assert sorted(main.to_pylist(), key=lambda r: r["kafka_offset"]) == [
        {"kafka_offset": 0, "id": 1},
        {"kafka_offset": 2, "id": 2},
    ]
    # the main table keeps the declared nullability: dead letters were split off before it
    assert not _table_field(cfg["table.path"], "id").nullable
    assert not _table_field(cfg["table.path"], "name").nullable
    assert dead_letter_table_coordinates(str(dlq)) == [(topic, 0, 1)]
    dead = _hudi_rs(str(dlq)).to_pylist()
    assert [r["kafka_value"] for r in dead] == [b"garbage"]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 2 and report.dead_letters == 1
    assert run_ingestion(cfg, spark).nothing_new  # ingested once: a rerun finds nothing


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_tombstone_for_required_columns_goes_to_the_dead_letter_table(
    fmt: str,
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
) -> None:
    from lakesink.formats.hudi.audit import dead_letter_table_coordinates

    topic = topic_factory(f"required-tombstone-{fmt}")
    create_topic(kafka_bootstrap, topic, 1)
    produce_values(kafka_bootstrap, topic, _values(fmt, None))
    dlq = tmp_path / "dead_letters"
    cfg = _config(
        fmt,
        kafka_bootstrap,
        topic,
        tmp_path,
        errors__tolerance="all",
        errors__deadletter__table=str(dlq),
    )
    run_ingestion(cfg, spark)
    main = TableReader(HudiTable.open(cfg["table.path"])).snapshot(columns=["id"])
    assert sorted(main.column("id").to_pylist()) == [1, 2]
    assert not _table_field(cfg["table.path"], "id").nullable
    assert dead_letter_table_coordinates(str(dlq)) == [(topic, 0, 1)]
    assert [r["kafka_value"] for r in _hudi_rs(str(dlq)).to_pylist()] == [None]
    report = audit_config(cfg)
    assert report.ok, report.problems


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_tombstone_for_required_columns_under_tolerance_none_fails_naming_the_record(
    fmt: str,
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = topic_factory(f"required-none-{fmt}")
    create_topic(kafka_bootstrap, topic, 1)
    produce_values(kafka_bootstrap, topic, _values(fmt, None))
    cfg = _config(fmt, kafka_bootstrap, topic, tmp_path)
    with pytest.raises(LakesinkError) as caught:
        run_ingestion(cfg, spark)
    message = str(caught.value)
    assert topic in message and "offset 1" in message, message
    assert "\n" not in message and "IllegalStateException" not in message, message
    assert committed_offsets_at(cfg["table.path"], cfg.writer_id).to_json() == {}
    assert read_with_hudi_rs(cfg["table.path"]).num_rows == 0


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_required_columns_keep_their_nullability_in_the_table(
    fmt: str,
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = topic_factory(f"required-good-{fmt}")
    create_topic(kafka_bootstrap, topic, 1)
    good = _values(fmt, b"")
    produce_values(kafka_bootstrap, topic, [good[0], good[2]])
    cfg = _config(fmt, kafka_bootstrap, topic, tmp_path)
    assert run_ingestion(cfg, spark).records == 2
    rows = _hudi_rs(cfg["table.path"])
    assert sorted(rows.column("id").to_pylist()) == [1, 2]
    assert not rows.schema.field("id").nullable and not rows.schema.field("name").nullable
    assert rows.schema.field("kafka_key").nullable


def test_tombstone_for_required_columns_goes_to_the_dead_letter_topic(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    from lakesink.kafka.dead_letter_reader import dead_letter_sources

    topic, dlq = topic_factory("required-tombstone-topic"), topic_factory("dlq")
    create_topic(kafka_bootstrap, topic, 1)
    create_topic(kafka_bootstrap, dlq, 1)
    produce_values(kafka_bootstrap, topic, _values("json", None))
    cfg = _config(
        "json",
        kafka_bootstrap,
        topic,
        tmp_path,
        errors__tolerance="all",
        errors__deadletter__topic=dlq,
    )
    assert run_ingestion(cfg, spark).records == 2
    assert dead_letter_sources(kafka_bootstrap, dlq) == {(topic, 0, 1)}
    assert not _table_field(cfg["table.path"], "id").nullable
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 2 and report.dead_letters == 1
