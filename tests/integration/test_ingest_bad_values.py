"""Every kind of bad JSON value in one topic, end to end (real broker, Spark local[2]): under
errors.tolerance=all each record lands once, in the table or in the dead-letter table, both
readable by hudi-rs, good values as the per-value rules decode them; under none the first bad
record fails the batch by topic, partition and offset, and nothing is committed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from integration.conftest import audit_config, ingest_config, run_ingestion

from lakesink.errors import LakesinkError
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.writer_state import committed_offsets_at
from lakesink.kafka.client import create_topic
from lakesink.kafka.ddl import ddl_to_arrow
from lakesink.kafka.json_values import MAX_DEPTH, JsonValueDecoder
from lakesink.kafka.producer import produce_values

pytestmark = pytest.mark.integration

DDL = "id BIGINT, s STRING, d DOUBLE, t TIMESTAMP, day DATE, tags ARRAY<STRING>, st STRUCT<x: INT>"
VALUE_COLUMNS = ["id", "s", "d", "t", "day", "tags", "st"]

GOOD: list[bytes | None] = [
    b'{"id": 1, "s": "plain", "d": 1.5, "t": "2024-01-01T00:00:00Z", "day": "2024-02-29"}',
    b'{"id": -0, "s": "caf\xc3\xa9 \\u00e9 \\ud83d\\ude00", "d": -0, "tags": ["a", "b"]}',
    b'{"id": 3, "d": 1e-400, "t": "2024-01-01 02:00:00.123456+02:00", "st": {"x": 7}}',
    b' {"id": 4, "s": "leading space, a line feed between tokens",\n "d": 2}',
    b'{"id": 5, "x": 1, "x": 2, "other": {"deep": [[1]]}}',  # a repeated name that is no column
    b'{"id": 6, "s": "a\\u0000b\\nc"}',
    None,  # a tombstone: every column is nullable, so a row of nulls
]
BAD: list[bytes] = [
    b"",
    b'{"id": 10}\n{"id": 11}',  # two documents
    b'{"id": 12} {"id": 13}',
    b'{"id": 14, "s": "raw\nline feed"}',
    b'{"id": 15, "s": "\xff\xfe"}',  # invalid UTF-8
    b'{"id": 16, "s": "\\ud800"}',  # lone surrogate escape
    b"\xef\xbb\xbf" + b'{"id": 17}',  # byte order mark
    b'{"id": 18, "d": NaN}',
    b'{"id": 19, "d": Infinity}',
    b'{"id": 20, "d": 1e400}',
    b'{"id": 21.5}',
    b'{"id": 1e3}',
    b'{"id": -0.0}',
    b'{"id": 24, "id": 25}',  # a repeated column
    b'{"id": 26, "x": ' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}",
    b'{"id": 27, "t": "2024-01-01T00:00:00.123456789Z"}',  # nanoseconds
    b'{"id": 28, "t": "20240101T000000Z"}',  # compact ISO form
    b'{"id": 29, "day": "2023-02-29"}',
    b'{"id": 30, "s": 30}',
    b'{"id": 9223372036854775808}',
    b"[1, 2]",
    b"garbage",
]


def _values() -> list[bytes | None]:
    """Good and bad values interleaved, so bad ones sit inside batches of good ones."""
    out: list[bytes | None] = []
    for i in range(max(len(GOOD), len(BAD))):
        if i < len(BAD):
            out.append(BAD[i])
        if i < len(GOOD):
            out.append(GOOD[i])
    return out


def _hudi_rs_rows(path: str) -> pa.Table:
    import hudi

    batches = hudi.HudiTableBuilder.from_base_uri(path).build().read()
    return pa.Table.from_batches(batches).sort_by("kafka_offset")


def test_every_bad_value_is_a_dead_letter_and_good_values_round_trip(
    spark: Any, kafka_bootstrap: str, topic_factory: Callable[[str], str], tmp_path: Path
) -> None:
    topic = topic_factory("badvalues")
    create_topic(kafka_bootstrap, topic, 1)
    values = _values()
    key_of_bad_utf8 = b"\xff key stays binary"
    keys = [key_of_bad_utf8 if i == 0 else None for i in range(len(values))]
    produce_values(kafka_bootstrap, topic, values, keys=keys)
    bad_offsets = {i for i, v in enumerate(values) if v is not None and v in BAD}
    good_offsets = [i for i in range(len(values)) if i not in bad_offsets]

    # under none: the first bad record (offset 0) fails the batch, named; nothing committed
    strict = ingest_config(kafka_bootstrap, topic, tmp_path / "strict", value__schema=DDL)
    with pytest.raises(LakesinkError, match=rf"{topic}:0 offset 0 could not be deserialized"):
        run_ingestion(strict, spark)
    assert committed_offsets_at(strict["table.path"], strict.writer_id).to_json() == {}
    assert TableReader(HudiTable.open(strict["table.path"])).snapshot().num_rows == 0

    dlq = tmp_path / "dead_letters"
    cfg = ingest_config(
        kafka_bootstrap,
        topic,
        tmp_path / "t",
        value__schema=DDL,
        errors__tolerance="all",
        errors__deadletter__table=str(dlq),
    )
    run_ingestion(cfg, spark)
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.kafka_records == len(values)
    assert report.rows_hudi_rs == len(good_offsets) and report.dead_letters == len(BAD)

    main = _hudi_rs_rows(cfg["table.path"])
    dead = _hudi_rs_rows(str(dlq))
    assert main.column("kafka_offset").to_pylist() == good_offsets
    assert dead.column("kafka_offset").to_pylist() == sorted(bad_offsets)
    assert set(main.column("kafka_topic").to_pylist()) == {topic}
    # every offset exactly once across the two tables
    assert sorted(good_offsets + sorted(bad_offsets)) == list(range(len(values)))
    # dead letters keep the value as it was, with a reason
    assert dead.column("kafka_value").to_pylist() == [values[i] for i in sorted(bad_offsets)]
    assert all(dead.column("error").to_pylist())
    assert dead.column("kafka_key").to_pylist()[0] == key_of_bad_utf8

    # good values round-trip field by field, as the per-value rules decode them
    rules = JsonValueDecoder(ddl_to_arrow(DDL))
    want = pa.Table.from_pylist(
        [rules.decode_one(values[i]) for i in good_offsets], schema=ddl_to_arrow(DDL)
    )
    got = main.select(VALUE_COLUMNS)
    for name in VALUE_COLUMNS:
        g, w = got.column(name), want.column(name)
        if pa.types.is_timestamp(w.type):
            g, w = pc.cast(g, pa.timestamp("us", tz="UTC")), w
        if pa.types.is_floating(w.type):  # -0.0 must stay -0.0
            assert [str(x) for x in g.to_pylist()] == [str(x) for x in w.to_pylist()]
        assert g.to_pylist() == w.to_pylist(), name
    assert got.column("s").to_pylist()[1] == "caf\u00e9 \u00e9 \U0001f600"
