"""Atomic, never-partial file creation on a local filesystem: write a temporary file under
`.hoodie/.aux/lakesink/tmp/`, fsync it, then hard-link it into place (fails if the target
exists, like `O_EXCL`) and drop the temporary name."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

TMP_FOLDER = ".hoodie/.aux/lakesink/tmp"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def create_exclusive(base_path: Path, target: Path, data: bytes) -> None:
    """Create `target` with `data` atomically; FileExistsError if it exists already.
    A reader sees either no file or the whole content, never a partial or empty file."""
    tmp_dir = base_path / TMP_FOLDER
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f"{target.name}.{uuid.uuid4().hex}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(tmp, target)
        _fsync_dir(target.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def create_empty_exclusive(target: Path) -> None:
    """Create an empty marker-like file with O_EXCL; FileExistsError if it exists."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.close(fd)
