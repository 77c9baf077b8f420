"""Packs of the archived timeline (formats/hudi/table/archive.py): loose archived files gathered
into packs and packs merged by level, with every file readable once at every step, including after
a crash between writing a pack and deleting its sources."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lakesink.errors import CorruptTableError
from lakesink.formats.hudi.table.archive import (
    archived_file_names,
    archived_timeline_folder,
    is_archived_completed,
    iter_archived_files,
    pack_archived_timeline,
    read_archived_file,
)
from lakesink.protocol.instant import InstantTime


def _archive(base: Path, first: int, count: int) -> dict[str, bytes]:
    """Three files per instant, as archival moves them: requested, inflight, completed."""
    folder = archived_timeline_folder(base)
    folder.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {}
    for k in range(first, first + count):
        t = f"20260101{k:09d}"
        for suffix in ("commit.requested", "inflight", "commit"):
            name = f"{t}.{suffix}"
            files[name] = f"{name} content {k}".encode()
            (folder / name).write_bytes(files[name])
    return files


def _everything(base: Path) -> dict[str, bytes]:
    names = archived_file_names(base)
    return dict(iter_archived_files(base, names))


def test_nothing_is_packed_below_the_threshold(tmp_path: Path) -> None:
    files = _archive(tmp_path, 0, 5)
    assert pack_archived_timeline(tmp_path, loose_files=30, fan_in=3) == []
    assert _everything(tmp_path) == files


def test_loose_files_become_a_pack_and_packs_merge_by_level(tmp_path: Path) -> None:
    files: dict[str, bytes] = {}
    written: list[str] = []
    for round_ in range(9):  # 9 archivals of 10 instants, 30 files each
        files |= _archive(tmp_path, round_ * 10, 10)
        written += pack_archived_timeline(tmp_path, loose_files=30, fan_in=3)
        assert _everything(tmp_path) == files
    folder = archived_timeline_folder(tmp_path)
    left = sorted(os.listdir(folder))
    # 9 level-0 packs merged into 3 level-1 packs, those into one level-2 pack
    assert left == ["pack-L2-20260101000000000-20260101000000089.parquet"]
    assert sum(n.startswith("pack-L0-") for n in written) == 9
    assert sum(n.startswith("pack-L1-") for n in written) == 3
    assert (
        read_archived_file(tmp_path, "20260101000000042.inflight")
        == files["20260101000000042.inflight"]
    )
    assert read_archived_file(tmp_path, "20260101000000999.commit") is None
    assert is_archived_completed(tmp_path, InstantTime("20260101000000042"))
    assert not is_archived_completed(tmp_path, InstantTime("20260101000000999"))


def test_a_crash_after_writing_a_pack_leaves_each_file_readable_once(tmp_path: Path) -> None:
    files = _archive(tmp_path, 0, 10)
    folder = archived_timeline_folder(tmp_path)
    before = sorted(os.listdir(folder))
    pack_archived_timeline(tmp_path, loose_files=30, fan_in=3)
    # as if the process died before deleting the loose files it had packed
    for name in before:
        (folder / name).write_bytes(files[name])
    pairs = list(iter_archived_files(tmp_path, archived_file_names(tmp_path)))
    assert len(pairs) == len(files) and dict(pairs) == files
    # the next packing gathers them again; a file in two packs is still read once
    files |= _archive(tmp_path, 10, 1)
    pack_archived_timeline(tmp_path, loose_files=30, fan_in=3)
    pairs = list(iter_archived_files(tmp_path, archived_file_names(tmp_path)))
    assert len(pairs) == len(files) and dict(pairs) == files


def test_a_garbled_pack_is_a_corrupt_table_error_naming_it(tmp_path: Path) -> None:
    _archive(tmp_path, 0, 1)
    bad = archived_timeline_folder(tmp_path) / "pack-L0-1-2.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(CorruptTableError, match=r"pack-L0-1-2\.parquet"):
        archived_file_names(tmp_path)


def test_the_config_defaults_are_the_archive_defaults() -> None:
    from lakesink.config import KEYS_BY_NAME
    from lakesink.formats.hudi.table.archive import PACK_FAN_IN, PACK_LOOSE_FILES

    assert KEYS_BY_NAME["table.services.archive.pack.files"].default == PACK_LOOSE_FILES
    assert KEYS_BY_NAME["table.services.archive.pack.fan.in"].default == PACK_FAN_IN
