"""Schema evolution committed with the data, in both formats: a second `lakesink ingest` whose
`value.schema` adds a column, adds a nested field and widens int to long evolves the table in
its own commit; every reader (Hudi: hudi-rs, Java Hudi and lakesink's reader; Iceberg:
pyiceberg, DuckDB and Spark with Iceberg's runtime through the audit) reads each record once,
the older rows null-filled and widened. The evolving run is first killed (SIGKILL) after its
batch wrote its files, before their commit: the schema change never lands without its data, and
the restart evolves the table once."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from integration.conftest import ingest_config, run_ingestion, write_config_file
from interop.compare import assert_java_hudi_agrees

from lakesink.cli.verify import audit_config
from lakesink.config import LakesinkConfig
from lakesink.kafka.producer import produce_values

pytestmark = pytest.mark.integration

V1 = "id INT, name STRING, addr STRUCT<city: STRING>"
V2 = "id BIGINT, name STRING, addr STRUCT<city: STRING, zip: STRING>, country STRING"


def _values(start: int, n: int, *, v2: bool) -> list[bytes]:
    out = []
    for i in range(start, start + n):
        row: dict[str, Any] = {"id": i, "name": f"n{i}", "addr": {"city": f"c{i % 3}"}}
        if v2:
            row["addr"]["zip"] = f"z{i}"
            row["country"] = "NO"
            row["id"] = i + 2**40  # only a long holds it
        out.append(json.dumps(row).encode())
    return out


def _config(fmt: str, bootstrap: str, topic: str, tmp: Path, schema: str) -> LakesinkConfig:
    extra: dict[str, Any] = {"table__format": "iceberg", "table__name": "evolving"}
    if fmt == "hudi":
        extra = {}
    return ingest_config(
        bootstrap,
        topic,
        tmp / ("wh" if fmt == "iceberg" else "evolving"),
        value__schema=schema,
        **extra,
    )


def _rows(fmt: str, cfg: LakesinkConfig) -> pa.Table:
    """The table's rows as lakesink's reader (Hudi) or pyiceberg (Iceberg) returns them."""
    if fmt == "hudi":
        from lakesink.formats.hudi.table.hudi_table import HudiTable
        from lakesink.formats.hudi.table.reader import TableReader

        return TableReader(HudiTable.open(str(cfg["table.path"]))).snapshot()
    from lakesink.formats.iceberg.format import open_iceberg_table

    return open_iceberg_table(cfg.settings, create=False).pyiceberg.scan().to_arrow()


@pytest.mark.parametrize("fmt", ["hudi", "iceberg"])
def test_second_run_with_a_wider_value_schema_evolves_the_table_in_its_commit(
    fmt: str,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    spark: Any,
    cli: Callable[..., Any],
    request: pytest.FixtureRequest,
) -> None:
    topic = topic_factory(f"evolve-{fmt}")
    produce_values(kafka_bootstrap, topic, _values(0, 6, v2=False))
    first = _config(fmt, kafka_bootstrap, topic, tmp_path, V1)
    assert run_ingestion(first, spark).records == 6
    # the writer's value.schema edited between two runs: a column, a nested field, a widening
    produce_values(kafka_bootstrap, topic, _values(6, 6, v2=True))
    second = _config(fmt, kafka_bootstrap, topic, tmp_path, V2)
    # the evolving batch's driver killed after its files were written and checked, before the
    # commit that carries the new schema: the table keeps its schema and rows
    conf = write_config_file(second, tmp_path / "second.toml")
    killed = cli(
        ["ingest", "--config", str(conf), "--once"],
        env={"LAKESINK_CRASH_AT": "after-reconcile", "LAKESINK_CRASH_AFTER_BATCHES": "0"},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:]
    before = _rows(fmt, second)
    assert before.num_rows == 6 and "country" not in before.schema.names, before.schema
    # the restart takes the batch again (Spark's checkpoint names its ranges) and evolves once
    assert run_ingestion(second, spark).records == 6

    # an Iceberg table is read by Spark with Iceberg's Java runtime too (the evolved schema's
    # field ids), besides pyiceberg and DuckDB
    report = audit_config(second, spark=fmt == "iceberg")
    assert report.ok, report.problems
    found = report.to_json()
    readers = (
        {k: found[k] for k in ("rows_hudi_rs", "rows_lakesink", "kafka_records")}
        if fmt == "hudi"
        else found["readers"]
    )
    assert fmt == "hudi" or set(readers) == {"pyiceberg", "duckdb", "spark"}, found
    assert set(readers.values()) == {12}, readers  # every reader, every record once
    rows = _rows(fmt, second)
    assert rows.schema.field("id").type == pa.int64()
    assert rows.schema.names[-1] == "country"  # added at the end
    by_id = {r["id"]: r for r in rows.to_pylist()}
    assert by_id[0]["country"] is None and by_id[0]["addr"] == {"city": "c0", "zip": None}
    assert by_id[6 + 2**40]["country"] == "NO"
    assert by_id[6 + 2**40]["addr"] == {"city": "c0", "zip": "z6"}
    assert sorted(by_id) == [*range(6), *(i + 2**40 for i in range(6, 12))]
    if fmt == "hudi":
        _check_hudi(second, rows, spark)
        # Java Hudi too: every query lakesink's reader answers (snapshot, time travel to the
        # commit before the evolution, incremental across it), the same rows
        assert_java_hudi_agrees(request.getfixturevalue("java_hudi"), second["table.path"])
    else:
        from lakesink.formats.iceberg.format import open_iceberg_table

        _check_iceberg(second)
        # rows narrower than the table now (int into its long column, a nested field left
        # out): widened and null-filled as they are written, the table's schema unchanged
        produce_values(kafka_bootstrap, topic, _values(12, 2, v2=False))
        third = _config(fmt, kafka_bootstrap, topic, tmp_path, V1)
        assert run_ingestion(third, spark).records == 2
        meta = open_iceberg_table(third.settings, create=False).pyiceberg.metadata
        assert len(meta.schemas) == 2
        by_id = {r["id"]: r for r in _rows(fmt, third).to_pylist()}
        assert len(by_id) == 14
        assert by_id[12]["addr"] == {"city": "c0", "zip": None} and by_id[12]["country"] is None


def _check_hudi(cfg: LakesinkConfig, ours: pa.Table, spark: Any) -> None:
    """hudi-rs reads the older slices in the latest commit's schema too (null-filled, widened),
    and so does Spark through `format("lakesink")`: the same rows as lakesink's reader, which
    unifies the files' schemas by name; the latest commit records the evolved schema."""
    from lakesink.engine.evolution import concat_unified
    from lakesink.formats.hudi.audit import hudi_rs_batches
    from lakesink.formats.hudi.table.avro_schema import arrow_schema_of
    from lakesink.formats.hudi.table.hudi_table import HudiTable

    batches = hudi_rs_batches(str(cfg["table.path"]))
    theirs = concat_unified(batches)
    assert theirs.schema.field("id").type == pa.int64()

    def key(t: pa.Table) -> list[dict[str, Any]]:
        return sorted(t.select(["id", "name", "addr", "country"]).to_pylist(), key=str)

    assert key(theirs) == key(ours)
    read = spark.read.format("lakesink").load(str(cfg["table.path"]))
    assert read.schema["id"].dataType.typeName() == "long"
    by_spark = pa.Table.from_pylist([r.asDict(recursive=True) for r in read.collect()])
    assert key(by_spark) == key(ours)
    latest = HudiTable.open(str(cfg["table.path"])).timeline().latest_schema()
    assert latest is not None and arrow_schema_of(latest).field("country").nullable


def _check_iceberg(cfg: LakesinkConfig) -> None:
    """One snapshot per run, the second on the evolved schema, whose new columns got new ids."""
    from lakesink.formats.iceberg.format import open_iceberg_table

    meta = open_iceberg_table(cfg.settings, create=False).pyiceberg.metadata
    assert len(meta.schemas) == 2
    old, new = meta.schemas
    assert new.find_field("id").field_id == old.find_field("id").field_id
    assert new.find_field("country").field_id > old.highest_field_id
    snaps = meta.snapshots
    assert snaps[-1].schema_id == new.schema_id and snaps[0].schema_id == old.schema_id
