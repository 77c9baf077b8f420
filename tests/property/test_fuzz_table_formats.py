"""Fuzzing of what lakesink parses from a table on storage: timeline file names, commit metadata
(JSON for table version 6, Avro for version 8), rollback files and `hoodie.properties`.
Garbage gets a LakesinkError subclass with a message, never another exception type."""

from __future__ import annotations

import io
from pathlib import Path

import fastavro
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lakesink.errors import CorruptTableError, LakesinkError, TableError
from lakesink.formats.hudi.table.config import TableConfig, parse_properties, render_properties
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.metadata import CommitMetadata, RollbackMetadata, RollbackPlan
from lakesink.protocol.instant import Action, Instant, InstantTime, State, TimelineLayout
from lakesink.protocol.write_status import FileWrite

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

digits17 = st.text("0123456789", min_size=17, max_size=17)
instant_times = st.integers(946_684_800_000, 4_102_444_800_000).map(InstantTime.from_epoch_ms)
name_parts = st.sampled_from(
    [
        "",
        ".",
        "_",
        "commit",
        "replacecommit",
        "rollback",
        "clean",
        "inflight",
        "requested",
        "deltacommit",
        "compaction",
        "savepoint",
        "indexing",
        "crc",
        "tmp",
        "..",
        "é",
        "\x00",
    ]
)


# --- instant file names -----------------------------------------------------------------------


@FUZZ
@given(
    st.one_of(
        st.text(max_size=60), st.lists(st.one_of(digits17, name_parts), max_size=6).map("".join)
    )
)
@example("20260101000000000_.commit")
@example("20261399999999999.commit")
@example("00000000000000000.commit")
def test_instant_parse_accepts_timeline_names_or_raises_corrupt_table(name: str) -> None:
    try:
        inst = Instant.parse(name)
    except CorruptTableError as e:
        assert str(e)
        return
    # whatever parses renders back and orders like an instant
    layout = TimelineLayout.V2 if inst.completion_time else TimelineLayout.V1
    assert Instant.parse(inst.file_name(layout)) == inst
    try:
        inst.time.to_epoch_ms()
    except CorruptTableError as e:  # 17 digits that are not a date
        assert inst.time.value in str(e)


@FUZZ
@given(digits17)
@example("20261399999999999")
@example("00000000000000000")
@example("00010110000000000")  # year 1: strftime("%Y") wrote "1", 14 digits in all
def test_instant_time_of_17_digits_converts_or_raises_corrupt_table(text: str) -> None:
    t = InstantTime(text)
    try:
        ms = t.to_epoch_ms()
    except CorruptTableError as e:
        assert text in str(e)
        return
    assert InstantTime.from_epoch_ms(ms) == t


@FUZZ
@given(
    instant_times,
    st.sampled_from(list(Action)),
    st.sampled_from(list(State)),
    instant_times,
    st.sampled_from(list(TimelineLayout)),
)
def test_instant_file_names_round_trip(
    t: InstantTime, action: Action, state: State, done: InstantTime, layout: TimelineLayout
) -> None:
    completion = done if state is State.COMPLETED and layout is TimelineLayout.V2 else None
    inst = Instant(t, action, state, completion)
    assert Instant.parse(inst.file_name(layout)) == inst


# --- commit metadata ------------------------------------------------------------------------


def _metadata() -> CommitMetadata:
    w = FileWrite(
        "dt=2026-01-01",
        "abc",
        "dt=2026-01-01/abc_0-1-0_20260101000000000.parquet",
        10,
        1000,
        "null",
        10,
        1000,
    )
    return CommitMetadata(
        "INSERT",
        (w,),
        {},
        '{"type":"record","name":"r","fields":[]}',
        {"lakesink.writer_id": "w", "lakesink.offsets": '{"t:0": 10}'},
    )


GOOD = {layout: _metadata().to_bytes(layout) for layout in TimelineLayout}


def _mutations(data: bytes) -> st.SearchStrategy[bytes]:
    def mutate(args: tuple[int, int, bytes, str]) -> bytes:
        pos, length, insert, how = args
        pos %= len(data) + 1
        if how == "truncate":
            return data[:pos]
        if how == "flip":
            return (
                data[:pos] + bytes([(data[pos] ^ 0xFF) if pos < len(data) else 0]) + data[pos + 1 :]
            )
        if how == "delete":
            return data[:pos] + data[pos + length :]
        return data[:pos] + insert + data[pos:]

    return st.tuples(
        st.integers(0, 1 << 16),
        st.integers(1, 64),
        st.binary(max_size=32),
        st.sampled_from(["truncate", "flip", "delete", "insert"]),
    ).map(mutate)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
metadata_keys = st.sampled_from(
    [
        "partitionToWriteStats",
        "partitionToReplaceFileIds",
        "extraMetadata",
        "operationType",
        "compacted",
        "fileId",
        "path",
        "numWrites",
        "fileSizeInBytes",
        "schema",
        "version",
    ]
)


@FUZZ
@given(
    st.sampled_from(list(TimelineLayout)),
    st.sampled_from([Action.COMMIT, Action.REPLACE_COMMIT]),
    st.data(),
)
def test_commit_metadata_from_garbage_bytes_is_corrupt_table(
    layout: TimelineLayout, action: Action, data: st.DataObject
) -> None:
    import json

    raw = data.draw(
        st.one_of(
            st.binary(max_size=300),
            _mutations(GOOD[layout]),
            st.dictionaries(metadata_keys, json_values, max_size=6).map(
                lambda d: json.dumps(d).encode()
            ),
            st.dictionaries(
                st.just("partitionToWriteStats"),
                st.dictionaries(
                    st.text(max_size=5),
                    st.lists(st.dictionaries(metadata_keys, json_values, max_size=6), max_size=3),
                    max_size=2,
                ),
            ).map(lambda d: json.dumps(d).encode()),
        )
    )
    try:
        md = CommitMetadata.from_bytes(raw, layout, action, source="fuzzed.commit")
    except LakesinkError as e:
        assert isinstance(e, TableError) and str(e)
        return
    for w in md.writes:  # whatever is accepted is well-typed
        assert isinstance(w.path, str) and isinstance(w.num_writes, int)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in md.extra.items())


@FUZZ
@given(st.data())
def test_avro_commit_metadata_with_other_schemas_is_corrupt_table(data: st.DataObject) -> None:
    """Valid Avro container files of other shapes (what another tool might leave)."""
    schema = {
        "type": "record",
        "name": "Other",
        "fields": [
            {
                "name": "partitionToWriteStats",
                "type": data.draw(
                    st.sampled_from(
                        [
                            "string",
                            "long",
                            "null",
                            {"type": "map", "values": "string"},
                            {"type": "array", "items": "string"},
                        ]
                    )
                ),
            },
            {
                "name": "extraMetadata",
                "type": data.draw(
                    st.sampled_from(["string", {"type": "map", "values": "long"}, "null"])
                ),
            },
        ],
    }
    parsed = fastavro.parse_schema(schema)
    samples = {"string": "x", "long": 1, "null": None}

    def value(t: object) -> object:
        if isinstance(t, str):
            return samples[t]
        assert isinstance(t, dict)
        return {"k": value(t["values"])} if t["type"] == "map" else [value(t["items"])]

    rec = {f["name"]: value(f["type"]) for f in schema["fields"]}
    buf = io.BytesIO()
    fastavro.writer(buf, parsed, [rec] * data.draw(st.integers(0, 2)))
    try:
        CommitMetadata.from_bytes(buf.getvalue(), TimelineLayout.V2, source="other.avro")
    except LakesinkError as e:
        assert isinstance(e, TableError)


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=200),
        _mutations(RollbackPlan("20260101000000000", "commit").to_bytes()),
        _mutations(
            RollbackMetadata("20260101000000001", (("20260101000000000", "commit"),)).to_bytes()
        ),
    )
)
def test_rollback_files_from_garbage_are_corrupt_table(raw: bytes) -> None:
    for parse in (RollbackPlan.from_bytes, RollbackMetadata.from_bytes):
        try:
            parse(raw, source="fuzzed")
        except LakesinkError as e:
            assert isinstance(e, TableError)


# --- hoodie.properties ----------------------------------------------------------------------

PROPS = render_properties(TableConfig("t", ("k",), ("dt",), 8).to_properties())
prop_lines = st.lists(
    st.one_of(
        st.text(max_size=40),
        st.tuples(
            st.sampled_from(
                [
                    "hoodie.table.name",
                    "hoodie.table.version",
                    "hoodie.table.type",
                    "hoodie.timeline.layout.version",
                    "hoodie.table.partition.fields",
                    "hoodie.table.recordkey.fields",
                    "hoodie.table.metadata.partitions",
                    "hoodie.datasource.write.drop.partition.columns",
                    "hoodie.timeline.path",
                    "hoodie.database.name",
                    "hoodie.datasource.write.hive_style_partitioning",
                ]
            ),
            st.sampled_from(["=", ":", " ", "\\\n"]),
            st.text(max_size=20),
        ).map("".join),
    ),
    max_size=12,
).map("\n".join)


@FUZZ
@given(
    st.one_of(
        prop_lines,
        st.text(max_size=300),
        _mutations(PROPS.encode()).map(lambda b: b.decode("latin-1")),
    )
)
def test_hoodie_properties_garbage_gives_table_error(text: str) -> None:
    props = parse_properties(text)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in props.items())
    try:
        config = TableConfig.from_properties(props, "fuzzed/hoodie.properties")
    except LakesinkError as e:
        assert isinstance(e, TableError) and str(e)
        return
    assert config.version in (6, 8)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.one_of(st.binary(max_size=300), _mutations(PROPS.encode())))
def test_opening_a_table_with_garbage_properties_gives_table_error(
    tmp_path: Path, raw: bytes
) -> None:
    hoodie = tmp_path / ".hoodie"
    hoodie.mkdir(exist_ok=True)
    (hoodie / "hoodie.properties").write_bytes(raw)
    try:
        HudiTable.open(tmp_path)
    except LakesinkError as e:
        assert isinstance(e, TableError)


def test_round_trip_of_rendered_properties() -> None:
    config = TableConfig("t", ("a", "b"), ("dt",), 6)
    assert (
        TableConfig.from_properties(parse_properties(render_properties(config.to_properties())))
        == config
    )
    with pytest.raises(CorruptTableError):
        TableConfig.from_properties({}, "empty")
