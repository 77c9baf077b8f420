"""Helpers for the Iceberg integration tests: catalogs on real backends (a SQLite file, the test
session's PostgreSQL) with warehouses on local disk or the moto S3 server, and small batches of
decoded Kafka rows."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lakesink.formats.iceberg.catalog import CatalogSettings, open_catalog
from lakesink.formats.iceberg.datafiles import DataFileDescription, write_data_files
from lakesink.formats.iceberg.schema import parse_partition_spec
from lakesink.formats.iceberg.table import AppendResult, IcebergTable
from lakesink.kafka.reader import METADATA_FIELDS
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.storage import ObjectStoreOptions

ROWS = pa.schema([*METADATA_FIELDS, pa.field("user", pa.string()), pa.field("amount", pa.int64())])
BASE_TS_US = 1_700_000_000_000_000
_attempts = itertools.count()


@dataclass(frozen=True)
class Backend:
    """How to open the catalog of one test: its settings, reusable for a second process."""

    settings: CatalogSettings

    def catalog(self) -> Any:
        return open_catalog(self.settings)

    def table(self, name: str, partition: str = "kafka_partition", **kwargs: Any) -> IcebergTable:
        return IcebergTable.open(
            self.catalog(), name, ROWS, parse_partition_spec(partition), **kwargs
        )


def s3_options(server: Any) -> ObjectStoreOptions:
    return ObjectStoreOptions(
        endpoint=server.endpoint_url,
        region=server.region,
        allow_http=True,
        path_style=True,
        access_key_id=server.access_key_id,
        secret_access_key=server.secret_access_key,
    )


def rows(tp: TopicPartition, start: int, end: int) -> pa.Table:
    """Decoded rows for offsets [start, end) of one partition (timestamps 1 s apart)."""
    n = end - start
    offsets = list(range(start, end))
    return pa.Table.from_pydict(
        {
            "kafka_topic": [tp.topic] * n,
            "kafka_partition": [tp.partition] * n,
            "kafka_offset": offsets,
            "kafka_timestamp": [BASE_TS_US + o * 1_000_000 for o in offsets],
            "kafka_key": [f"k{o}".encode() for o in offsets],
            "kafka_headers": [[{"key": "h", "value": b"v"}] for _ in offsets],
            "user": [f"u{o % 3}" for o in offsets],
            "amount": offsets,
        },
        schema=ROWS,
    )


def write(table: IcebergTable, ranges: Sequence[OffsetRange]) -> list[DataFileDescription]:
    """What the tasks of a batch return: one task per range, each its own attempt."""
    ctx = table.write_context()
    out: list[DataFileDescription] = []
    for r in ranges:
        out += write_data_files(
            ctx, rows(r.partition, r.start, r.end), attempt_id=f"{uuid.uuid4()}-{next(_attempts)}"
        )
    return out


def ingest(
    table: IcebergTable, writer: str, ranges: Sequence[OffsetRange], commit_id: str | None = None
) -> AppendResult:
    """One batch: write the ranges' rows, append them with the requirement."""
    append = table.begin(writer, ranges, commit_id)
    append.stage(write(table, ranges))
    return append.commit(vtts_ms=None)


def keys(table: IcebergTable) -> list[tuple[str, int, int]]:
    """(topic, partition, offset) of every row pyiceberg's scan reads, sorted."""
    t = (
        table.pyiceberg.refresh()
        .scan(selected_fields=("kafka_topic", "kafka_partition", "kafka_offset"))
        .to_arrow()
    )
    return sorted(
        zip(
            t.column("kafka_topic").to_pylist(),
            t.column("kafka_partition").to_pylist(),
            t.column("kafka_offset").to_pylist(),
            strict=True,
        )
    )


def expected(*ranges: OffsetRange) -> list[tuple[str, int, int]]:
    return sorted(
        (r.partition.topic, r.partition.partition, o) for r in ranges for o in range(r.start, r.end)
    )
