"""The Hudi tables an ingestion writes, created on first use: the table at table.path and the
dead-letter table at errors.deadletter.table (keyed by the Kafka coordinates, unpartitioned)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from lakesink.errors import ConfigError
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.hudi_table import PROPERTIES_FILE, HudiTable
from lakesink.settings import Settings
from lakesink.storage import Storage

DEAD_LETTER_RECORD_KEY = ("kafka_topic", "kafka_partition", "kafka_offset")


def table_config_for(settings: Settings, partition_fields: Sequence[str]) -> TableConfig:
    """The config of the writer's table: its name, version and record key as configured,
    partitioned by `partition_fields` (table.partition.by and the date column); a table whose
    rows change by key (write.operation upsert or cdc) has a bucket index and its ordering
    column (Hudi's precombine field)."""
    mutation = settings.mutation
    return TableConfig(
        name=_table_name(settings),
        version=settings.table.version,
        record_key_fields=tuple(settings.table.record_key_fields),
        partition_fields=tuple(partition_fields),
        ordering_field=mutation.ordering_column,
        bucket_count=mutation.bucket_count if mutation.mutates else None,
        table_type=mutation.table_type if mutation.mutates else "COPY_ON_WRITE",
    )


def probed(storage: Storage) -> Storage:
    """`storage`, probed once: a store that is unreachable, refuses the credentials or cannot do
    conditional writes stops the start with one clear line."""
    storage.probe()
    return storage


def create_writer_table(settings: Settings, partition_fields: Sequence[str]) -> HudiTable:
    """The table at table.path (created unless it exists: an existing one keeps its config).
    ConfigError naming table.type and both types when an existing table is of the other type
    (a merge-on-read table's log files would be lost on a copy-on-write writer, and back)."""
    storage = probed(settings.table_storage())
    config = table_config_for(settings, partition_fields)
    if storage.exists(PROPERTIES_FILE):
        existing = HudiTable.open(storage).config.table_type
        if existing != config.table_type:
            raise ConfigError(
                f"table.type={config.table_type}, but the table at {storage.uri} is {existing}: "
                f"set table.type={existing}, or write another table.path (the type is fixed "
                "when a table is created)"
            )
    return HudiTable.create(storage, config)


def create_dead_letter_table(settings: Settings) -> HudiTable:
    """The dead-letter table of `settings`, whose table.path is errors.deadletter.table already
    (the plugin's dead-letter configuration)."""
    return HudiTable.create(
        probed(settings.table_storage()),
        TableConfig(
            name=_table_name(settings),
            version=settings.table.version,
            record_key_fields=DEAD_LETTER_RECORD_KEY,
        ),
    )


def _table_name(settings: Settings) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", settings.table.name)
