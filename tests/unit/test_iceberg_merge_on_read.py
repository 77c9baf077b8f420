"""Writing by key into an Iceberg table of keys, merge-on-read (lakesink.formats.iceberg.rowdelta):
a random sequence of upserts and deletes over a few batches reads back with pyiceberg as the same
rows as copy-on-write and as the plain dict fold of every version; each batch is one row-delta
snapshot (a DELETES manifest of position-delete files, sorted and file-scoped); a rewrite racing a
batch is refused at commit and the batch lands when written again; lakesink iceberg
rewrite-data-files applies the deletes (no delete file left, the rows unchanged); the mode is
kept by the table."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hudi_upsert import DELETE, INSERT, SCHEMA, UPDATE, reference, versions
from test_iceberg_upsert import (
    Offsets,
    _settings,
    changes,
    commit,
    complete,
    open_table,
    ranges_of,
    table_rows,
    write,
    writer,
)

from lakesink.cli.main import main
from lakesink.errors import CommitConflictError, ConfigError
from lakesink.formats import plugin_for
from lakesink.formats.iceberg.keyed import (
    COPY_ON_WRITE,
    MERGE_ON_READ,
    layout_of,
)
from lakesink.formats.iceberg.rewrite import RewriteOptions
from lakesink.formats.iceberg.rowdelta import DELETES_KEY, PATH_FIELD_ID
from lakesink.formats.iceberg.services import rewrite_data_files
from lakesink.formats.iceberg.table import IcebergTable


def local(path: str) -> str:
    return "/" + path.removeprefix("file:").lstrip("/")


def delete_files(table: IcebergTable) -> list[Any]:
    table.refresh()
    return [d for task in table.pyiceberg.scan().plan_files() for d in task.delete_files]


@settings(max_examples=3, deadline=None)
@given(
    batches=st.lists(st.lists(versions, min_size=1, max_size=10), min_size=2, max_size=3),
    ordering=st.sampled_from(["ts", None]),
    buckets=st.integers(1, 3),
    partitioned=st.booleans(),
)
def test_merge_on_read_reads_back_as_copy_on_write_and_the_dict_fold(
    batches: list[list[tuple[int, int, int | None, int]]],
    ordering: str | None,
    buckets: int,
    partitioned: bool,
) -> None:
    offsets = Offsets()
    rows = [[offsets.row(k, op, ts, p) for k, op, ts, p in batch] for batch in batches]
    with tempfile.TemporaryDirectory() as tmp:
        mor = open_table(Path(tmp) / "mor", buckets, ordering, partitioned, MERGE_ON_READ)
        cow = open_table(Path(tmp) / "cow", buckets, ordering, partitioned, COPY_ON_WRITE)
        mor_writer, cow_writer = writer(mor), writer(cow)
        for n, batch in enumerate(rows, start=1):
            commit(mor_writer, n, changes(batch))
            commit(cow_writer, n, changes(batch))
            expected = reference(rows[:n], ordering)
            assert table_rows(mor) == expected
            assert table_rows(cow) == expected
        # copy-on-write never wrote a delete file; every merge-on-read delete file is sorted
        # and names the one data file its bounds say
        assert delete_files(cow) == []
        for d in delete_files(mor):
            found = pq.read_table(local(d.file_path))
            paths = set(found.column("file_path").to_pylist())
            assert paths == {d.lower_bounds[PATH_FIELD_ID].decode()}
            assert d.upper_bounds[PATH_FIELD_ID] == d.lower_bounds[PATH_FIELD_ID]
            pos = found.column("pos").to_pylist()
            assert pos == sorted(pos) and len(pos) == d.record_count
        # applying the deletes keeps the rows and leaves no delete file
        rewrite_data_files(mor, RewriteOptions(1, 1 << 20))
        assert delete_files(mor) == []
        assert table_rows(mor) == reference(rows, ordering)


def test_each_batch_is_one_row_delta_snapshot(tmp_path: Path) -> None:
    table = open_table(tmp_path / "wh", 2, "ts", mode=MERGE_ON_READ)
    coordinator = writer(table)
    o = Offsets()
    commit(coordinator, 1, changes([o.row(k, INSERT, 1) for k in range(6)]))
    first_files = {t.file.file_path for t in table.pyiceberg.scan().plan_files()}
    commit(coordinator, 2, changes([o.row(1, UPDATE, 2), o.row(2, DELETE, 2)]))
    table.refresh()
    snap = table.pyiceberg.current_snapshot()
    assert snap is not None and snap.summary is not None
    assert snap.summary.operation.value == "overwrite"
    assert snap.summary["added-position-delete-files"] == str(len(delete_files(table)))
    assert snap.summary["added-position-deletes"] == "2"
    contents = sorted(m.content.name for m in snap.manifests(table.pyiceberg.io))
    assert "DELETES" in contents and "DATA" in contents
    # the first batch's data files are all still live: nothing was rewritten
    live = {t.file.file_path for t in table.pyiceberg.scan().plan_files()}
    assert first_files <= live
    # a batch of deletes alone: a delete snapshot
    commit(coordinator, 3, changes([o.row(3, DELETE, 3)]))
    table.refresh()
    summary = table.pyiceberg.current_snapshot().summary  # type: ignore[union-attr]
    assert summary is not None and summary.operation.value == "delete"
    assert [r["id"] for r in table_rows(table)] == [0, 1, 4, 5]


def test_table_show_counts_live_rows_and_the_delete_files_that_wait_for_a_rewrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = open_table(tmp_path / "wh", 2, "ts", mode=MERGE_ON_READ)
    coordinator = writer(table)
    o = Offsets()
    commit(coordinator, 1, changes([o.row(k, INSERT, 1) for k in range(6)]))
    commit(coordinator, 2, changes([o.row(1, UPDATE, 2), o.row(2, DELETE, 2)]))
    location = local(table.location)

    def run(*args: str) -> Any:
        capsys.readouterr()
        assert main(["table", *args, location]) == 0
        out = capsys.readouterr().out
        return json.loads(out) if "--json" in args else out

    pending = delete_files(table)
    shown = run("show", "--json")
    # 7 rows in the data files (6, then key 1's new version), 2 of them deleted by position
    assert (shown["records"], shown["records_in_files"]) == (5, 7), shown
    assert (shown["delete_files"], shown["position_deletes"]) == (len(pending), 2), shown
    assert pending and "equality_deletes" not in shown
    assert "wait for a rewrite: lakesink iceberg rewrite-data-files" in run("show")
    files = run("files", "--json")
    assert sum(f["delete_files"] for f in files) == len(pending)
    assert run("timeline", "--json")[-1]["total_records"] == 5
    rewrite_data_files(table, RewriteOptions(1, 1 << 20))
    shown = run("show", "--json")
    assert (shown["records"], shown["records_in_files"], shown["delete_files"]) == (5, 5, 0)
    assert "wait for a rewrite" not in run("show")


def test_a_rewrite_racing_a_batch_is_refused_then_the_batch_lands(tmp_path: Path) -> None:
    table = open_table(tmp_path / "wh", 1, "ts", mode=MERGE_ON_READ)
    o = Offsets()
    ours = writer(table)
    first = changes([o.row(1, INSERT, 1), o.row(2, INSERT, 1)])
    second = changes([o.row(1, UPDATE, 2)])
    commit(ours, 1, first)
    commit(ours, 2, second)  # a delete file on the first batch's data file
    batch = changes([o.row(1, UPDATE, 5), o.row(2, DELETE, 5)])
    t = ours.begin_batch(3, ranges_of(batch))
    assert t is not None
    statuses = write(ours, t, batch)  # positions found in the files as they were
    rewrite_data_files(table, RewriteOptions(1, 1 << 20))  # the deletes applied: new files
    before = table_rows(table)
    with pytest.raises(CommitConflictError, match="bucket 0 changed since the batch read it"):
        complete(ours, t, 3, batch, statuses)
    ours.abort(t)
    assert table_rows(table) == before
    # the refused batch's own files are gone, its position-delete files among them
    written = [d["path"] for s in statuses for d in s.extra.get(DELETES_KEY, ())]
    assert written and not any(Path(local(p)).exists() for p in written)
    commit(ours, 3, batch)
    expected = reference([first.to_pylist(), second.to_pylist(), batch.to_pylist()], "ts")
    assert table_rows(table) == expected


def test_the_mode_is_kept_by_the_table(tmp_path: Path) -> None:
    plugin = plugin_for("iceberg")
    settings = _settings(tmp_path, **{"iceberg.write.mode": "merge-on-read"})
    table = plugin.open_table(settings, partition_fields=(), rows=lambda: SCHEMA)
    layout = layout_of(table.pyiceberg.metadata, table.name)
    assert layout is not None and layout.mode == MERGE_ON_READ
    assert table.pyiceberg.metadata.properties["write.delete.mode"] == MERGE_ON_READ
    with pytest.raises(ConfigError, match=r"iceberg.write.mode=copy-on-write.*merge-on-read"):
        plugin.open_table(_settings(tmp_path), partition_fields=(), rows=lambda: SCHEMA)


@pytest.mark.parametrize("every", [0, 10])
def test_delete_files_past_the_trigger_are_applied_inline(tmp_path: Path, every: int) -> None:
    from lakesink.formats.iceberg.services import iceberg_maintenance_hook, live_delete_files

    table = open_table(tmp_path / "wh", 2, "ts", mode=MERGE_ON_READ)
    coordinator = writer(table)
    keys = {
        "iceberg.write.mode": "merge-on-read",
        "iceberg.services.rewrite.delete.files": 3,
        "table.services.inline.every.commits": every,  # 0: the trigger alone
    }
    settings = _settings(tmp_path, **keys)
    hook = iceberg_maintenance_hook(table, settings)
    o = Offsets()
    rows = []
    found = []
    for n in range(1, 5):
        batch = [o.row(k, INSERT if n == 1 else UPDATE, n) for k in range(4)]
        rows.append(batch)
        commit(coordinator, n, changes(batch))
        ran = hook(coordinator.format.next_instant_time(coordinator.control))
        found.append((live_delete_files(table), ran is not None))
    # batches 2 and 3 leave 2 then 4 delete files (one per bucket each): the 4 are applied
    assert found[:3] == [(0, False), (2, False), (0, True)]
    assert found[3] == (2, False)
    assert delete_files(table) != [] and table_rows(table) == reference(rows, "ts")
