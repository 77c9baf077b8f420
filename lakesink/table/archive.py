"""lakesink's archive of a table: the instants archival moved out of the active timeline, and the
file-system state they leave behind, so that readers need not read archived commits.

Under `.hoodie/.lakesink/archive/` (hudi-rs never lists it):
- `timeline/`: the archived instant files, as they were in the active timeline;
- `views/<T>.view.parquet`: the archived view, one row per file group live after every instant
  up to T (the last archived instant time) with its latest base file. A reader lists the active
  timeline first and then takes the newest view, and ignores active instants at or before T
  (archival writes the view before it moves any instant, so a reader never misses one);
- `writers.json`: every writer's newest archived offsets (lakesink.services.archival).

hudi-rs needs nothing of this: it reads a base file older than the active timeline as
committed, which is why archival first makes sure no other file that old is on storage.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lakesink.errors import CorruptTableError
from lakesink.protocol.instant import InstantTime
from lakesink.table.view import FileSlice

ARCHIVE_DIR = Path(".hoodie") / ".lakesink" / "archive"
VIEW_SUFFIX = ".view.parquet"
KEEP_VIEWS = 2
"""Older views are deleted, but the one before the newest stays for readers that chose it."""

_SCHEMA = pa.schema(
    [
        ("partition_path", pa.string()),
        ("file_id", pa.string()),
        ("instant_time", pa.string()),
        ("path", pa.string()),
        ("file_size_bytes", pa.int64()),
        ("num_records", pa.int64()),
    ]
)
_UPTO = b"lakesink.archived.upto"
_COMPLETED_UPTO = b"lakesink.archived.completed_upto"
_TABLE_SCHEMA = b"lakesink.archived.table_schema"


@dataclass(frozen=True, slots=True)
class ArchivedView:
    """What the archived instants leave visible."""

    upto: InstantTime
    """The last archived instant time: every completed instant up to it is archived."""
    completed_upto: InstantTime
    """The latest completion time among archived instants (their instant time in layout 1):
    every active instant completed after it, so incremental reads may start there."""
    slices: tuple[FileSlice, ...]
    """The latest base file of every file group live after `upto`."""
    table_schema: str | None = None
    """The Avro schema of the last archived data instant that recorded one."""


def archive_folder(base_path: Path) -> Path:
    return base_path / ARCHIVE_DIR


def archived_timeline_folder(base_path: Path) -> Path:
    return base_path / ARCHIVE_DIR / "timeline"


def is_archived_completed(base_path: Path, instant_time: InstantTime) -> bool:
    """Whether instant `instant_time` completed and was archived (a slow listing: for the rare
    question of a publisher that finds its instant gone from the active timeline)."""
    try:
        names = os.listdir(archived_timeline_folder(base_path))
    except FileNotFoundError:
        return False
    prefix = instant_time.value
    return any(
        n.startswith(prefix) and n[len(prefix)] in "._" and n.endswith(("commit", "replacecommit"))
        for n in names
        if len(n) > len(prefix)
    )


def _views_folder(base_path: Path) -> Path:
    return base_path / ARCHIVE_DIR / "views"


def _view_names(base_path: Path) -> list[str]:
    try:
        names = os.listdir(_views_folder(base_path))
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.endswith(VIEW_SUFFIX) and not n.startswith("."))


_CACHE: dict[str, tuple[str, tuple[int, int, int], ArchivedView]] = {}
"""Table base path -> its newest view file's (name, identity, parsed view): a view file is
written once and never changed, and every file-system view of the table reads it. Only the
newest is kept: an older one holds as many slices and is never asked for again."""


def load_archived_view(base_path: Path) -> ArchivedView | None:
    """The newest archived view, or None when nothing was ever archived."""
    for _ in range(3):  # archival may delete an old view between listing and reading
        names = _view_names(base_path)
        if not names:
            return None
        path = _views_folder(base_path) / names[-1]
        try:
            st = path.stat()
            identity = (st.st_ino, st.st_mtime_ns, st.st_size)
            hit = _CACHE.get(str(base_path))
            if hit is not None and hit[0] == names[-1] and hit[1] == identity:
                return hit[2]
            view = _read_view(path)
        except FileNotFoundError:
            continue
        if len(_CACHE) >= 16:
            _CACHE.clear()
        _CACHE[str(base_path)] = (names[-1], identity, view)
        return view
    raise CorruptTableError(f"archived views in {_views_folder(base_path)} keep disappearing")


def _read_view(path: Path) -> ArchivedView:
    try:
        t = pq.read_table(path)
        meta = t.schema.metadata or {}
        upto = InstantTime(meta[_UPTO].decode())
        completed_upto = InstantTime(meta[_COMPLETED_UPTO].decode())
        schema = meta.get(_TABLE_SCHEMA, b"").decode() or None
        cols = [t.column(f.name).to_pylist() for f in _SCHEMA]
    except FileNotFoundError:
        raise
    except (pa.ArrowInvalid, OSError, KeyError, ValueError) as e:
        raise CorruptTableError(f"archived view {path} cannot be read: {e}") from e
    slices = tuple(
        FileSlice(p, f, InstantTime(i), rel, size, n)
        for p, f, i, rel, size, n in zip(*cols, strict=True)
    )
    return ArchivedView(upto, completed_upto, slices, schema)


def write_archived_view(base_path: Path, view: ArchivedView) -> Path:
    """Write `view` as the newest archived view (temp file, then rename), and delete all but
    the newest KEEP_VIEWS views."""
    folder = _views_folder(base_path)
    folder.mkdir(parents=True, exist_ok=True)
    ordered = sorted(view.slices)
    columns = [
        pa.array([s.partition_path for s in ordered], pa.string()),
        pa.array([s.file_id for s in ordered], pa.string()),
        pa.array([s.instant_time.value for s in ordered], pa.string()),
        pa.array([s.path for s in ordered], pa.string()),
        pa.array([s.file_size_bytes for s in ordered], pa.int64()),
        pa.array([s.num_records for s in ordered], pa.int64()),
    ]
    meta = {
        _UPTO: view.upto.value.encode(),
        _COMPLETED_UPTO: view.completed_upto.value.encode(),
        _TABLE_SCHEMA: (view.table_schema or "").encode(),
    }
    table = pa.Table.from_arrays(columns, schema=_SCHEMA.with_metadata(meta))
    target = folder / f"{view.upto.value}{VIEW_SUFFIX}"
    tmp = folder / f".{target.name}.{os.getpid()}.tmp"
    pq.write_table(table, tmp, compression="zstd")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, target)
    for old in _view_names(base_path)[:-KEEP_VIEWS]:
        with contextlib.suppress(FileNotFoundError):
            (folder / old).unlink()
    return target
