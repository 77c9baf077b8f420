"""Markers: one empty file per data file an instant creates, written BEFORE the data file,
under `.hoodie/.temp/<instantTime>/<partition>/<fileName>.marker.CREATE` (Hudi's direct
marker layout). Rollback and pre-commit cleanup find every file of an instant through them."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from lakesink.protocol.instant import InstantTime
from lakesink.table.atomic import create_empty_exclusive

MARKER_ROOT = ".hoodie/.temp"
MARKER_SUFFIX = ".marker.CREATE"


def marker_dir(table_base: str | Path, instant_time: InstantTime | str) -> Path:
    return Path(table_base) / MARKER_ROOT / str(InstantTime(str(instant_time)))


def create_marker(
    table_base: str | Path, instant_time: InstantTime | str, partition_path: str, file_name: str
) -> Path:
    """Record that `partition_path/file_name` is about to be created by this instant.
    Idempotent: an existing marker is kept."""
    if "/" in file_name or not file_name:
        raise ValueError(f"file name {file_name!r} must be a bare name")
    d = marker_dir(table_base, instant_time)
    path = (
        (d / partition_path / f"{file_name}{MARKER_SUFFIX}")
        if partition_path
        else (d / f"{file_name}{MARKER_SUFFIX}")
    )
    with contextlib.suppress(FileExistsError):
        create_empty_exclusive(path)
    return path


def list_marked_files(table_base: str | Path, instant_time: InstantTime | str) -> list[str]:
    """Relative paths (from the table base) of every file the instant's markers name, sorted."""
    d = marker_dir(table_base, instant_time)
    if not d.is_dir():
        return []
    out: list[str] = []
    for root, _dirs, files in os.walk(d):
        rel_root = Path(root).relative_to(d)
        for f in files:
            if f.endswith(MARKER_SUFFIX):
                rel = rel_root / f[: -len(MARKER_SUFFIX)]
                out.append(rel.as_posix())
    return sorted(out)


def delete_markers(table_base: str | Path, instant_time: InstantTime | str) -> None:
    """Remove the instant's marker folder (no error if it is gone already)."""
    shutil.rmtree(marker_dir(table_base, instant_time), ignore_errors=True)


def delete_unreferenced_files(
    table_base: str | Path, instant_time: InstantTime | str, keep: Iterable[str]
) -> list[str]:
    """Pre-commit cleanup: delete every file the instant's markers name that is not in `keep`
    (relative paths of the files the commit will reference: failed or duplicate task attempts
    leave such files). Returns the relative paths deleted."""
    keep_set = set(keep)
    deleted: list[str] = []
    for rel in list_marked_files(table_base, instant_time):
        if rel in keep_set:
            continue
        path = Path(table_base) / rel
        if path.exists():
            path.unlink()
            deleted.append(rel)
    return deleted
