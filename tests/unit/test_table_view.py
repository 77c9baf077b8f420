"""The file-system view, built from commit metadata only (no I/O)."""

from __future__ import annotations

import pytest

from lakesink.errors import CorruptTableError
from lakesink.formats.hudi.table.files import base_file_name
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.view import FileSystemView, incremental_slices
from lakesink.protocol.instant import Action, Instant, InstantTime, State
from lakesink.protocol.write_status import FileWrite


def t(n: int) -> InstantTime:
    return InstantTime(f"202401010000{n:05d}")


def done(n: int, completed: int | None = None, action: Action = Action.COMMIT) -> Instant:
    return Instant(t(n), action, State.COMPLETED, t(completed) if completed else None)


def write(partition: str, file_id: str, n: int, rows: int = 10) -> FileWrite:
    name = base_file_name(file_id, "0-1-0", t(n))
    return FileWrite(partition, file_id, f"{partition}/{name}", rows, 100, "null", rows, 100)


def commit(
    *writes: FileWrite, replaced: dict[str, tuple[str, ...]] | None = None
) -> CommitMetadata:
    op = "CLUSTER" if replaced else "BULK_INSERT"
    return CommitMetadata(op, writes, replaced_file_ids=replaced or {})


COMMITS = [
    (done(1), commit(write("p=a", "a1-0", 1), write("p=b", "b1-0", 1))),
    (done(2), commit(write("p=a", "a2-0", 2))),
    (
        done(3, action=Action.REPLACE_COMMIT),
        commit(write("p=a", "a3-0", 3, rows=20), replaced={"p=a": ("a1-0", "a2-0")}),
    ),
    (done(4), commit(write("p=b", "b4-0", 4))),
]


def test_latest_base_files_hide_replaced_file_groups() -> None:
    view = FileSystemView.from_commits(COMMITS)
    assert [(s.partition_path, s.file_id) for s in view.latest_base_files()] == [
        ("p=a", "a3-0"),
        ("p=b", "b1-0"),
        ("p=b", "b4-0"),
    ]
    assert view.replaced_file_groups() == {("p=a", "a1-0"), ("p=a", "a2-0")}
    assert view.partitions() == ["p=a", "p=b"]
    assert view.total_records == 40
    assert [s.file_id for s in view.latest_base_files(["p=b"])] == ["b1-0", "b4-0"]


def test_as_of_ignores_later_instants_and_their_replacements() -> None:
    view = FileSystemView.from_commits(COMMITS, as_of=t(2))
    assert sorted(s.file_id for s in view.latest_base_files()) == ["a1-0", "a2-0", "b1-0"]


def test_uncompleted_instants_are_never_visible() -> None:
    pending = Instant(t(5), Action.COMMIT, State.INFLIGHT)
    view = FileSystemView.from_commits([*COMMITS, (pending, commit(write("p=c", "c5-0", 5)))])
    assert "p=c" not in view.partitions()


def test_latest_slice_of_a_file_group_wins() -> None:
    commits = [(done(1), commit(write("p=a", "f-0", 1))), (done(2), commit(write("p=a", "f-0", 2)))]
    [group] = FileSystemView.from_commits(commits).file_groups()
    assert [s.instant_time for s in group.slices] == [t(1), t(2)]
    assert group.latest.instant_time == t(2)
    [old] = FileSystemView.from_commits(commits, as_of=t(1)).latest_base_files()
    assert old.instant_time == t(1)


def test_two_files_of_one_instant_in_one_file_group_are_corrupt() -> None:
    w = write("p=a", "f-0", 1)
    with pytest.raises(CorruptTableError, match="two base files"):
        FileSystemView.from_commits([(done(1), commit(w, w))])


def test_write_stat_that_disagrees_with_its_file_name_is_corrupt() -> None:
    bad = FileWrite("p=a", "other-0", write("p=a", "f-0", 1).path, 1, 1)
    with pytest.raises(CorruptTableError, match="file id"):
        FileSystemView.from_commits([(done(1), commit(bad))])


def test_incremental_by_requested_and_by_completion_time() -> None:
    # instant 2 was requested before instant 3 but completed after it (two writers)
    commits = [
        (done(1, 1), commit(write("p=a", "a1-0", 1))),
        (done(2, 9), commit(write("p=a", "a2-0", 2))),
        (done(3, 5), commit(write("p=a", "a3-0", 3))),
    ]
    slices, times = incremental_slices(commits, t(1), t(5), by="completion")
    assert times == {t(3)} and [s.file_id for s in slices] == ["a3-0"]
    slices, times = incremental_slices(commits, t(5), t(9), by="completion")
    assert times == {t(2)}  # a reader that consumed up to completion 5 still gets instant 2
    _, times = incremental_slices(commits, t(1), t(2), by="requested")
    assert times == {t(2)}
    _, times = incremental_slices(commits, t(2), t(9), by="requested")
    assert times == {t(3)}  # ordering by requested time would have skipped instant 2 above
