"""The direct task path against the DataFrame path (real broker, Spark local[2], hudi-rs): the
same topic, ingested once through each, gives the same table rows (Hudi meta columns included,
but for the instant time each run draws), the same Parquet and commit schemas and the same dead
letters; a task that fails once after writing a file leaves only its retry's files committed."""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from integration.conftest import audit_config, ingest_config, run_ingestion

from lakesink.config import LakesinkConfig
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.kafka.client import create_topic
from lakesink.kafka.producer import produce_values, sample_event_bytes

pytestmark = pytest.mark.integration

BAD_JSON = [b"garbage", b'{"event_id": 1.5}', b'{"event_id": 1, "ts": "yesterday"}', b"", None]
READING = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "sensor", "type": "string"},
        {"name": "value", "type": ["null", "double"], "default": None},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}
RUN_VARYING = ("_hoodie_commit_time", "_hoodie_file_name")
"""Meta columns that name the run's instant (and a random file id): compared by shape."""


def _json_values(n: int) -> list[bytes | None]:
    """Sample events with a bad value every 7th record (None: a tombstone, null columns)."""
    return [
        BAD_JSON[(i // 7) % len(BAD_JSON)] if i % 7 == 3 else sample_event_bytes(i)
        for i in range(n)
    ]


def _avro_values(n: int) -> list[bytes | None]:
    import fastavro

    parsed = fastavro.parse_schema(READING)
    out: list[bytes | None] = []
    for i in range(n):
        if i % 9 == 4:
            out.append(b"\x00\x00\x00\x00\x2b" if i % 2 else b"\x01truncated")
            continue
        buf = io.BytesIO()
        buf.write(b"\x00" + struct.pack(">I", 42))
        value = None if i % 5 == 0 else i / 4
        record = {"sensor": f"s{i % 3}", "value": value, "at": i * 3_600_000_000, "tags": ["a"]}
        fastavro.schemaless_writer(buf, parsed, record)
        out.append(buf.getvalue())
    return out


def _produce(bootstrap: str, topic: str, values: list[bytes | None], partitions: int) -> None:
    create_topic(bootstrap, topic, partitions)
    for p in range(partitions):
        mine = values[p::partitions]
        produce_values(
            bootstrap,
            topic,
            mine,
            partition=p,
            keys=[f"k{i}".encode() if i % 4 else None for i in range(len(mine))],
            headers=[[("h", str(i).encode())] if i % 3 == 0 else None for i in range(len(mine))],
        )


def _hudi_rs(path: str) -> pa.Table:
    import hudi

    batches = hudi.HudiTableBuilder.from_base_uri(path).build().read()
    table = pa.Table.from_batches(batches)
    return table.sort_by([("kafka_partition", "ascending"), ("kafka_offset", "ascending")])


def _comparable(table: pa.Table, instants: list[str]) -> pa.Table:
    """The rows with the run's instant times replaced by their rank and the file name by its
    task partition and attempt, so two runs of the same batches compare equal."""
    rank = {t: str(n) for n, t in enumerate(sorted(instants))}
    commit = [rank[t] for t in table.column("_hoodie_commit_time").to_pylist()]
    seqno = [
        f"{rank[s.split('_', 1)[0]]}_{s.split('_', 1)[1]}"
        for s in table.column("_hoodie_commit_seqno").to_pylist()
    ]
    # the write token less its stage id (Spark numbers stages per session)
    tokens = [
        "{0}-{2}".format(*n.split("_")[1].split("-"))
        for n in table.column("_hoodie_file_name").to_pylist()
    ]
    table = table.set_column(0, "_hoodie_commit_time", pa.array(commit))
    table = table.set_column(1, "_hoodie_commit_seqno", pa.array(seqno))
    at = table.schema.get_field_index("_hoodie_file_name")
    return table.set_column(at, "_hoodie_file_name", pa.array(tokens))


def _completed(cfg: LakesinkConfig, path: str) -> tuple[list[str], str]:
    """The completed instants' times and the latest commit's schema."""
    timeline = HudiTable.open(cfg.storage_for(path)).timeline()
    return [i.time.value for i in timeline.completed()], timeline.latest_schema() or ""


def _base_file_schema(path: str) -> pa.Schema:
    files = sorted(Path(path).rglob("*.parquet"))
    assert files, f"no base file under {path}"
    return pq.read_schema(files[0])


def _ingest_both_ways(
    spark: Any, bootstrap: str, topic: str, tmp_path: Path, **overrides: Any
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in ("direct", "dataframe"):
        cfg = ingest_config(
            bootstrap,
            topic,
            tmp_path / path / "t",
            write__path=path,
            errors__tolerance="all",
            errors__deadletter__table=str(tmp_path / path / "dl"),
            kafka__max__records__per__batch=100,
            kafka__max__records__per__task=20,
            **overrides,
        )
        result = run_ingestion(cfg, spark)
        assert audit_config(cfg).ok
        tables = {}
        for name, where in (("rows", cfg["table.path"]), ("dead", str(tmp_path / path / "dl"))):
            instants, schema = _completed(cfg, where)
            tables[name] = {
                "rows": _comparable(_hudi_rs(where), instants),
                "schema": schema,
                "parquet": _base_file_schema(where),
                "instants": len(instants),
            }
        out[path] = {**tables, "result": result}
    return out


def _differences(a: pa.Table, b: pa.Table) -> dict[str, list[Any]]:
    """The columns whose values differ, with the first few (row, value a, value b)."""
    out: dict[str, list[Any]] = {}
    for name in a.column_names:
        x, y = a.column(name).to_pylist(), b.column(name).to_pylist()
        diff = [(i, x[i], y[i]) for i in range(len(x)) if x[i] != y[i]]
        if diff:
            out[name] = diff[:3]
    return out


def _assert_same(runs: dict[str, dict[str, Any]], rows: int, dead: int) -> None:
    direct, frame = runs["direct"], runs["dataframe"]
    for name, count in (("rows", rows), ("dead", dead)):
        a, b = direct[name], frame[name]
        assert a["rows"].num_rows == count
        assert a["parquet"] == b["parquet"], name
        assert a["schema"] == b["schema"], name
        assert a["instants"] == b["instants"], name
        assert a["rows"].schema == b["rows"].schema, name
        assert _differences(a["rows"], b["rows"]) == {}, name
    assert direct["result"].records == frame["result"].records == rows
    assert direct["result"].dead_letters == frame["result"].dead_letters == dead


def test_direct_path_json_partitioned_with_dead_letters_matches_dataframe_path(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    topic = topic_factory("direct-json")
    values = _json_values(140)
    _produce(kafka_bootstrap, topic, values, 2)
    runs = _ingest_both_ways(
        spark, kafka_bootstrap, topic, tmp_path, table__partition__by="event_type"
    )
    bad = sum(1 for v in values if v in BAD_JSON and v is not None)
    _assert_same(runs, rows=len(values) - bad, dead=bad)
    partitions = runs["direct"]["rows"]["rows"].column("_hoodie_partition_path")
    assert len(pc.unique(partitions)) > 2  # really partitioned (null event types included)


def test_direct_path_avro_date_partitioned_with_dead_letters_matches_dataframe_path(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    topic = topic_factory("direct-avro")
    values = _avro_values(120)
    _produce(kafka_bootstrap, topic, values, 3)
    schema_file = tmp_path / "reading.avsc"
    schema_file.write_text(json.dumps(READING))
    runs = _ingest_both_ways(
        spark,
        kafka_bootstrap,
        topic,
        tmp_path,
        value__format="avro",
        value__schema=None,
        value__schema__file=str(schema_file),
        value__avro__schema__ids="42",
        table__partition__date__from="at",
    )
    bad = sum(1 for i in range(len(values)) if i % 9 == 4)
    _assert_same(runs, rows=len(values) - bad, dead=bad)
    days = pc.unique(runs["direct"]["rows"]["rows"].column("dt")).to_pylist()
    assert len(days) == 5 and "1970-01-01" in days


def test_direct_task_failing_once_after_writing_commits_only_its_retry(
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    cli: Callable[..., Any],
) -> None:
    from integration.conftest import write_config_file

    topic = topic_factory("direct-retry")
    _produce(kafka_bootstrap, topic, [sample_event_bytes(i) for i in range(90)], 3)
    cfg = ingest_config(
        kafka_bootstrap, topic, tmp_path / "t", write__path="direct", spark__master="local[2,2]"
    )
    conf = write_config_file(cfg, tmp_path / "c.toml")
    run = cli(
        ["--debug", "ingest", "--config", str(conf), "--once"],
        env={"LAKESINK_FAIL_TASK_ATTEMPTS": "1"},
    )
    assert run.returncode == 0, run.stdout[-3000:]
    # the failed first attempts had written whole files; reconciliation deleted them
    assert "-0_" in "".join(
        line for line in run.stdout.splitlines() if "deleting orphan file" in line
    ), run.stdout[-3000:]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == 90
    # only the retries' (attempt 1) files are in the table
    tokens = {p.name.split("_")[1] for p in Path(cfg["table.path"]).rglob("*.parquet")}
    assert tokens and all(t.endswith("-1") for t in tokens), tokens
