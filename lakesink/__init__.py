"""lakesink: exactly-once ingestion of Apache Kafka topics into open lakehouse tables.

The Python API (`ingest`, `read_stream`, `sink`, `read`, `register`) is described in
docs/api.md; importing `lakesink` does not import pyspark (the functions do, when called).
"""

from lakesink.api import (
    ConfigSource,
    IngestionHandle,
    IngestionStatus,
    LakesinkSink,
    ingest,
    load_config,
    read,
    read_stream,
    register,
    sink,
)
from lakesink.errors import LakesinkError

__all__ = [
    "ConfigSource",
    "IngestionHandle",
    "IngestionStatus",
    "LakesinkError",
    "LakesinkSink",
    "__version__",
    "ingest",
    "load_config",
    "read",
    "read_stream",
    "register",
    "sink",
]
__version__ = "0.1.0"
