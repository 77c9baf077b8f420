"""`spark.read.format("lakesink").load(path)`: a batch Python Data Source over lakesink tables.

One Spark task per latest file slice of the snapshot (or of the state as of
`.option("as.of.instant", "<instant time>")`): its base file, with a merge-on-read slice's log
files merged over it by key; files of inflight, failed or rolled-back instants are never
planned, exactly as lakesink's own reader and hudi-rs see the table.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from lakesink.errors import ConfigError
from lakesink.formats import plugin_for
from lakesink.storage import Storage

TABLE_FORMAT = "hudi"
"""The format of the tables this source reads (Hudi tables, by path)."""


class SlicePartition(InputPartition):
    """One file slice: its base file, then the log files merged over it (merge-on-read)."""

    def __init__(self, files: tuple[str, ...]) -> None:
        self.files = files


def _storage(options: dict[str, str]) -> Storage:
    """The table's storage: its path or URI, storage.* settings from the environment and the
    reader's options (`.option("storage.s3.endpoint", ...)`)."""
    from lakesink.config import storage_settings
    from lakesink.storage import open_storage

    path = options.get("path")
    if not path:
        raise ConfigError('spark.read.format("lakesink") needs a table path: .load(path)')
    settings: dict[str, object] = dict(storage_settings())
    settings.update({k: v for k, v in options.items() if k.startswith("storage.")})
    return open_storage(path, settings)


def _snapshot(options: dict[str, str]) -> tuple[Storage, str | None]:
    """The table's storage and the instant to read as of (None: the latest)."""
    return _storage(options), options.get("as.of.instant") or None


def _arrow_schema(options: dict[str, str]) -> pa.Schema:
    return plugin_for(TABLE_FORMAT).snapshot_schema(*_snapshot(options))


class TableBatchReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: pa.Schema) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        slices = plugin_for(TABLE_FORMAT).snapshot_slices(*_snapshot(self.options))
        return [SlicePartition(files) for files in slices]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        from lakesink.engine.evolution import conform

        assert isinstance(partition, SlicePartition)
        storage = _storage(self.options)
        if len(partition.files) > 1:  # log files to merge over the base file
            table = plugin_for(TABLE_FORMAT).read_slice(storage, partition.files)
        else:
            fs, root = storage.arrow()
            path = f"{root}/{partition.files[0]}"
            table = pq.read_table(path, filesystem=fs, partitioning=None)
        # a slice written before a schema change keeps its file's schema: read by column name
        # in the snapshot's (null for the columns it lacks, narrower values widened)
        yield from conform(table, self.schema).to_batches(max_chunksize=65_536)


class LakesinkTableSource(DataSource):
    """Reads lakesink (Hudi) tables into Spark, merge-on-read slices merged."""

    @classmethod
    def name(cls) -> str:
        return "lakesink"

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(_arrow_schema(dict(self.options)))

    def reader(self, schema: StructType) -> DataSourceReader:
        from pyspark.sql.pandas.types import to_arrow_schema

        # Timestamps are instants (UTC in the files); without a zone pyspark refuses them.
        return TableBatchReader(dict(self.options), to_arrow_schema(schema, timezone="UTC"))
