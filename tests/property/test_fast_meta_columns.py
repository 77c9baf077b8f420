"""The Hudi meta columns the base-file writer builds in bulk, against plain references on the
same rows: `_hoodie_record_key` (fields constant over the rows are rendered once, as text) against
the field-by-field join, and `_hoodie_commit_seqno` against Python's own formatting, across
several writes of one writer."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.writer import BaseFileWriter, _key_strings, record_keys

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# (Arrow type, values to draw from): few values, so that a column is often constant
KEY_TYPES = {
    "int32": (pa.int32(), st.integers(-3, 3)),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1) | st.sampled_from([0, 7])),
    "string": (pa.string(), st.sampled_from(["", "a", "é,:", "x" * 30])),
    "large_string": (pa.large_string(), st.sampled_from(["", "b", "topic"])),
    "date": (pa.date32(), st.sampled_from([dt.date(2024, 1, 1), dt.date(1970, 1, 2)])),
    "timestamp": (
        pa.timestamp("us", tz="UTC"),
        st.sampled_from([dt.datetime(2024, 1, 1, 0, 0, 1, 5, tzinfo=dt.UTC)]),
    ),
    "double": (pa.float64(), st.sampled_from([0.5, -1.0])),
}


def reference_keys(table: pa.Table, fields: tuple[str, ...]) -> list[str]:
    """Every field rendered on every row, joined as Hudi's complex key `f1:v1,f2:v2`."""
    if len(fields) == 1:
        return _key_strings(table.column(fields[0]), fields[0]).to_pylist()
    parts = [
        pc.binary_join_element_wise(f"{f}:", _key_strings(table.column(f), f), "") for f in fields
    ]
    return pc.binary_join_element_wise(*parts, ",").to_pylist()


@st.composite
def key_tables(draw: st.DrawFn) -> tuple[pa.Table, tuple[str, ...]]:
    rows = draw(st.integers(1, 12))
    names = draw(st.lists(st.sampled_from(sorted(KEY_TYPES)), min_size=1, max_size=4))
    columns = {}
    for i, kind in enumerate(names):
        arrow_type, values = KEY_TYPES[kind]
        nullable = draw(st.booleans())
        value = values | st.none() if nullable else values
        if draw(st.booleans()):  # one value on every row, as the topic of a Kafka range
            column = [draw(value)] * rows
        else:
            column = draw(st.lists(value, min_size=rows, max_size=rows))
        columns[f"k{i}_{kind}"] = pa.array(column, arrow_type)
    table = pa.table(columns)
    if draw(st.booleans()) and rows > 1:  # several chunks, as concatenated batches give
        cut = draw(st.integers(1, rows - 1))
        table = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    return table, tuple(columns)


@FUZZ
@given(key_tables())
def test_record_keys_match_the_field_by_field_join(case: tuple[pa.Table, tuple[str, ...]]) -> None:
    table, fields = case
    keys = record_keys(table, fields)
    assert keys.type == pa.string()
    assert keys.to_pylist() == reference_keys(table, fields)


def test_the_default_key_of_a_kafka_range_renders_topic_and_partition_once() -> None:
    table = pa.table(
        {
            "kafka_topic": pa.array(["events"] * 3),
            "kafka_partition": pa.array([4] * 3, pa.int32()),
            "kafka_offset": pa.array([7, 8, 9], pa.int64()),
        }
    )
    keys = record_keys(table, ("kafka_topic", "kafka_partition", "kafka_offset"))
    assert keys.to_pylist() == [
        f"kafka_topic:events,kafka_partition:4,kafka_offset:{o}" for o in (7, 8, 9)
    ]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 40), min_size=1, max_size=4), st.integers(0, 9))
def test_commit_seqnos_number_the_rows_of_a_writer_in_order(
    tmp_path_factory: object, writes: list[int], task: int
) -> None:
    base = Path(tmp_path_factory.mktemp("seqno"))  # type: ignore[attr-defined]
    cfg = TableConfig(name="t", record_key_fields=("id",), partition_fields=())
    table = HudiTable.create(base, cfg)
    instant = "20261126120000123"
    writer = BaseFileWriter(table, "", instant, f"{task}-1-0")
    total = 0
    for n in writes:
        writer.write(pa.table({"id": pa.array(range(total, total + n), pa.int64())}))
        total += n
    files = writer.close()
    rows = pq.read_table(base / files[0].path)
    assert rows.column("_hoodie_commit_seqno").to_pylist() == [
        f"{instant}_{task}_{i}" for i in range(total)
    ]
    assert rows.column("_hoodie_commit_time").to_pylist() == [instant] * total
    assert rows.column("_hoodie_record_key").to_pylist() == [str(i) for i in range(total)]
    assert set(rows.column("_hoodie_file_name").to_pylist()) == {Path(files[0].path).name}
    assert set(rows.column("_hoodie_partition_path").to_pylist()) == {""}
