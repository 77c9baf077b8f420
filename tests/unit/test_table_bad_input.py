"""Bad input: every case raises a LakesinkError naming the file, column or value; nothing
half-written is published. Uses a temporary local folder."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from lakesink.errors import (
    CommitError,
    CorruptTableError,
    SchemaMismatchError,
    TableError,
    TableNotFoundError,
    UnsupportedTableError,
)
from lakesink.formats.hudi.table import rollback as rollback_module
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.markers import list_marked_files
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.table.rollback import rollback
from lakesink.formats.hudi.table.writer import PartitionedWriter
from lakesink.protocol.instant import Action, InstantTime, State

T1 = InstantTime("20240101000000001")
T2 = InstantTime("20240101000000002")
T3 = InstantTime("20240101000000003")


def rows(ids: list[int], day: str = "d1") -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "day": [day] * len(ids)})


def commit(table: HudiTable, time: InstantTime, data: pa.Table) -> None:
    inst = table.timeline().begin(Action.COMMIT, time)
    w = PartitionedWriter(table, time, "0-1-0")
    w.write(data)
    writes = w.close()
    table.timeline().publish(
        inst, CommitMetadata("BULK_INSERT", tuple(writes), schema=w.avro_schema or "")
    )


@pytest.fixture(params=[6, 8], ids=["v6", "v8"])
def table(request: pytest.FixtureRequest, tmp_path: Path) -> HudiTable:
    cfg = TableConfig("t", ("id",), ("day",), version=request.param)
    return HudiTable.create(tmp_path / "t", cfg)


def test_open_a_path_that_is_not_a_table(tmp_path: Path) -> None:
    with pytest.raises(TableNotFoundError, match=str(tmp_path / "nothing")):
        HudiTable.open(tmp_path / "nothing")


def test_open_an_unsupported_version(table: HudiTable) -> None:
    props = table.base_path / ".hoodie/hoodie.properties"
    v = table.config.version
    text = props.read_text().replace(f"hoodie.table.version={v}", "hoodie.table.version=5")
    props.write_text(text)
    with pytest.raises(UnsupportedTableError, match="version 5"):
        HudiTable.open(table.base_path)


def test_create_is_idempotent_but_never_overwrites_another_table(table: HudiTable) -> None:
    assert HudiTable.create(table.base_path, table.config).config == table.config
    other = TableConfig("t", ("other",), ("day",), version=table.config.version)
    with pytest.raises(TableError, match="recordkey"):
        HudiTable.create(table.base_path, other)


@pytest.mark.parametrize("content", [b"", b"\x00\x01garbage"])
def test_empty_or_garbled_commit_file_names_the_file(table: HudiTable, content: bytes) -> None:
    commit(table, T1, rows([1, 2]))
    [inst] = table.timeline().completed()
    path = table.timeline().path_of(inst)
    path.write_bytes(content)
    with pytest.raises(CorruptTableError, match=path.name):
        TableReader(table).snapshot()


def test_missing_base_file_names_it(table: HudiTable) -> None:
    commit(table, T1, rows([1, 2]))
    victim = next(table.base_path.glob("day=d1/*.parquet"))
    victim.unlink()
    with pytest.raises(CorruptTableError, match=victim.name):
        TableReader(table).snapshot()


def test_rows_not_matching_the_table_schema_name_the_column(table: HudiTable) -> None:
    commit(table, T1, rows([1]))
    bad = pa.table({"id": pa.array(["x"], pa.string()), "day": ["d1"]})
    w = PartitionedWriter(table, T2, "0-1-0")
    with pytest.raises(SchemaMismatchError, match=r"'id'.*string.*long"):
        w.write(bad)
    extra = rows([2]).append_column("more", pa.array([1.0]))
    with pytest.raises(SchemaMismatchError, match="'more'"):
        PartitionedWriter(table, T2, "0-1-0").write(extra)


def test_missing_partition_or_key_column(table: HudiTable) -> None:
    w = PartitionedWriter(table, T1, "0-1-0")
    with pytest.raises(SchemaMismatchError, match="partition column 'day'"):
        w.write(pa.table({"id": [1]}))
    with pytest.raises(SchemaMismatchError, match="partition value"):
        w.write(pa.table({"id": [1], "day": ["a/b"]}))
    with pytest.raises(SchemaMismatchError, match="record key column 'id'"):
        w.write(pa.table({"x": [1], "day": ["d"]}))


def test_begin_twice_and_publish_twice_fail_clearly(table: HudiTable) -> None:
    inst = table.timeline().begin(Action.COMMIT, T1)
    with pytest.raises(CommitError, match=f"{T1} is taken"):
        table.timeline().begin(Action.COMMIT, T1)
    md = CommitMetadata("BULK_INSERT")
    table.timeline().publish(inst, md)
    with pytest.raises(CommitError, match="already completed"):
        table.timeline().publish(inst, md)
    completed = [p for p in table.timeline_path.iterdir() if p.name.endswith(".commit")]
    assert len(completed) == 1 and completed[0].stat().st_size > 0


def test_publish_of_an_instant_never_begun_fails(table: HudiTable) -> None:
    from lakesink.protocol.instant import Instant

    with pytest.raises(CommitError, match="never begun"):
        table.timeline().publish(
            Instant(T1, Action.COMMIT, State.INFLIGHT), CommitMetadata("INSERT")
        )


def test_rollback_refuses_a_completed_instant(table: HudiTable) -> None:
    commit(table, T1, rows([1]))
    [inst] = table.timeline().completed()
    with pytest.raises(CommitError, match="completed"):
        rollback(table, inst)


def test_rollback_interrupted_then_rerun_finishes(
    table: HudiTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit(table, T1, rows([1, 2]))
    inst = table.timeline().begin(Action.COMMIT, T2)
    w = PartitionedWriter(table, T2, "0-1-0")
    w.write(rows([3, 4], "d2"))
    w.close()
    assert list_marked_files(table.base_path, T2)

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError("crash before the rollback completes")

    monkeypatch.setattr(rollback_module, "_finish", crash)
    with pytest.raises(OSError, match="crash"):
        rollback(table, inst)
    monkeypatch.undo()
    done = rollback(table, inst)
    assert done.action is Action.ROLLBACK and done.is_completed
    assert rollback(table, inst) == done  # and again: nothing left to do
    tl = table.timeline()
    assert tl.get(T2) is None
    assert not list_marked_files(table.base_path, T2)
    assert not list(table.base_path.glob(f"day=*/*_{T2}.parquet"))
    assert sorted(TableReader(table).snapshot().column("id").to_pylist()) == [1, 2]
    assert len(tl.completed(Action.ROLLBACK)) == 1


def test_rollback_of_an_instant_never_begun(table: HudiTable) -> None:
    from lakesink.protocol.instant import Instant

    with pytest.raises(CommitError, match="not on the timeline"):
        rollback(table, Instant(T3, Action.COMMIT, State.INFLIGHT))
