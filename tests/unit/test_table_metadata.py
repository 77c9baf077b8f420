"""Commit and rollback metadata round-trip in both layouts (JSON for 6, Avro for 8)."""

from __future__ import annotations

import io
import json

import fastavro
import pytest

from lakesink.errors import CorruptTableError
from lakesink.formats.hudi.table.metadata import CommitMetadata, RollbackMetadata, RollbackPlan
from lakesink.protocol.instant import Action, TimelineLayout
from lakesink.protocol.write_status import FileWrite

W1 = FileWrite(
    "day=1", "f1-0", "day=1/f1-0_0-1-0_20240102030405678.parquet", 10, 1234, "null", 10, 1234
)
W2 = FileWrite("", "f2-0", "f2-0_1-1-0_20240102030405678.parquet", 5, 99, "null", 5, 99)
SCHEMA = '{"type":"record","name":"t_record","fields":[{"name":"id","type":"long"}]}'


def _commit() -> CommitMetadata:
    return CommitMetadata(
        "BULK_INSERT",
        (W1, W2),
        schema=SCHEMA,
        extra={"lakesink.writer_id": "w1", "lakesink.offsets": '{"t:0": 10}'},
    )


@pytest.mark.parametrize("layout", list(TimelineLayout))
def test_commit_metadata_round_trips(layout: TimelineLayout) -> None:
    md = _commit()
    assert CommitMetadata.from_bytes(md.to_bytes(layout), layout) == md


@pytest.mark.parametrize("layout", list(TimelineLayout))
def test_replace_commit_metadata_round_trips(layout: TimelineLayout) -> None:
    md = CommitMetadata(
        "CLUSTER", (W1,), replaced_file_ids={"day=1": ("a-0", "b-0")}, schema=SCHEMA
    )
    data = md.to_bytes(layout, Action.REPLACE_COMMIT)
    assert CommitMetadata.from_bytes(data, layout, Action.REPLACE_COMMIT) == md


def test_version_6_json_uses_hudi_field_names() -> None:
    d = json.loads(_commit().to_bytes(TimelineLayout.V1))
    stat = d["partitionToWriteStats"]["day=1"][0]
    assert stat["fileId"] == "f1-0" and stat["path"] == W1.path and stat["prevCommit"] == "null"
    assert stat["numWrites"] == 10 and stat["fileSizeInBytes"] == 1234
    assert stat["partitionPath"] == "day=1"
    assert d["operationType"] == "BULK_INSERT" and d["compacted"] is False
    assert d["extraMetadata"]["schema"] == SCHEMA
    assert "partitionToReplaceFileIds" not in d


def test_version_8_avro_is_one_hoodie_commit_metadata_record() -> None:
    reader = fastavro.reader(io.BytesIO(_commit().to_bytes(TimelineLayout.V2)))
    assert reader.writer_schema is not None
    assert reader.writer_schema["name"] == "org.apache.hudi.avro.model.HoodieCommitMetadata"
    records = list(reader)
    assert len(records) == 1
    data = CommitMetadata("CLUSTER", replaced_file_ids={"p": ("x-0",)}).to_bytes(
        TimelineLayout.V2, Action.REPLACE_COMMIT
    )
    replace_reader = fastavro.reader(io.BytesIO(data))
    assert replace_reader.writer_schema is not None
    assert replace_reader.writer_schema["name"].endswith("HoodieReplaceCommitMetadata")


def test_only_replacecommits_replace_file_groups() -> None:
    md = CommitMetadata("INSERT", replaced_file_ids={"p": ("x-0",)})
    with pytest.raises(ValueError, match="replacecommit"):
        md.to_bytes(TimelineLayout.V1, Action.COMMIT)


def test_schema_key_is_reserved() -> None:
    with pytest.raises(ValueError, match="reserved"):
        CommitMetadata("INSERT", extra={"schema": "x"})


@pytest.mark.parametrize("layout", list(TimelineLayout))
@pytest.mark.parametrize("data", [b"", b"\x00garbage\xff", b"{not json", b"[1, 2]"])
def test_empty_or_garbled_commit_files_are_corrupt(layout: TimelineLayout, data: bytes) -> None:
    with pytest.raises(CorruptTableError, match=r"/t/\.hoodie/x\.commit"):
        CommitMetadata.from_bytes(data, layout, source="/t/.hoodie/x.commit")


def test_write_stat_without_file_id_is_corrupt() -> None:
    data = json.dumps({"partitionToWriteStats": {"p": [{"path": "p/x.parquet"}]}}).encode()
    with pytest.raises(CorruptTableError, match="malformed"):
        CommitMetadata.from_bytes(data, TimelineLayout.V1, source="x.commit")


def test_rollback_metadata_and_plan_round_trip() -> None:
    md = RollbackMetadata(
        "20240102030405999",
        (("20240102030405678", "commit"),),
        deleted_files={"day=1": ("day=1/a.parquet",)},
        failed_files={},
        time_taken_ms=12,
    )
    back = RollbackMetadata.from_bytes(md.to_bytes())
    assert back.rolled_back == md.rolled_back
    assert dict(back.deleted_files) == {"day=1": ("day=1/a.parquet",)}
    plan = RollbackPlan("20240102030405678", "commit")
    assert RollbackPlan.from_bytes(plan.to_bytes()) == plan
    with pytest.raises(CorruptTableError, match="empty"):
        RollbackPlan.from_bytes(b"")


@pytest.mark.parametrize("action", [Action.COMMIT, Action.REPLACE_COMMIT])
def test_version_8_commit_files_are_the_bytes_fastavro_writes(action: Action) -> None:
    """The compiled encoder of commit metadata writes exactly what fastavro writes for the same
    record and sync marker (nulls, empty and non-ASCII strings, large and negative longs)."""
    from lakesink.formats.hudi.table import metadata

    writes = tuple(
        FileWrite(
            f"day={i % 3}",
            f"f{i}-0",
            f"day={i % 3}/f{i}-0_{i}-1-0_20240102.parquet",
            i * 1_000_003,
            2**40 + i,
            "null" if i % 2 else "20240101",
            i,
            -i,
        )
        for i in range(40)
    )
    md = CommitMetadata(
        "INSERT",
        writes,
        replaced_file_ids={"day=1": ("a-0", "b-0"), "é": ()}
        if action is Action.REPLACE_COMMIT
        else {},
        schema=SCHEMA,
        extra={"lakesink.offsets": "{}", "ключ": "значение", "": ""},
    )
    record = md.to_dict(TimelineLayout.V2, action)
    schema = (
        metadata._REPLACE_SCHEMA if action is Action.REPLACE_COMMIT else metadata._COMMIT_SCHEMA
    )
    writer = (
        metadata._REPLACE_WRITER if action is Action.REPLACE_COMMIT else metadata._COMMIT_WRITER
    )
    sync = bytes(range(16))
    expected = io.BytesIO()
    fastavro.writer(expected, schema, [record], codec="null", sync_marker=sync)
    assert writer.file_bytes(record, sync) == expected.getvalue()
    got = md.to_bytes(TimelineLayout.V2, action)
    assert CommitMetadata.from_bytes(got, TimelineLayout.V2, action) == CommitMetadata.from_dict(
        record
    )
    with pytest.raises(TypeError):
        writer.file_bytes({**record, "operationType": 7})


@pytest.mark.parametrize("layout", list(TimelineLayout))
@pytest.mark.parametrize(
    "writes",
    [
        (W1, W2),
        (W2, W1, W2),  # partitions interleaved: the file lists them grouped
        (W1, FileWrite("day=1", "f3-0", "day=1/f3-0_0-1-0_20240102030405678.parquet", 1, 1, "")),
        (),
    ],
)
def test_as_read_is_what_a_reader_parses_from_the_file(
    layout: TimelineLayout, writes: tuple[FileWrite, ...]
) -> None:
    """The metadata a publish keeps for later reads equals what parsing its file gives."""
    for action, replaced in ((Action.COMMIT, {}), (Action.REPLACE_COMMIT, {"day=1": ("x-0",)})):
        md = CommitMetadata("INSERT", writes, replaced, schema=SCHEMA, extra={"k": "v"})
        parsed = CommitMetadata.from_bytes(md.to_bytes(layout, action), layout, action)
        assert md.as_read(md.to_dict(layout, action)) == parsed
