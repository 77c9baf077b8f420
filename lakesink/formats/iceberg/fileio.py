"""lakesink's pyiceberg FileIO (`LakesinkFileIO`): pyarrow's, with two changes.

- The table's small metadata objects on S3 (the metadata JSON, manifest lists, manifests) are
  written whole, in one PUT, and read whole, in one GET. pyarrow writes every object as a
  multipart upload (create, one part, complete: three requests) and pyiceberg asks a HEAD before
  a create that must not overwrite and another for a written manifest's length. Here such an
  object is buffered in memory and PUT once through lakesink's object store (obstore): a create
  that must not overwrite is a conditional PUT (`If-None-Match: *`, the store decides, no HEAD
  before it), and the length of what was written is known without asking. Such an object is
  read with one GET (pyarrow's seekable file asks a HEAD for the size first; pyiceberg reads
  them whole anyway); a metadata JSON this process created is not read back at all (the next
  commit's current metadata). Data files (Parquet: large, streamed by the Parquet writer, read
  in ranges) are streamed through lakesink's pyarrow filesystem for the bucket, which opens
  uploads lazily (`allow_delayed_open`): a file smaller than one part (a streaming batch's) is
  one PUT, not a multipart upload, and its length is the bytes written, not a HEAD afterwards
  (its write took 4 requests, now 1).
- Locations on Azure, written as Iceberg's Java ADLSFileIO writes them
  (`abfss://container@ACCOUNT.dfs.core.windows.net/path`), reach pyarrow's AzureFileSystem as
  `container/path`. PyArrowFileIO 0.12 hands pyarrow `container@ACCOUNT.dfs.core.windows.net/
  path`, whose first segment Azure refuses as a container name (400 InvalidResourceName).

pyiceberg loads the class by name (`py-io-impl`, set by `catalog.file_io_properties`), in the
driver and in Spark's tasks alike. The classes are made on first access (the module's
`__getattr__`): this module imports without the iceberg extra, as every lakesink module does.
"""

from __future__ import annotations

import functools
import io
import threading
from collections import OrderedDict
from types import TracebackType
from typing import Any

from lakesink.storage.base import ObjectExistsError
from lakesink.storage.objectstore import AZURE_SCHEMES, ObjectStoreStorage

__all__ = [
    "LakesinkFileIO",
    "StreamedDataFile",
    "WholeObjectFile",
    "WholeObjectInput",
    "azure_path",
]

# made by __getattr__ (pyiceberg's classes, subclassed)
LakesinkFileIO: Any
StreamedDataFile: Any
WholeObjectFile: Any
WholeObjectInput: Any

WHOLE_OBJECT_SCHEMES = ("s3", "s3a")
"""Where small objects are written in one PUT: the stores lakesink's conditional writes are
proven on for Iceberg metadata; other schemes keep pyarrow's writes."""


_KEPT_METADATA = 8
_KEPT_BYTES = 4 << 20
_written: OrderedDict[str, bytes] = OrderedDict()
_written_lock = threading.Lock()


def _remember(location: str, data: bytes) -> None:
    """Keep a metadata JSON this process wrote: the next commit reads it back (the table's
    current metadata). Only these: a metadata JSON is created once (a conditional PUT) under a
    name of its own and never changed, so what was written is what a read would return."""
    if not location.endswith(".metadata.json") or len(data) > _KEPT_BYTES:
        return
    with _written_lock:
        _written[location] = data
        _written.move_to_end(location)
        while len(_written) > _KEPT_METADATA:
            _written.popitem(last=False)


def _written_here(location: str) -> bytes | None:
    with _written_lock:
        return _written.get(location)


def azure_path(scheme: str, netloc: str, path: str) -> str:
    """pyarrow's path of a location PyArrowFileIO parsed: the container instead of
    `container@ACCOUNT.host` on Azure, as it is otherwise."""
    if scheme in AZURE_SCHEMES and "@" in netloc and path.startswith(netloc):
        return netloc.split("@", 1)[0] + path[len(netloc) :]
    return path


@functools.cache
def _classes() -> dict[str, type]:
    from pyiceberg.io import InputFile, InputStream, OutputFile, OutputStream
    from pyiceberg.io.pyarrow import PyArrowFileIO
    from pyiceberg.typedef import EMPTY_DICT, Properties

    from lakesink.formats.iceberg.catalog import storage_options

    class LakesinkFileIO(PyArrowFileIO):
        """pyarrow's FileIO, small objects on S3 written whole in one (conditional) PUT, Azure
        locations' paths without their account."""

        @staticmethod
        def parse_location(
            location: str, properties: Properties = EMPTY_DICT
        ) -> tuple[str, str, str]:
            scheme, netloc, path = PyArrowFileIO.parse_location(location, properties)
            return scheme, netloc, azure_path(scheme, netloc, path)

        def __init__(self, properties: Properties = EMPTY_DICT) -> None:
            super().__init__(properties=properties)
            self._stores: dict[str, ObjectStoreStorage] = {}

        def _store(self, scheme: str, bucket: str) -> ObjectStoreStorage:
            store = self._stores.get(bucket)
            if store is None:
                store = ObjectStoreStorage(f"{scheme}://{bucket}", storage_options(self.properties))
                self._stores[bucket] = store
            return store

        def _on_store(self, location: str) -> tuple[ObjectStoreStorage, str] | None:
            """The store and key of an object lakesink writes itself (on S3); None for the
            rest, which pyarrow's FileIO keeps."""
            scheme, bucket, path = self.parse_location(location, self.properties)
            if scheme not in WHOLE_OBJECT_SCHEMES or not bucket:
                return None
            return self._store(scheme, bucket), path.removeprefix(bucket).lstrip("/")

        def _whole(self, location: str) -> tuple[ObjectStoreStorage, str] | None:
            """The store and key of a small object written and read whole (not a data file)."""
            return None if location.endswith(".parquet") else self._on_store(location)

        def new_output(self, location: str) -> OutputFile:  # type: ignore[override]
            on_store = self._on_store(location)
            if on_store is None:
                return super().new_output(location)
            store, key = on_store
            if location.endswith(".parquet"):  # a data file: streamed, one PUT when small
                return StreamedDataFile(location, store, key, self)
            return WholeObjectFile(location, store, key, self)

        def new_input(self, location: str) -> InputFile:  # type: ignore[override]
            """Small objects read whole in one GET (pyarrow's seekable file asks a HEAD for the
            size first; pyiceberg reads these whole anyway)."""
            whole = self._whole(location)
            if whole is None:
                return super().new_input(location)
            return WholeObjectInput(location, whole[0], whole[1])

        def __getstate__(self) -> dict[str, Any]:
            state = super().__getstate__()
            state["_stores"] = {}
            return state

    class _StoreOutputFile(OutputFile):
        """An object of lakesink's store written by this process: its length is the bytes
        written once its stream closed (pyarrow's file asks a HEAD)."""

        def __init__(
            self, location: str, store: ObjectStoreStorage, key: str, file_io: PyArrowFileIO
        ) -> None:
            super().__init__(location)
            self._store = store
            self._key = key
            self._io = file_io
            self._written: int | None = None

        def __len__(self) -> int:
            if self._written is not None:
                return self._written
            meta = self._store.head(self._key)
            if meta is None:
                raise FileNotFoundError(f"Cannot get file info, file not found: {self.location}")
            return meta.size

        def exists(self) -> bool:
            return self._store.exists(self._key)

        def to_input_file(self) -> InputFile:
            return self._io.new_input(self.location)

    class WholeObjectFile(_StoreOutputFile):
        """An object written in one PUT when its stream is closed."""

        def create(self, overwrite: bool = False) -> OutputStream:
            return _WholeObjectStream(self, overwrite)

        def _put(self, data: bytes, overwrite: bool) -> None:
            if overwrite:
                self._store.write(self._key, data)
            else:
                try:
                    self._store.create(self._key, data)
                except ObjectExistsError as e:  # pyiceberg's contract: FileExistsError
                    raise FileExistsError(
                        f"Cannot create file, already exists: {self.location}"
                    ) from e
                _remember(self.location, data)
            self._written = len(data)

    class StreamedDataFile(_StoreOutputFile):
        """A data file streamed to the store by lakesink's pyarrow filesystem (one PUT when it
        is smaller than a part)."""

        def create(self, overwrite: bool = False) -> OutputStream:
            if not overwrite and self.exists():
                raise FileExistsError(f"Cannot create file, already exists: {self.location}")
            return _CountedStream(self, self._store.open_output(self._key))

    class _CountedStream(OutputStream):
        """pyarrow's output stream, noting the bytes written when it closes."""

        def __init__(self, file: StreamedDataFile, native: Any) -> None:
            self._file = file
            self._native = native

        def write(self, b: bytes) -> int:
            return int(self._native.write(b))

        def tell(self) -> int:
            return int(self._native.tell())

        def flush(self) -> None:
            self._native.flush()

        @property
        def closed(self) -> bool:
            return bool(self._native.closed)

        def close(self) -> None:
            if self._native.closed:
                return
            size = self._native.tell()
            self._native.close()  # the object appears whole here
            self._file._written = size

        def __enter__(self) -> _CountedStream:
            return self

        def __exit__(
            self,
            exctype: type[BaseException] | None,
            excinst: BaseException | None,
            exctb: TracebackType | None,
        ) -> None:
            self.close()

    class WholeObjectInput(InputFile):
        """An object read whole, in one GET, when it is opened."""

        def __init__(self, location: str, store: ObjectStoreStorage, key: str) -> None:
            super().__init__(location)
            self._store = store
            self._key = key
            self._size: int | None = None

        def __len__(self) -> int:
            if self._size is None:
                meta = self._store.head(self._key)
                if meta is None:
                    raise FileNotFoundError(
                        f"Cannot get file info, file not found: {self.location}"
                    )
                self._size = meta.size
            return self._size

        def exists(self) -> bool:
            return self._store.exists(self._key)

        def open(self, seekable: bool = True) -> InputStream:
            data = _written_here(self.location)
            if data is None:
                data = self._store.read(self._key)  # ObjectNotFoundError is a FileNotFoundError
            self._size = len(data)
            return io.BytesIO(data)

    class _WholeObjectStream(OutputStream):
        """Buffers the writes; the first close PUTs them (a `with` block that fails writes nothing,
        where pyarrow's stream would complete its upload with what it had)."""

        def __init__(self, file: WholeObjectFile, overwrite: bool) -> None:
            self._file = file
            self._overwrite = overwrite
            self._buffer = io.BytesIO()
            self._closed = False

        def write(self, b: bytes) -> int:
            if self._closed:
                raise ValueError(f"write to a closed stream ({self._file.location})")
            return self._buffer.write(b)

        def tell(self) -> int:
            return self._buffer.tell()

        def close(self) -> None:
            if self._closed:
                return
            self._closed = True
            self._file._put(self._buffer.getvalue(), self._overwrite)

        def __enter__(self) -> _WholeObjectStream:
            return self

        def __exit__(
            self,
            exctype: type[BaseException] | None,
            excinst: BaseException | None,
            exctb: TracebackType | None,
        ) -> None:
            if exctype is not None:
                self._closed = True  # nothing of a failed write reaches the store
                return
            self.close()

    made: dict[str, type] = {
        "LakesinkFileIO": LakesinkFileIO,
        "WholeObjectFile": WholeObjectFile,
        "StreamedDataFile": StreamedDataFile,
        "WholeObjectInput": WholeObjectInput,
    }
    for name, cls in made.items():
        cls.__module__ = __name__
        cls.__qualname__ = name
    return made


def __getattr__(name: str) -> Any:
    made = _classes() if name in ("LakesinkFileIO", "WholeObjectFile", "WholeObjectInput") else {}
    if name in made:
        return made[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
