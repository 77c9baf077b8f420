"""Iceberg tables (lakesink/iceberg/) as lakesink's configuration names them.

With `table.format=iceberg`, `table.path` is the warehouse (a local folder or an object-store
prefix), the table is `iceberg.namespace` . `table.name` in the catalog `iceberg.catalog.*`
(by default a SQLite file `catalog.db` in a local warehouse).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from lakesink.config import LakesinkConfig, parse_kv
from lakesink.errors import ConfigError
from lakesink.iceberg.catalog import CatalogSettings, open_catalog
from lakesink.iceberg.schema import PartitionFieldSetting, parse_partition_spec
from lakesink.iceberg.table import IcebergTable
from lakesink.storage import options_from_config

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "catalog_settings_for",
    "iceberg_identifier",
    "iceberg_partition_fields",
    "open_iceberg_table",
]


def _revealed(value: object) -> str | None:
    if value is None:
        return None
    reveal = getattr(value, "reveal", None)
    return str(reveal()) if callable(reveal) else str(value)


def catalog_settings_for(cfg: LakesinkConfig, *, create: bool = True) -> CatalogSettings:
    """The catalog of `cfg`: `iceberg.catalog.*` with `table.path` as the warehouse and the
    `storage.*` settings to reach it. `create=False`: a missing SQLite catalog is an error
    (readers, status, audit)."""
    if cfg["table.format"] != "iceberg":
        raise ConfigError(f"table.format={cfg['table.format']}: this needs table.format=iceberg")
    return CatalogSettings(
        warehouse=str(cfg["table.path"]),
        kind=cfg["iceberg.catalog.kind"],
        uri=_revealed(cfg["iceberg.catalog.uri"]),
        name=str(cfg["iceberg.catalog.name"] or "lakesink"),
        create=create,
        storage=options_from_config(cfg.values),
        properties=parse_kv(_revealed(cfg["iceberg.catalog.properties"])),
    )


def iceberg_identifier(cfg: LakesinkConfig) -> tuple[str, ...]:
    """`iceberg.namespace` . `table.name` as a catalog identifier."""
    namespace = tuple(p for p in str(cfg["iceberg.namespace"] or "lakesink").split(".") if p)
    return (*namespace, cfg.table_name)


def iceberg_partition_fields(cfg: LakesinkConfig) -> tuple[PartitionFieldSetting, ...]:
    """`iceberg.partition.spec`, or identity fields of `table.partition.by`."""
    texts: Sequence[str] = cfg["iceberg.partition.spec"] or cfg["table.partition.by"]
    return parse_partition_spec(texts)


def open_iceberg_table(
    cfg: LakesinkConfig, rows: pa.Schema | None = None, *, create: bool = True
) -> IcebergTable:
    """The Iceberg table of `cfg`, created on first use from the decoded `rows` schema and the
    partition fields when `create` (TableNotFoundError otherwise)."""
    catalog = open_catalog(catalog_settings_for(cfg, create=create))
    return IcebergTable.open(
        catalog,
        iceberg_identifier(cfg),
        rows,
        iceberg_partition_fields(cfg),
        create=create,
    )
