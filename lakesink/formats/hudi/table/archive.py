"""lakesink's archive of a table: the instants archival moved out of the active timeline, and the
file-system state they leave behind, so that readers need not read archived commits.

Under `.hoodie/.lakesink/archive/` (hudi-rs never lists it):
- `timeline/`: the archived instant files, as they were in the active timeline: loose files as
  archival moved them, and packs (`pack-L<level>-<first>-<last>.parquet`, one row per file:
  name, content) into which archival gathers loose files and, size-tiered, smaller packs, so
  the archive of a table with 100k commits is a few dozen files rather than 300k;
- `views/<T>.view.parquet`: the archived view, one row per file group live after every instant
  up to T (the last archived instant time) with its latest base file and, on a merge-on-read
  table, the log files archived deltacommits wrote over it. A reader lists the active
  timeline first and then takes the newest view, and ignores active instants at or before T
  (archival writes the view before it moves any instant, so a reader never misses one);
- `writers.json`: every writer's newest archived offsets (lakesink.formats.hudi.services.archival).

hudi-rs needs nothing of this: it reads a base file (or a log file) older than the active
timeline as committed, which is why archival first makes sure no other file that old is on
storage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from lakesink.errors import CorruptTableError
from lakesink.formats.hudi.table.file_group import FileSlice
from lakesink.protocol.instant import InstantTime
from lakesink.storage import ObjectNotFoundError, Storage, as_storage

Where = Storage | Path
"""A table root: its storage, or the folder of a local table."""

_T = TypeVar("_T")

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
        ("log_paths", pa.list_(pa.string())),
    ]
)
_OPTIONAL_COLUMNS = frozenset({"log_paths"})
"""Columns a view written before merge-on-read archival lacks (read as empty)."""
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
    """The latest slice of every file group live after `upto`: its base file and (merge-on-read)
    the log files archived deltacommits wrote over it."""
    table_schema: str | None = None
    """The Avro schema of the last archived data instant that recorded one."""


ARCHIVE_KEY = ARCHIVE_DIR.as_posix()
TIMELINE_KEY = f"{ARCHIVE_KEY}/timeline"
VIEWS_KEY = f"{ARCHIVE_KEY}/views"


def archive_folder(base_path: Path) -> Path:
    return base_path / ARCHIVE_DIR


def archived_timeline_folder(base_path: Path) -> Path:
    return base_path / ARCHIVE_DIR / "timeline"


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return bytes(sink.getvalue().to_pybytes())


def _read_parquet(storage: Storage, key: str, **kwargs: object) -> pa.Table:
    """A Parquet object read whole (archive files are small); FileNotFoundError if gone."""
    try:
        data = storage.read(key)
    except ObjectNotFoundError as e:
        raise FileNotFoundError(key) from e
    return pq.read_table(pa.BufferReader(data), **kwargs)


def is_archived_completed(base_path: Where, instant_time: InstantTime) -> bool:
    """Whether instant `instant_time` completed and was archived (a slow listing: for the rare
    question of a publisher that finds its instant gone from the active timeline)."""
    names = archived_file_names(base_path)
    prefix = instant_time.value
    return any(
        n.startswith(prefix) and n[len(prefix)] in "._" and n.endswith(("commit", "replacecommit"))
        for n in names
        if len(n) > len(prefix)
    )


def _names_in(storage: Storage, folder_key: str) -> list[str]:
    return [m.key.rsplit("/", 1)[-1] for m in storage.list_folder(folder_key).objects]


def _view_names(base_path: Where) -> list[str]:
    names = _names_in(as_storage(base_path), VIEWS_KEY)
    return sorted(n for n in names if n.endswith(VIEW_SUFFIX) and not n.startswith("."))


_CACHE: dict[str, tuple[str, tuple[int, int, int], ArchivedView]] = {}
"""Table base path -> its newest view file's (name, identity, parsed view): a view file is
written once and never changed, and every file-system view of the table reads it. Only the
newest is kept: an older one holds as many slices and is never asked for again."""


def load_archived_view(base_path: Where) -> ArchivedView | None:
    """The newest archived view, or None when nothing was ever archived."""
    storage = as_storage(base_path)
    for _ in range(3):  # archival may delete an old view between listing and reading
        names = _view_names(storage)
        if not names:
            return None
        key = f"{VIEWS_KEY}/{names[-1]}"
        meta = storage.head(key)
        if meta is None:
            continue
        identity = (0, hash(meta.etag), meta.size)
        hit = _CACHE.get(storage.uri)
        if hit is not None and hit[0] == names[-1] and hit[1] == identity:
            return hit[2]
        try:
            view = _read_view(storage, key)
        except FileNotFoundError:
            continue
        if len(_CACHE) >= 16:
            _CACHE.clear()
        _CACHE[storage.uri] = (names[-1], identity, view)
        return view
    raise CorruptTableError(f"archived views in {storage.uri}/{VIEWS_KEY} keep disappearing")


def _read_view(storage: Storage, key: str) -> ArchivedView:
    path = f"{storage.uri}/{key}"
    try:
        t = _read_parquet(storage, key)
        meta = t.schema.metadata or {}
        upto = InstantTime(meta[_UPTO].decode())
        completed_upto = InstantTime(meta[_COMPLETED_UPTO].decode())
        schema = meta.get(_TABLE_SCHEMA, b"").decode() or None
        cols = [
            t.column(f.name).to_pylist()
            if f.name in t.column_names or f.name not in _OPTIONAL_COLUMNS
            else [None] * t.num_rows
            for f in _SCHEMA
        ]
    except FileNotFoundError:
        raise
    except (pa.ArrowInvalid, OSError, KeyError, ValueError) as e:
        raise CorruptTableError(f"archived view {path} cannot be read: {e}") from e
    slices = tuple(
        FileSlice(p, f, InstantTime(i), rel, size, n, tuple(logs or ()))
        for p, f, i, rel, size, n, logs in zip(*cols, strict=True)
    )
    return ArchivedView(upto, completed_upto, slices, schema)


def write_archived_view(base_path: Where, view: ArchivedView) -> str:
    """Write `view` as the newest archived view (one whole-object write), and delete all but
    the newest KEEP_VIEWS views. Returns its key."""
    storage = as_storage(base_path)
    ordered = sorted(view.slices)
    columns = [
        pa.array([s.partition_path for s in ordered], pa.string()),
        pa.array([s.file_id for s in ordered], pa.string()),
        pa.array([s.instant_time.value for s in ordered], pa.string()),
        pa.array([s.path for s in ordered], pa.string()),
        pa.array([s.file_size_bytes for s in ordered], pa.int64()),
        pa.array([s.num_records for s in ordered], pa.int64()),
        pa.array([list(s.log_paths) for s in ordered], pa.list_(pa.string())),
    ]
    meta = {
        _UPTO: view.upto.value.encode(),
        _COMPLETED_UPTO: view.completed_upto.value.encode(),
        _TABLE_SCHEMA: (view.table_schema or "").encode(),
    }
    table = pa.Table.from_arrays(columns, schema=_SCHEMA.with_metadata(meta))
    target = f"{VIEWS_KEY}/{view.upto.value}{VIEW_SUFFIX}"
    storage.write(target, _parquet_bytes(table))
    for old in _view_names(storage)[:-KEEP_VIEWS]:
        storage.delete(f"{VIEWS_KEY}/{old}")
    return target


# --- packs of archived timeline files ---------------------------------------------------------

PACK_PREFIX = "pack-L"
PACK_SUFFIX = ".parquet"
PACK_LOOSE_FILES = 600
"""Loose archived files gathered into a level-0 pack at once (about 200 instants)."""
PACK_FAN_IN = 10
"""Packs of one level merged into one pack of the next level (size-tiered, as an LSM tree)."""

_PACK_SCHEMA = pa.schema([("name", pa.string()), ("content", pa.binary())])
_PACK_INDEX: dict[str, frozenset[str]] = {}
"""Pack path -> the file names it holds: a pack is written once and never changed."""


def _is_pack(name: str) -> bool:
    return name.startswith(PACK_PREFIX) and name.endswith(PACK_SUFFIX)


def _pack_level(name: str) -> int:
    return int(name[len(PACK_PREFIX) :].split("-", 1)[0])


def _listing(storage: Storage) -> tuple[list[str], list[str]]:
    """(loose file names, pack names) in the archived timeline folder, each sorted."""
    names = _names_in(storage, TIMELINE_KEY)
    loose = sorted(n for n in names if not n.startswith(".") and not _is_pack(n))
    return loose, sorted(n for n in names if _is_pack(n))


def _pack_index(storage: Storage, pack: str) -> frozenset[str]:
    path = f"{storage.uri}/{TIMELINE_KEY}/{pack}"
    hit = _PACK_INDEX.get(path)
    if hit is None:
        try:
            names = (
                _read_parquet(storage, f"{TIMELINE_KEY}/{pack}", columns=["name"])
                .column("name")
                .to_pylist()
            )
        except FileNotFoundError:
            raise  # merged away: the caller lists again (not a CorruptTableError below)
        except (pa.ArrowInvalid, OSError, KeyError) as e:
            raise CorruptTableError(f"archive pack {path} cannot be read: {e}") from e
        if len(_PACK_INDEX) >= 4096:
            _PACK_INDEX.clear()
        hit = _PACK_INDEX[path] = frozenset(names)
    return hit


def _pack_files(storage: Storage, pack: str) -> list[tuple[str, bytes]]:
    """(name, content) of every file in a pack."""
    rows = _read_parquet(storage, f"{TIMELINE_KEY}/{pack}")
    return list(
        zip(rows.column("name").to_pylist(), rows.column("content").to_pylist(), strict=True)
    )


def _retrying(read: Callable[[], _T]) -> _T:
    """Runs `read` again when a pack it opened was merged away meanwhile (listing is redone)."""
    for _ in range(5):
        try:
            return read()
        except FileNotFoundError:
            continue
    raise CorruptTableError("archive packs keep disappearing while being read")


def archived_file_names(base_path: Where) -> set[str]:
    """Names of every archived timeline file, loose or packed."""
    storage = as_storage(base_path)

    def read() -> set[str]:
        loose, packs = _listing(storage)
        names = set(loose)
        for pack in packs:
            names |= _pack_index(storage, pack)
        return names

    return _retrying(read)


def read_archived_file(base_path: Where, name: str) -> bytes | None:
    """The content of archived timeline file `name`, or None when it is not archived."""
    storage = as_storage(base_path)

    def read() -> bytes | None:
        with contextlib.suppress(ObjectNotFoundError):
            return storage.read(f"{TIMELINE_KEY}/{name}")
        _, packs = _listing(storage)
        for pack in reversed(packs):
            if name in _pack_index(storage, pack):
                rows = _read_parquet(
                    storage, f"{TIMELINE_KEY}/{pack}", filters=[("name", "=", name)]
                )
                return bytes(rows.column("content")[0].as_py())
        return None

    return _retrying(read)


def iter_archived_files(base_path: Where, names: set[str]) -> Iterator[tuple[str, bytes]]:
    """(name, content) of each archived file among `names` that exists, each once, reading
    every pack at most once."""
    storage = as_storage(base_path)
    loose, packs = _listing(storage)
    pending = set(names)
    for name in loose:
        if name in pending:
            with contextlib.suppress(ObjectNotFoundError):  # packed meanwhile: found below
                content = storage.read(f"{TIMELINE_KEY}/{name}")
                pending.discard(name)
                yield name, content
    for pack in packs:
        try:
            wanted = pending & _pack_index(storage, pack)
            if not wanted:
                continue
            files = _pack_files(storage, pack)
        except FileNotFoundError:  # merged meanwhile: its files are in a newer pack
            continue
        for name, content in files:
            if name in wanted and name in pending:
                pending.discard(name)
                yield name, content
    if pending and (_listing(storage)[1] != packs):
        yield from iter_archived_files(storage, pending)  # packs changed while reading


def _write_pack(storage: Storage, level: int, files: list[tuple[str, bytes]]) -> str:
    files = sorted(dict(files).items())
    first, last = (files[0][0].split(".")[0], files[-1][0].split(".")[0])
    name = f"{PACK_PREFIX}{level}-{first}-{last}{PACK_SUFFIX}"
    table = pa.Table.from_arrays(
        [
            pa.array([n for n, _ in files], pa.string()),
            pa.array([c for _, c in files], pa.binary()),
        ],
        schema=_PACK_SCHEMA,
    )
    storage.write(f"{TIMELINE_KEY}/{name}", _parquet_bytes(table))
    return name


def pack_archived_timeline(
    base_path: Where, *, loose_files: int = PACK_LOOSE_FILES, fan_in: int = PACK_FAN_IN
) -> list[str]:
    """Under archival's lock: gather the loose archived files into a pack once there are
    `loose_files` of them, and merge `fan_in` packs of a level into one of the next level.
    Each new pack is in place before its sources are deleted, so a crash leaves at worst a
    file both loose (or in an old pack) and packed, which readers take once. Returns the names
    of the packs written."""
    storage = as_storage(base_path)
    written: list[str] = []
    loose, packs = _listing(storage)
    if len(loose) >= loose_files:
        files = [(n, storage.read(f"{TIMELINE_KEY}/{n}")) for n in loose]
        written.append(_write_pack(storage, 0, files))
        storage.delete_many([f"{TIMELINE_KEY}/{n}" for n in loose])
        loose, packs = _listing(storage)
    level = 0
    while packs:
        at_level = [p for p in packs if _pack_level(p) == level]
        if len(at_level) >= fan_in:
            sources = at_level[:fan_in]
            files = [f for pack in sources for f in _pack_files(storage, pack)]
            written.append(_write_pack(storage, level + 1, files))
            storage.delete_many([f"{TIMELINE_KEY}/{pack}" for pack in sources])
            _, packs = _listing(storage)
            continue
        if all(_pack_level(p) <= level for p in packs):
            break
        level += 1
    return written
