"""The storage interface under the table format: whole objects addressed by a key relative to
the table root (`.hoodie/timeline/…`, `part=1/<file>.parquet`), with the two conditional writes
that make commits atomic without rename: create-if-absent and replace-if-unchanged."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakesink.errors import LakesinkError

if TYPE_CHECKING:
    import pyarrow.fs


class StorageError(LakesinkError):
    """The store failed a request: unreachable, refused credentials, a missing bucket."""

    exit_code = 3
    retriable = True


class StorageUnsupportedError(StorageError):
    """The store cannot do what lakesink needs (conditional writes): refused at start."""

    retriable = False


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The key holds no object."""

    retriable = False


class ObjectExistsError(StorageError, FileExistsError):
    """create-if-absent lost: another writer created the key first."""

    retriable = False


class ObjectChangedError(StorageError):
    """replace-if-unchanged lost: the object changed (or vanished) since its ETag was read."""

    retriable = False


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """One object: its key (relative to the storage root), size in bytes and version tag."""

    key: str
    size: int
    etag: str
    modified: float = 0.0
    """When the object was last written (seconds since the epoch, the store's clock)."""


@dataclass(frozen=True, slots=True)
class Listing:
    """One level of a prefix: the objects directly in it and the names of its sub-folders."""

    objects: tuple[ObjectMeta, ...]
    folders: tuple[str, ...]


def join(*parts: str) -> str:
    """Join key parts with `/`, skipping empty ones."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


class Storage(abc.ABC):
    """A table's storage root. Keys are `/`-separated and relative to the root. Implementations
    are picklable (a URI and options): clients are built lazily in each process."""

    @property
    @abc.abstractmethod
    def uri(self) -> str:
        """The root as a URI or local path, without credentials (safe to print)."""

    @property
    def is_local(self) -> bool:
        return False

    @abc.abstractmethod
    def read(self, key: str) -> bytes:
        """The whole object; ObjectNotFoundError if there is none."""

    @abc.abstractmethod
    def read_with_etag(self, key: str) -> tuple[bytes, str]:
        """The whole object and its version tag, for a later replace_if_unchanged."""

    @abc.abstractmethod
    def write(self, key: str, data: bytes) -> None:
        """Write the whole object, replacing any; readers see the old or the new one, whole."""

    @abc.abstractmethod
    def create(self, key: str, data: bytes) -> str:
        """Create the object only if the key is free (If-None-Match: *), whole, in one request;
        ObjectExistsError if it exists. Returns the new version tag."""

    @abc.abstractmethod
    def replace_if_unchanged(self, key: str, data: bytes, etag: str) -> str:
        """Replace the object only if its version tag is still `etag` (If-Match);
        ObjectChangedError otherwise. Returns the new version tag."""

    @abc.abstractmethod
    def head(self, key: str) -> ObjectMeta | None:
        """The object's size and tag, or None if there is none."""

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    @abc.abstractmethod
    def list_prefix(self, prefix: str) -> list[ObjectMeta]:
        """Every object under the folder `prefix`, recursively (one LIST request per 1000)."""

    @abc.abstractmethod
    def list_folder(self, prefix: str) -> Listing:
        """The objects directly in the folder `prefix` and its sub-folder names."""

    def list_keys(self, prefix: str) -> list[str]:
        """The keys of every object under the folder `prefix`, recursively, sorted:
        `list_prefix` without sizes and tags (locally: no stat per file)."""
        return [m.key for m in self.list_prefix(prefix)]

    def list_names(self, prefix: str) -> list[str]:
        """The names (last key part) of the objects directly in the folder `prefix`, sorted:
        `list_folder` without sizes and tags (locally: no stat per file)."""
        return sorted(m.key.rsplit("/", 1)[-1] for m in self.list_folder(prefix).objects)

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete the object; no error if it is gone already."""

    def delete_many(self, keys: list[str]) -> None:
        for k in keys:
            self.delete(k)

    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under the folder `prefix`."""
        self.delete_many([m.key for m in self.list_prefix(prefix)])

    @abc.abstractmethod
    def arrow(self) -> tuple[pyarrow.fs.FileSystem, str]:
        """A pyarrow filesystem and the root path in it, for Parquet reads and writes:
        `pq.read_table(root + "/" + key, filesystem=fs)`."""

    @abc.abstractmethod
    def open_output(self, key: str) -> Any:
        """A writable binary stream for a new object (a Parquet base file). Locally the file is
        created exclusively; on an object store the object appears whole when the stream
        closes (a multipart upload), never partially."""

    def arrow_path(self, key: str) -> str:
        _, root = self.arrow()
        return f"{root}/{key}" if key else root

    def reader_options(self) -> dict[str, str]:
        """Storage options for other readers of the table (hudi-rs); none for local tables."""
        return {}

    def remove_stale_temporaries(self, older_than_s: float = 600.0) -> int:
        """Delete temporary files that writers killed mid-write left behind; how many. Object
        stores write whole objects in one request and leave none."""
        return 0

    @abc.abstractmethod
    def probe(self) -> None:
        """Check at start that the store is reachable and honours conditional writes;
        StorageUnsupportedError or StorageError naming the store otherwise."""
