"""The pyiceberg FileIO of lakesink's Iceberg tables on Azure: pyiceberg's PyArrowFileIO, with
locations written as Iceberg's Java ADLSFileIO writes them
(`abfss://container@ACCOUNT.dfs.core.windows.net/path`) reaching pyarrow's AzureFileSystem as
`container/path`. PyArrowFileIO 0.12 hands pyarrow `container@ACCOUNT.dfs.core.windows.net/path`,
whose first segment Azure refuses as a container name (400 InvalidResourceName).

pyiceberg loads the class by name (`py-io-impl`, set by `file_io_properties`), in the driver and
in Spark's tasks alike. The class is made on first access (the module's `__getattr__`): this
module imports without the iceberg extra, as every lakesink module does."""

from __future__ import annotations

import functools
from typing import Any

from lakesink.storage.objectstore import AZURE_SCHEMES

__all__ = ["AzurePathFileIO", "azure_path"]

AzurePathFileIO: Any  # made by __getattr__: pyiceberg's PyArrowFileIO, subclassed


def azure_path(scheme: str, netloc: str, path: str) -> str:
    """pyarrow's path of a location PyArrowFileIO parsed: the container instead of
    `container@ACCOUNT.host` on Azure, as it is otherwise."""
    if scheme in AZURE_SCHEMES and "@" in netloc and path.startswith(netloc):
        return netloc.split("@", 1)[0] + path[len(netloc) :]
    return path


@functools.cache
def _file_io_class() -> type:
    from pyiceberg.io.pyarrow import PyArrowFileIO
    from pyiceberg.typedef import EMPTY_DICT, Properties

    class AzurePathFileIO(PyArrowFileIO):
        """PyArrowFileIO that drops the account from an Azure location's path."""

        @staticmethod
        def parse_location(
            location: str, properties: Properties = EMPTY_DICT
        ) -> tuple[str, str, str]:
            scheme, netloc, path = PyArrowFileIO.parse_location(location, properties)
            return scheme, netloc, azure_path(scheme, netloc, path)

    AzurePathFileIO.__module__ = __name__
    AzurePathFileIO.__qualname__ = "AzurePathFileIO"
    return AzurePathFileIO


def __getattr__(name: str) -> Any:
    if name == "AzurePathFileIO":
        return _file_io_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
