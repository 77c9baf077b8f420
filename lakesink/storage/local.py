"""Storage on a local (or shared POSIX) filesystem: whole-object writes go through a fsynced
temporary file in the root's temporary folder (`.hoodie/.aux/lakesink/tmp/` in a Hudi table,
where readers ignore it; the table format names it, `.lakesink/tmp/` in an Iceberg warehouse);
create-if-absent is a hard link (fails if the target exists, like O_EXCL); replace-if-unchanged
compares a version tag under one advisory lock file of the root's."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakesink.storage.base import (
    Listing,
    ObjectChangedError,
    ObjectExistsError,
    ObjectMeta,
    ObjectNotFoundError,
    Storage,
    StorageError,
)

if TYPE_CHECKING:
    import pyarrow.fs

TMP_FOLDER = ".hoodie/.aux/lakesink/tmp"  # the default: inside a Hudi table's `.hoodie/`
# In a root that is no Hudi table (an Iceberg warehouse) lakesink's own files are in `.lakesink/`
LAKESINK_TMP_FOLDER = ".lakesink/tmp"
# replace-if-unchanged's advisory lock, one per root (a file per key would pile up: lock keys
# carry sequence numbers)
REPLACE_LOCK = "replace.lock"
# A temporary file lives while one object is written; one this old is a dead writer's
STALE_TEMPORARY_S = 600.0


def fsync_dir(path: Path) -> None:
    """Make a rename or link in folder `path` durable: fsync the folder itself. A folder that
    cannot be opened, or a filesystem that cannot fsync folders (EINVAL, EBADF), is passed
    over; any other fsync error is raised."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _etag(st: os.stat_result) -> str:
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


class LocalStorage(Storage):
    """A table root on the local filesystem."""

    __slots__ = ("_root", "_tmp_folder")

    def __init__(self, root: str | Path, *, tmp_folder: str = TMP_FOLDER) -> None:
        self._root = Path(root).absolute()
        self._tmp_folder = tmp_folder  # relative to the root

    def __getstate__(self) -> tuple[str, str]:
        return str(self._root), self._tmp_folder

    def __setstate__(self, state: tuple[str, str] | str) -> None:
        root, self._tmp_folder = (state, TMP_FOLDER) if isinstance(state, str) else state
        self._root = Path(root)

    def __repr__(self) -> str:
        return f"LocalStorage({str(self._root)!r})"

    @property
    def uri(self) -> str:
        return str(self._root)

    @property
    def root(self) -> Path:
        return self._root

    @property
    def is_local(self) -> bool:
        return True

    def path(self, key: str) -> Path:
        return self._root / key if key else self._root

    @property
    def tmp_folder(self) -> str:
        """Where whole-object writes stage their temporary files (relative to the root)."""
        return self._tmp_folder

    def _tmp(self, name: str) -> Path:
        tmp_dir = self._root / self._tmp_folder
        tmp_dir.mkdir(parents=True, exist_ok=True)
        return tmp_dir / f"{name}.{uuid.uuid4().hex}.tmp"

    def remove_stale_temporaries(self, older_than_s: float = STALE_TEMPORARY_S) -> int:
        """Delete the temporary files that writers killed mid-write left (older than
        `older_than_s`; a live write's is seconds old), and the per-key lock files of earlier
        lakesink versions; the number deleted."""
        folder = self._root / self._tmp_folder
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return 0
        now = time.time()
        removed = 0
        for e in entries:
            if e.name == REPLACE_LOCK or not e.name.endswith((".tmp", ".lock")):
                continue
            with contextlib.suppress(FileNotFoundError):
                if now - e.stat(follow_symlinks=False).st_mtime > older_than_s:
                    os.unlink(e.path)
                    removed += 1
        return removed

    def _write_tmp(self, name: str, data: bytes, *, durable: bool = True) -> Path:
        tmp = self._tmp(name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        return tmp

    def read(self, key: str) -> bytes:
        try:
            return self.path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFoundError(f"{self.path(key)} does not exist") from None

    def read_with_etag(self, key: str) -> tuple[bytes, str]:
        p = self.path(key)
        try:
            with open(p, "rb") as f:
                st = os.fstat(f.fileno())
                return f.read(), _etag(st)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFoundError(f"{p} does not exist") from None

    def write(self, key: str, data: bytes, *, durable: bool = True) -> None:
        """`durable=False`: no fsync, for a file whose loss in a crash is harmless (readers
        still see the old or the new content whole while the machine runs)."""
        target = self.path(key)
        tmp = self._write_tmp(target.name, data, durable=durable)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, target)
            if durable:
                fsync_dir(target.parent)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def create(self, key: str, data: bytes) -> str:
        target = self.path(key)
        if not data:  # an empty file needs no temporary: O_EXCL creates it whole
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                raise ObjectExistsError(f"{target} exists already") from None
            try:
                return _etag(os.fstat(fd))
            finally:
                os.close(fd)
        tmp = self._write_tmp(target.name, data)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(tmp, target)
            except FileExistsError:
                raise ObjectExistsError(f"{target} exists already") from None
            fsync_dir(target.parent)
            return _etag(os.stat(target))
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    @contextlib.contextmanager
    def _key_lock(self, key: str) -> Iterator[None]:
        """Replaces in this root one at a time (they are small, and rare: lease renewals)."""
        lock_dir = self._root / self._tmp_folder
        lock_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_dir / REPLACE_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def replace_if_unchanged(self, key: str, data: bytes, etag: str) -> str:
        target = self.path(key)
        with self._key_lock(key):
            try:
                current = _etag(os.stat(target))
            except FileNotFoundError:
                raise ObjectChangedError(f"{target} is gone; expected version {etag}") from None
            if current != etag:
                raise ObjectChangedError(f"{target} changed: version {current}, expected {etag}")
            tmp = self._write_tmp(target.name, data)
            try:
                os.replace(tmp, target)
                fsync_dir(target.parent)
                return _etag(os.stat(target))
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def head(self, key: str) -> ObjectMeta | None:
        try:
            st = os.stat(f"{self._root}/{key}" if key else self._root)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return ObjectMeta(key, st.st_size, _etag(st), st.st_mtime)

    def exists(self, key: str) -> bool:
        # `head` without building its ObjectMeta: hundreds of checks per commit
        try:
            st = os.stat(f"{self._root}/{key}" if key else self._root)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return stat.S_ISREG(st.st_mode)

    def list_prefix(self, prefix: str) -> list[ObjectMeta]:
        base = self.path(prefix)
        out: list[ObjectMeta] = []
        for dirpath, _dirs, files in os.walk(base):
            rel_dir = os.path.relpath(dirpath, self._root)
            for name in files:
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue
                out.append(ObjectMeta(key, st.st_size, _etag(st), st.st_mtime))
        return sorted(out, key=lambda m: m.key)

    def list_folder(self, prefix: str) -> Listing:
        base = self.path(prefix)
        objects: list[ObjectMeta] = []
        folders: list[str] = []
        try:
            entries = list(os.scandir(base))
        except (FileNotFoundError, NotADirectoryError):
            return Listing((), ())
        for e in entries:
            key = f"{prefix.strip('/')}/{e.name}" if prefix.strip("/") else e.name
            try:
                if e.is_dir():
                    folders.append(e.name)
                elif e.is_file():
                    st = e.stat()
                    objects.append(ObjectMeta(key, st.st_size, _etag(st)))
            except FileNotFoundError:
                continue
        return Listing(tuple(sorted(objects, key=lambda m: m.key)), tuple(sorted(folders)))

    def list_keys(self, prefix: str) -> list[str]:
        out: list[str] = []
        for dirpath, _dirs, files in os.walk(self.path(prefix)):
            rel_dir = os.path.relpath(dirpath, self._root)
            out.extend(name if rel_dir == "." else f"{rel_dir}/{name}" for name in files)
        return sorted(out)

    def list_names(self, prefix: str) -> list[str]:
        try:
            with os.scandir(self.path(prefix)) as entries:
                # is_file() answers from the directory entry's type: no stat per file
                names = [e.name for e in entries if e.is_file()]
        except (FileNotFoundError, NotADirectoryError):
            return []
        names.sort()
        return names

    def delete(self, key: str) -> None:
        try:
            os.unlink(self.path(key))
        except FileNotFoundError:
            pass
        except IsADirectoryError as e:
            raise StorageError(f"{self.path(key)} is a folder, not a file") from e

    def delete_prefix(self, prefix: str) -> None:
        import shutil

        shutil.rmtree(self.path(prefix), ignore_errors=True)

    def open_output(self, key: str) -> Any:
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        return open(target, "xb")

    def arrow(self) -> tuple[pyarrow.fs.FileSystem, str]:
        import pyarrow.fs

        return pyarrow.fs.LocalFileSystem(), str(self._root)

    def probe(self) -> None:
        if self._root.exists() and not self._root.is_dir():
            raise StorageError(f"{self._root} is a file, not a folder")
