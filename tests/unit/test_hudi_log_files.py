"""Log files of merge-on-read tables (lakesink.formats.hudi.table.log_file, merge_on_read): the
block layout byte for byte against log files Hudi wrote, names, markers, corrupt files; tables
of a base file and deltacommits of Parquet data blocks and delete blocks, read by lakesink's
reader and hudi-rs as the plain fold of every version under the table's merge mode."""

from __future__ import annotations

import io
import json
import struct
import tempfile
from pathlib import Path
from typing import Any

import fastavro
import hudi
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from interop.mor_tables import (
    AVRO,
    DATA,
    MorTable,
    Version,
    data_rows,
    fold,
    instant,
)

from lakesink.cli.main import main
from lakesink.errors import CommitError, CorruptTableError, UnsupportedTableError
from lakesink.formats.hudi.plugin import PLUGIN
from lakesink.formats.hudi.table.file_group import FileSlice
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.log_file import (
    BlockType,
    DeleteRecord,
    HeaderKey,
    LogBlock,
    LogFileName,
    OrderingBranch,
    delete_block,
    log_file_name_for,
    log_rows,
    ordering_values,
    read_log_blocks,
    read_log_file,
    write_log_file,
)
from lakesink.formats.hudi.table.markers import list_marked_files
from lakesink.formats.hudi.table.merge_on_read import merge_slice
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.table.rollback import rollback
from lakesink.formats.hudi.table.view import FileSystemView
from lakesink.protocol.instant import Action, Instant, InstantTime, State, TimelineLayout
from lakesink.protocol.write_status import FileWrite

FIXTURES = Path(__file__).parent / "fixtures" / "hudi_mor"
# Written by Hudi (Spark SQL): one Parquet data block of one row (table version 6)
PARQUET_LOG = FIXTURES / ".ee2ace10-7667-40f5-9848-0a144b5ea064-0_20250113230302428.log.1_0-188-387"
# Written by Hudi for `DELETE FROM v6_trips_8i3d WHERE rider in ('rider-A', 'rider-C', 'rider-D')`
DELETE_LOG = FIXTURES / ".6d3d1d6e-2298-4080-a0c1-494877d6f40a-0_20250618054711154.log.1_0-26-85"

# -- the block layout against Hudi's own files -------------------------------------------------


def test_a_parquet_data_block_of_hudi_parses_and_encodes_to_the_same_bytes() -> None:
    raw = PARQUET_LOG.read_bytes()
    (block,) = read_log_blocks(raw, str(PARQUET_LOG))
    assert block.block_type is BlockType.PARQUET_DATA
    # magic, size = every byte after the size field, format version 1, type 5
    assert raw[:6] == b"#HUDI#"
    assert struct.unpack(">qii", raw[6:22]) == (len(raw) - 14, 1, 5)
    # the header: schema then instant; the footer: no entries; the trailer: the bytes before it
    assert [k for k, _ in block.header] == [HeaderKey.SCHEMA, HeaderKey.INSTANT_TIME]
    assert block.instant_time == InstantTime("20250113230424191")
    assert block.footer == ()
    assert struct.unpack(">q", raw[-8:]) == (len(raw) - 8,)
    assert block.content[:4] == b"PAR1"
    assert block.encode() == raw
    rows = block.rows()
    assert rows.num_rows == 1
    row = rows.to_pylist()[0]
    # a log record's _hoodie_file_name is the file id, not a file name
    assert row["_hoodie_file_name"] == "ee2ace10-7667-40f5-9848-0a144b5ea064-0"
    assert (row["_hoodie_record_key"], row["ts"]) == (
        "334e26e9-8355-45cc-97c6-c31daf0df330",
        1695159649088,
    )


def test_a_delete_block_of_hudi_parses_and_encodes_to_the_same_bytes() -> None:
    raw = DELETE_LOG.read_bytes()
    (block,) = read_log_blocks(raw, str(DELETE_LOG))
    assert block.block_type is BlockType.DELETE
    assert block.instant_time == InstantTime("20250618054714114")
    assert block.encode() == raw
    # content: int32 version 3, int32 length, one Avro datum of HoodieDeleteRecordList
    assert struct.unpack(">ii", block.content[:8]) == (3, len(block.content) - 8)
    deletes = block.deletes()
    assert [d.record_key for d in deletes] == [
        "e96c4396-3fad-413a-a942-4cb36106d721",
        "9909a8b1-2d15-4d3d-8ec9-efc48c536a00",
        "334e26e9-8355-45cc-97c6-c31daf0df330",
    ]
    assert {d.partition_path for d in deletes} == {"city=san_francisco"}
    # Spark SQL's DELETE carries Hudi's default ordering value, an IntWrapper of 0
    assert {(d.branch, d.ordering_value) for d in deletes} == {(OrderingBranch.INT, 0)}
    assert all(d.is_unordered for d in deletes)
    schema = block.get(HeaderKey.SCHEMA)
    assert schema is not None
    again = delete_block(deletes, block.instant_time, schema)
    assert again.encode() == raw


def test_log_file_names_round_trip_and_sort_by_instant_then_version() -> None:
    name = PARQUET_LOG.name
    parsed = LogFileName.parse(name)
    assert parsed == LogFileName(
        InstantTime("20250113230302428"), 1, "0-188-387", "ee2ace10-7667-40f5-9848-0a144b5ea064-0"
    )
    assert parsed.name == name
    later = LogFileName(parsed.instant_time, 2, "0-1-1", parsed.file_id)
    assert sorted([later, parsed]) == [parsed, later]
    for bad in ("ee2ace10_20250113230302428.log.1_0-1-1", ".f_2025.log.1_0-1-1", ".f_x.parquet"):
        with pytest.raises(CorruptTableError, match="not a log file name"):
            LogFileName.parse(bad)


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        (lambda raw: raw[:-3], r"offset 0 says \d+ bytes follow"),
        (lambda raw: raw + raw[:20], r"offset \d+ says -?\d+ bytes follow|offset \d+ is cut"),
        (lambda raw: raw[:-8] + struct.pack(">q", 7), "offset 0 ends with block length 7"),
        (lambda raw: b"#HUDX#" + raw[6:], "offset 0 does not start with #HUDI#"),
        (lambda raw: raw + b"garbage-garbage", r"offset \d+ does not start with #HUDI#"),
    ],
    ids=["truncated", "second-block-cut", "bad-trailer", "bad-magic", "trailing-garbage"],
)
def test_a_corrupt_log_file_names_the_file_and_the_block_offset(cut: Any, message: str) -> None:
    raw = PARQUET_LOG.read_bytes()
    with pytest.raises(CorruptTableError, match=f"log file where.log: the block at {message}"):
        read_log_blocks(cut(raw), "where.log")


def test_a_second_block_starts_where_the_first_ends() -> None:
    first = PARQUET_LOG.read_bytes()
    second = DELETE_LOG.read_bytes()
    blocks = read_log_blocks(first + second, "two.log")
    assert [b.block_type for b in blocks] == [BlockType.PARQUET_DATA, BlockType.DELETE]
    assert [b.offset for b in blocks] == [0, len(first)]


def test_ordering_values_take_the_avro_branch_of_their_type() -> None:
    # Hudi 1.2.0's wrappers: 1 boolean, 2 int, 3 long, 4 float, 5 double, 6 bytes, 7 string
    assert ordering_values(pa.array([3, 1], pa.int64())) == (OrderingBranch.LONG, [3, 1])
    assert ordering_values(pa.array([3], pa.int32())) == (OrderingBranch.INT, [3])
    assert ordering_values(pa.array(["b"])) == (OrderingBranch.STRING, ["b"])
    assert ordering_values(pa.array([1.5])) == (OrderingBranch.DOUBLE, [1.5])
    assert ordering_values(pa.array([True])) == (OrderingBranch.BOOLEAN, [True])
    with pytest.raises(UnsupportedTableError, match="Hudi's readers need one"):
        ordering_values(pa.array([None, 1], pa.int64()))
    with pytest.raises(UnsupportedTableError, match="cannot be carried"):
        ordering_values(pa.array([[1]]))
    b = OrderingBranch
    values: list[tuple[Any, OrderingBranch]] = [
        (-5, b.LONG),
        (7, b.INT),
        (1.25, b.FLOAT),
        (-2.5, b.DOUBLE),
        ("s", b.STRING),
        (b"\x01", b.BYTES),
        (True, b.BOOLEAN),
        (19000, b.DATE),
        (2**50, b.TIMESTAMP_MICROS),
    ]
    records = [DeleteRecord("k", "p", v, branch) for v, branch in values]
    block = delete_block(records, InstantTime("20240101000000001"), "{}")
    assert read_log_blocks(block.encode(), "x")[0].deletes() == tuple(records)


def lakesink_rows(table: HudiTable) -> list[dict[str, Any]]:
    rows = TableReader(table).snapshot()
    return sorted(rows.select(DATA).to_pylist(), key=lambda r: r["id"]) if rows.num_rows else []


def hudi_rs_rows(table: HudiTable) -> list[dict[str, Any]]:
    batches = hudi.HudiTableBuilder.from_base_uri(str(table.base_path)).build().read()
    if not batches:
        return []
    rows = pa.Table.from_batches(batches).select(DATA).to_pylist()
    return sorted(rows, key=lambda r: r["id"])


BASE: list[Version] = [(k, "u", 10, f"base{k}") for k in range(6)]
DELTAS: list[list[Version]] = [
    # updates above, at and below the stored ordering value; a delete; a new key
    [
        (0, "u", 11, "a0"),
        (1, "u", 10, "a1"),
        (2, "u", 9, "a2"),
        (3, "d", 12, ""),
        (6, "u", 1, "a6"),
    ],
    # a delete below the stored value; a key back after its delete; a delete of a new key
    [(0, "d", 5, ""), (3, "u", 13, "b3"), (6, "d", 2, ""), (4, "u", 20, "b4")],
    # a lower version after a delete; equal values go to the later block
    [(3, "u", 1, "c3"), (4, "u", 20, "c4"), (5, "d", 10, "")],
]


@pytest.mark.parametrize("version", [6, 8])
@pytest.mark.parametrize("ordering", ["ts", None], ids=["event-time", "commit-time"])
def test_deltacommits_read_back_as_the_fold_of_every_version(
    version: int, ordering: str | None
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mor = MorTable(Path(tmp) / "t", version, ordering)
        mor.base(BASE)
        assert lakesink_rows(mor.table) == hudi_rs_rows(mor.table) == fold([BASE], ordering)
        for n in range(1, len(DELTAS) + 1):
            mor.delta(DELTAS[n - 1])
            want = fold([BASE, *DELTAS[:n]], ordering)
            assert lakesink_rows(mor.table) == want, f"after deltacommit {n}"
            assert hudi_rs_rows(mor.table) == want, f"hudi-rs after deltacommit {n}"


@pytest.mark.parametrize("version", [6, 8])
def test_log_files_are_named_as_the_table_version_wants(version: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mor = MorTable(Path(tmp) / "t", version, "ts")
        mor.base(BASE)
        file_id, base_name = mor.groups["day=d0"]
        mor.delta(DELTAS[0])
        mor.delta(DELTAS[1])
        (group,) = [g for g in FileSystemView(mor.table).file_groups() if g.file_id == file_id]
        (s,) = group.slices
        names = [LogFileName.parse(p.rsplit("/", 1)[-1]) for p in s.log_paths]
        if version == 6:  # the base instant, counting versions
            assert [(n.instant_time, n.version) for n in names] == [
                (instant(1), 1),
                (instant(1), 2),
            ]
        else:  # the deltacommit's own instant
            assert [(n.instant_time, n.version) for n in names] == [
                (instant(2), 1),
                (instant(3), 1),
            ]
        assert s.path.endswith(base_name)
        # a completed deltacommit's markers are gone
        assert mor.table.storage.list_keys(f".hoodie/.temp/{instant(3)}") == []


@pytest.mark.parametrize("version", [6, 8])
def test_a_log_file_has_a_marker_of_its_type_and_is_never_overwritten(version: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mor = MorTable(Path(tmp) / "t", version, "ts")
        mor.base(BASE)
        file_id, base_name = mor.groups["day=d0"]
        t = instant(9)
        rows = log_rows(mor.table, data_rows([(0, "u", 30, "x")]), "day=d0", file_id, t, 0)
        kwargs: dict[str, Any] = {"rows": rows, "base_file": base_name, "base_instant": instant(1)}
        done = write_log_file(mor.table, "day=d0", file_id, t, "0-3-0", AVRO, **kwargs)
        marker = "APPEND" if version == 6 else "CREATE"
        keys = mor.table.storage.list_keys(f".hoodie/.temp/{t}")
        assert keys == [f".hoodie/.temp/{t}/{done.write.path}.marker.{marker}"]
        assert list_marked_files(mor.table.storage, t) == [done.write.path]
        with pytest.raises(CommitError, match="exists already"):
            write_log_file(mor.table, "day=d0", file_id, t, "0-3-0", AVRO, **kwargs)
        (block,) = read_log_file(mor.table, done.write.path)
        assert block.instant_time == t and block.rows().column("v").to_pylist() == ["x"]
        assert done.write.num_writes == 1 and done.log_files == (done.write.path.split("/")[1],)


@pytest.mark.parametrize("version", [6, 8])
def test_deltacommit_write_stats_list_the_base_file_and_log_files(version: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mor = MorTable(Path(tmp) / "t", version, "ts")
        mor.base(BASE)
        mor.delta(DELTAS[0])
        mor.delta(DELTAS[1])
        timeline = mor.table.timeline()
        last = timeline.completed(Action.DELTA_COMMIT)[-1]
        assert last.action is Action.DELTA_COMMIT
        raw = mor.table.storage.read(timeline.key_of(last))
        if version == 6:
            stats = json.loads(raw)["partitionToWriteStats"]["day=d0"]
            assert stats[0]["logVersion"] == 2 and stats[0]["logOffset"] == 0
        else:
            (record,) = list(fastavro.reader(io.BytesIO(raw)))
            stats = record["partitionToWriteStats"]["day=d0"]
        (stat,) = stats
        assert stat["baseFile"] == mor.groups["day=d0"][1]
        assert len(stat["logFiles"]) == 2 and stat["path"].endswith(stat["logFiles"][-1])


@pytest.mark.parametrize("version", [6, 8])
def test_a_file_group_of_log_files_only_reads_as_the_fold(version: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mor = MorTable(Path(tmp) / "t", version, "ts")
        mor.base(BASE)
        fresh: list[Version] = [(100, "u", 1, "n0"), (101, "u", 1, "n1"), (102, "u", 4, "n2")]
        later: list[Version] = [(100, "u", 2, "m0"), (101, "d", 3, ""), (102, "u", 3, "m2")]
        mor.delta(fresh, new_group_id="00000000-0000-0000-0000-000000000000-0")
        mor.delta(later)
        (s,) = FileSystemView(mor.table).latest_base_files(["day=d2"])
        assert not s.has_base_file and len(s.log_paths) == 2
        want = fold([BASE, fresh, later], "ts")
        assert any(r["id"] >= 100 for r in want)
        assert lakesink_rows(mor.table) == want
        assert hudi_rs_rows(mor.table) == want


def test_time_travel_reads_the_logs_of_deltacommits_up_to_the_instant() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mor = MorTable(Path(tmp) / "t", 8, "ts")
        mor.base(BASE)
        for batch in DELTAS:
            mor.delta(batch)
        for n in range(len(DELTAS) + 1):
            rows = TableReader(mor.table).as_of(instant(n + 1))
            got = sorted(rows.select(DATA).to_pylist(), key=lambda r: r["id"])
            assert got == fold([BASE, *DELTAS[:n]], "ts")


def test_a_view_of_commits_joins_logs_to_the_slice_at_or_before_their_instant() -> None:
    base = CommitMetadata(
        "UPSERT", (FileWrite("", "f-0", "f-0_0-1-0_20240101000000001.parquet", 1, 1),)
    )
    compacted = CommitMetadata(
        "UPSERT", (FileWrite("", "f-0", "f-0_0-1-0_20240101000000003.parquet", 1, 1),)
    )

    def log(t: int) -> CommitMetadata:
        return CommitMetadata(
            "UPSERT", (FileWrite("", "f-0", f".f-0_{instant(t)}.log.1_0-1-0", 1, 1),)
        )

    def done(t: int, action: Action) -> Instant:
        return Instant(instant(t), action, State.COMPLETED)

    commits = [
        (done(1, Action.DELTA_COMMIT), base),
        (done(2, Action.DELTA_COMMIT), log(2)),
        (done(3, Action.COMMIT), compacted),
        (done(4, Action.DELTA_COMMIT), log(4)),
    ]
    (group,) = FileSystemView.from_commits(commits).file_groups()
    assert [(s.instant_time, s.log_paths) for s in group.slices] == [
        (instant(1), (f".f-0_{instant(2)}.log.1_0-1-0",)),
        (instant(3), (f".f-0_{instant(4)}.log.1_0-1-0",)),
    ]
    stray = CommitMetadata(
        "UPSERT", (FileWrite("", "g-0", f".f-0_{instant(5)}.log.1_0-1-0", 1, 1),)
    )
    with pytest.raises(CorruptTableError, match="names file id 'g-0'"):
        FileSystemView.from_commits([*commits, (done(5, Action.DELTA_COMMIT), stray)])
    assert FileSlice("", "f-0", instant(1), "").has_base_file is False


versions = st.tuples(
    st.integers(0, 7),  # key
    st.sampled_from(["u", "u", "d", "x"]),
    st.integers(0, 3),  # ordering value
)


@pytest.mark.parametrize("version", [6, 8])
@settings(max_examples=8, deadline=None)
@given(
    batches=st.lists(
        st.lists(versions, min_size=1, max_size=6, unique_by=lambda v: v[0]),
        min_size=1,
        max_size=3,
    ),
    ordering=st.sampled_from(["ts", None]),
)
def test_any_deltacommits_read_back_as_the_fold(
    version: int, batches: list[list[tuple[int, str, int]]], ordering: str | None
) -> None:
    base: list[Version] = [(k, "u", 1, f"base{k}") for k in range(0, 8, 2)]
    named = [[(k, op, ts, f"{n}.{k}") for k, op, ts in batch] for n, batch in enumerate(batches)]
    with tempfile.TemporaryDirectory() as tmp:
        mor = MorTable(Path(tmp) / "t", version, ordering)
        mor.base(base)
        for batch in named:
            mor.delta(batch, new_group_id="11111111-0000-0000-0000-000000000000-0")
        want = fold([base, *named], ordering)
        assert lakesink_rows(mor.table) == want
        assert hudi_rs_rows(mor.table) == want


def test_a_block_lakesink_does_not_read_is_refused_naming_it() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mor = MorTable(Path(tmp) / "t", 6, "ts")
        mor.base(BASE)
        block = LogBlock(BlockType.AVRO_DATA, ((HeaderKey.INSTANT_TIME, instant(2).value),), b"")
        file_id, _ = mor.groups["day=d0"]
        name = LogFileName(instant(1), 1, "0-1-0", file_id).name
        mor.table.storage.create(f"day=d0/{name}", block.encode())
        with pytest.raises(UnsupportedTableError, match="AVRO_DATA block at offset 0"):
            merge_slice(mor.table, None, [f"day=d0/{name}"])


def test_log_file_names_follow_the_table_version() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        v6 = MorTable(Path(tmp) / "a" / "t", 6, None).table
        v8 = MorTable(Path(tmp) / "b" / "t", 8, None).table
        prev = [f"p/.f-0_{instant(1)}.log.1_0-1-0", f"p/.f-0_{instant(1)}.log.2_0-1-0"]

        def name(table: HudiTable, base: InstantTime | None, logs: list[str]) -> LogFileName:
            return log_file_name_for(
                table, "f-0", instant(4), "0-1-0", base_instant=base, previous_logs=logs
            )

        # version 6: the base instant, the next version; a group without base: the own instant
        assert name(v6, instant(1), prev) == LogFileName(instant(1), 3, "0-1-0", "f-0")
        assert name(v6, None, []) == LogFileName(instant(4), 1, "0-1-0", "f-0")
        # version 8: the deltacommit's instant, version 1
        assert name(v8, instant(1), prev) == LogFileName(instant(4), 1, "0-1-0", "f-0")


@pytest.mark.parametrize("version", [6, 8])
def test_rolling_back_a_pending_deltacommit_deletes_its_log_files(version: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mor = MorTable(Path(tmp) / "t", version, "ts")
        mor.base(BASE)
        mor.delta(DELTAS[0])
        before = lakesink_rows(mor.table)
        file_id, base_name = mor.groups["day=d0"]
        t = instant(7)
        pending = mor.table.timeline().begin(Action.DELTA_COMMIT, t)
        (s,) = [x for x in FileSystemView(mor.table).latest_base_files() if x.file_id == file_id]
        rows = log_rows(mor.table, data_rows([(0, "u", 99, "lost")]), "day=d0", file_id, t, 0)
        written = write_log_file(
            mor.table,
            "day=d0",
            file_id,
            t,
            "0-4-0",
            AVRO,
            rows=rows,
            base_file=base_name,
            base_instant=instant(1),
            previous_logs=s.log_paths,
        )
        assert mor.table.storage.exists(written.write.path)
        # a pending deltacommit's log file is not read
        assert lakesink_rows(mor.table) == before == hudi_rs_rows(mor.table)
        done = rollback(mor.table, pending)
        assert mor.table.timeline().rollback_metadata(done).deleted_files == {
            "day=d0": (written.write.path,)
        }
        assert not mor.table.storage.exists(written.write.path)
        assert lakesink_rows(mor.table) == before == hudi_rs_rows(mor.table)


def test_deltacommit_instants_round_trip_their_file_names() -> None:
    requested = Instant(instant(1), Action.DELTA_COMMIT, State.REQUESTED)
    for layout in TimelineLayout:
        for inst in (
            requested,
            requested.with_state(State.INFLIGHT),
            requested.with_state(State.COMPLETED, instant(2)),
        ):
            name = inst.file_name(layout)
            assert ".deltacommit" in name
            parsed = Instant.parse(name)
            assert parsed.action is Action.DELTA_COMMIT and parsed.state is inst.state
    assert Action.DELTA_COMMIT.writes_data


def _delete_content(datum: bytes) -> LogBlock:
    content = struct.pack(">ii", 3, len(datum)) + datum
    return LogBlock(BlockType.DELETE, ((HeaderKey.INSTANT_TIME, instant(1).value),), content)


def test_a_corrupt_delete_list_is_refused_naming_the_block() -> None:
    one = DeleteRecord("k", "p", 5, OrderingBranch.LONG)
    datum = delete_block([one], instant(1), "{}").content[8:]
    assert _delete_content(datum).deletes() == (one,)
    with pytest.raises(CorruptTableError, match="delete block at offset 0: the delete list is"):
        _delete_content(datum[:-3]).deletes("f.log")
    with pytest.raises(CorruptTableError, match="2 bytes follow the delete list"):
        _delete_content(datum + b"\x00\x00").deletes("f.log")
    # one record, key "k", partition "p", then union branch 13 (no such wrapper) or 12 (arrays)
    head = b"\x02" + b"\x02\x02k" + b"\x02\x02p"
    with pytest.raises(CorruptTableError, match="union branch 13"):
        _delete_content(head + b"\x1a\x00\x00").deletes("f.log")
    with pytest.raises(UnsupportedTableError, match="several fields"):
        _delete_content(head + b"\x18\x00\x00").deletes("f.log")
    wrong = LogBlock(BlockType.DELETE, (), struct.pack(">ii", 2, 0))
    with pytest.raises(UnsupportedTableError, match="content version 2"):
        wrong.deletes("f.log")


def test_clustering_refuses_a_merge_on_read_table_and_the_spark_reader_merges_its_slices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mor = MorTable(tmp_path / "t", 8, "ts")
    mor.base(BASE)
    mor.delta(DELTAS[0])
    # clustering rewrites base files only (clean, archival and rollback handle log files:
    # tests/unit/test_hudi_mor_services.py); compaction rewrites a merge-on-read table
    assert main(["table", "cluster", str(mor.table.base_path)]) != 0
    err = capsys.readouterr().err
    assert "merge-on-read" in err and "lakesink table compact" in err and "Traceback" not in err
    # snapshot_files lists base files only: it would miss the log files (spark.read reads
    # snapshot_slices, log files included)
    with pytest.raises(UnsupportedTableError, match="merge-on-read"):
        PLUGIN.snapshot_files(mor.table.storage, None)
    slices = PLUGIN.snapshot_slices(mor.table.storage, None)
    assert any(len(files) > 1 for files in slices)
    merged = pa.concat_tables(PLUGIN.read_slice(mor.table.storage, files) for files in slices)
    key = "_hoodie_record_key"
    assert merged.sort_by(key) == TableReader(mor.table).snapshot().sort_by(key)
    assert main(["table", "files", str(mor.table.base_path)]) == 0
