"""Records and schemas end to end (real broker, Spark local[2]): bad records under both error
tolerances, a schema change the table refuses, a missing topic, transformations (SQL and
Python), partitioning by columns, and Avro values in the Confluent wire format."""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import audit_config, ingest_config, run_ingestion

from lakesink.errors import LakesinkError
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.writer_state import committed_offsets_at
from lakesink.kafka.client import create_topic
from lakesink.kafka.producer import produce_sample_events, produce_values, sample_event_bytes

pytestmark = pytest.mark.integration

GOOD = [sample_event_bytes(i) for i in range(20)]
BAD_AT = 7  # offset of the garbled record in partition 0


def _with_bad_record(bootstrap: str, topic: str) -> None:
    create_topic(bootstrap, topic, 1)
    values = list(GOOD)
    values[BAD_AT] = b'{"event_id": "not a number", '
    produce_values(bootstrap, topic, values)


def test_bad_record_fails_the_batch_and_names_it_under_tolerance_none(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    topic = topic_factory("badnone")
    _with_bad_record(kafka_bootstrap, topic)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t")
    with pytest.raises(LakesinkError, match=rf"{topic}.*offset {BAD_AT}|offset {BAD_AT}"):
        run_ingestion(cfg, spark)
    # Nothing of the failed batch is committed or visible.
    assert committed_offsets_at(cfg["table.path"], cfg.writer_id).to_json() == {}
    assert TableReader(HudiTable.open(cfg["table.path"])).snapshot().num_rows == 0


def test_bad_record_goes_to_the_dead_letter_topic_under_tolerance_all(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    from lakesink.kafka.dead_letter_reader import dead_letter_sources

    topic, dlq = topic_factory("badall"), topic_factory("dlq")
    _with_bad_record(kafka_bootstrap, topic)
    create_topic(kafka_bootstrap, dlq, 1)
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        tmp_path / "t",
        errors__tolerance="all",
        errors__deadletter__topic=dlq,
    )
    run_ingestion(cfg, spark)
    assert dead_letter_sources(kafka_bootstrap, dlq) == {(topic, 0, BAD_AT)}
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 19 and report.dead_letters == 1


def test_schema_change_the_table_cannot_take_is_refused_with_the_column_named(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    topic = topic_factory("schema")
    produce_sample_events(kafka_bootstrap, topic, 50, 1)
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t")
    run_ingestion(cfg, spark)
    produce_sample_events(kafka_bootstrap, topic, 50, 1, first_event_id=50, create=False)
    # a new column, with schema evolution turned off: refused naming the column and the key
    changed = cfg.with_overrides(
        {
            "transform.sql": "SELECT *, CAST(amount AS STRING) AS amount_text FROM source",
            "schema.evolution": "off",
        }
    )
    with pytest.raises(LakesinkError, match=r"(?s)(?=.*amount_text)(?=.*schema\.evolution)"):
        run_ingestion(changed, spark)
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 50


def test_missing_topic_is_a_clear_error(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    topic = topic_factory("missing")
    cfg = ingest_config(kafka_bootstrap, topic, tmp_path / "t")
    with pytest.raises(LakesinkError, match=topic):
        run_ingestion(cfg, spark)


def test_sql_transformation_and_column_partitions_read_back_in_hudi_rs(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    import hudi

    topic = topic_factory("sql")
    produce_sample_events(kafka_bootstrap, topic, 300, 2)
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        tmp_path / "t",
        transform__sql="SELECT *, CAST(amount * 100 AS BIGINT) AS cents FROM source",
        table__partition__by="event_type",
    )
    run_ingestion(cfg, spark)
    table = HudiTable.open(cfg["table.path"])
    assert {p.split("=")[0] for p in table.list_partitions_on_storage()} == {"event_type"}
    rows = hudi.HudiTableBuilder.from_base_uri(cfg["table.path"]).build().read()
    import pyarrow as pa

    t = pa.Table.from_batches(rows)
    assert t.num_rows == 300 and "cents" in t.column_names
    assert audit_config(cfg).ok


def add_source_column(df: Any) -> Any:
    """A Python transformation (transform.python = integration.test_ingest_records:...)."""
    from pyspark.sql import functions as F

    return df.withColumn("source", F.lit("lakesink-test"))


def refuse_the_batch(df: Any) -> Any:
    if df.isEmpty():  # the check at start applies the transformation to no rows
        return df
    raise ValueError("the transformation refuses this batch")


def test_a_failing_batch_raises_its_own_error(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    # Spark sees a short stand-in; the driver raises what the batch raised, named in one line.
    topic = topic_factory("refused")
    produce_sample_events(kafka_bootstrap, topic, 20, 1)
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        tmp_path / "t",
        transform__python="integration.test_ingest_records:refuse_the_batch",
    )
    with pytest.raises(LakesinkError, match="the transformation refuses this batch"):
        run_ingestion(cfg, spark)
    assert committed_offsets_at(cfg["table.path"], cfg.writer_id).to_json() == {}


AVRO_SCHEMA = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "sensor", "type": "string"},
        {"name": "value", "type": "double"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    ],
}


def test_avro_values_in_confluent_wire_format(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    import fastavro

    topic = topic_factory("avro")
    create_topic(kafka_bootstrap, topic, 1)
    parsed = fastavro.parse_schema(AVRO_SCHEMA)
    values = []
    for i in range(40):
        buf = io.BytesIO()
        buf.write(b"\x00" + struct.pack(">I", 42))  # magic byte + schema id
        fastavro.schemaless_writer(buf, parsed, {"sensor": f"s{i % 3}", "value": i / 2, "at": i})
        values.append(buf.getvalue())
    produce_values(kafka_bootstrap, topic, values)
    schema_file = tmp_path / "reading.avsc"
    schema_file.write_text(json.dumps(AVRO_SCHEMA))
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        tmp_path / "t",
        value__format="avro",
        value__schema=None,
        value__schema__file=str(schema_file),
        value__avro__schema__ids="42",
    )
    run_ingestion(cfg, spark)
    t = TableReader(HudiTable.open(cfg["table.path"])).snapshot(columns=["sensor", "value"])
    assert sorted(t.column("value").to_pylist()) == [i / 2 for i in range(40)]
    assert audit_config(cfg).ok
    # a value framed with a schema id that was not configured: its writer schema is unknown
    buf = io.BytesIO()
    buf.write(b"\x00" + struct.pack(">I", 43))
    fastavro.schemaless_writer(buf, parsed, {"sensor": "s", "value": 1.0, "at": 1})
    produce_values(kafka_bootstrap, topic, [buf.getvalue()])
    with pytest.raises(
        LakesinkError,
        match=rf"{topic}:0 offset 40 .*schema id 43, not one of the accepted ids 42",
    ):
        run_ingestion(cfg, spark)
    assert committed_offsets_at(cfg["table.path"], cfg.writer_id).to_json() == {f"{topic}:0": 40}


def test_bad_record_goes_to_the_dead_letter_table_exactly_once(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    java_hudi: Any,
) -> None:
    from interop.compare import assert_java_hudi_agrees

    from lakesink.formats.hudi.audit import dead_letter_table_coordinates

    topic = topic_factory("badtable")
    _with_bad_record(kafka_bootstrap, topic)
    dlq = tmp_path / "dead_letters"
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        tmp_path / "t",
        errors__tolerance="all",
        errors__deadletter__table=str(dlq),
    )
    run_ingestion(cfg, spark)
    # A replay of the last batch (Spark lost commits/N) must not duplicate the dead letter.
    commits = sorted(
        (cfg.checkpoint_location / "commits").glob("[0-9]*"), key=lambda p: int(p.name)
    )
    commits[-1].unlink()
    run_ingestion(cfg, spark)
    assert dead_letter_table_coordinates(str(dlq)) == [(topic, 0, BAD_AT)]
    row = TableReader(HudiTable.open(dlq)).snapshot(columns=["kafka_value", "error"]).to_pylist()
    assert row[0]["kafka_value"].startswith(b'{"event_id": "not a number"')
    assert "offset" in row[0]["error"] or row[0]["error"]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 19 and report.dead_letters == 1
    assert_java_hudi_agrees(java_hudi, cfg["table.path"], dlq)
