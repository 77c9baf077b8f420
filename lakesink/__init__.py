"""lakesink: exactly-once ingestion of Apache Kafka topics into open lakehouse tables."""

from lakesink.errors import LakesinkError

__all__ = ["LakesinkError", "__version__"]
__version__ = "0.1.0"
