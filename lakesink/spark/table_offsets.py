"""The tables of a many-table ingestion (those named, and the dynamic ones found on storage)
and where its writer stands: the lowest offsets committed over them (lakesink.spark.routing).
Spark-free, for the source on the driver."""

from __future__ import annotations

import re
from collections.abc import Sequence

from lakesink.config import LakesinkConfig
from lakesink.config.tables import TableSpec
from lakesink.formats import plugin_of
from lakesink.protocol.offsets import WriterOffsets

__all__ = [
    "all_table_configs",
    "committed_offsets_of",
    "committed_topic_ids_of",
    "dynamic_table_names",
    "is_named_table",
    "lowest_committed",
    "named_tables",
]


def all_table_configs(cfg: LakesinkConfig) -> list[tuple[TableSpec, LakesinkConfig]]:
    """The tables of the tables section, then the dynamic tables created so far (by name)."""
    named = cfg.table_configs()
    return named + [cfg.dynamic_table_config(n) for n in dynamic_table_names(cfg)]


def dynamic_table_names(cfg: LakesinkConfig) -> list[str]:
    """The dynamic tables (`route.dynamic.*`) that exist: the tables of the top-level format
    where the template puts them (Hudi: the folders before its /{table} that hold a Hudi
    table; Iceberg: the catalog's tables in iceberg.namespace of that warehouse) whose name
    route.dynamic.allow takes, less the tables of the tables section (by name, or being the
    same table: `is_named_table`)."""
    if not cfg["route.dynamic.field"]:
        return []
    allow = re.compile(cfg["route.dynamic.allow"])
    where = cfg.dynamic_location_config()
    found = plugin_of(where.settings).table_names(where.settings)
    named = named_tables(cfg)
    return [
        name
        for name in found
        if allow.fullmatch(name)
        and not is_named_table(cfg.dynamic_table_config(name)[1], name, named)
    ]


TableIdentity = tuple[str, ...]


def table_identity(table: LakesinkConfig) -> TableIdentity:
    """What makes two configurations the same table: the format and what its plugin says."""
    plugin = plugin_of(table.settings)
    return (plugin.name, *plugin.table_identity(table.settings))


def named_tables(cfg: LakesinkConfig) -> tuple[frozenset[str], frozenset[TableIdentity]]:
    """The names of the tables section and the tables they are (`is_named_table`)."""
    configs = cfg.table_configs()
    return (
        frozenset(spec.name for spec, _ in configs),
        frozenset(table_identity(t) for _, t in configs),
    )


def is_named_table(
    dynamic: LakesinkConfig, name: str, named: tuple[frozenset[str], frozenset[TableIdentity]]
) -> bool:
    """Whether dynamic table `name` (its configuration `dynamic`) is a table of the tables
    section: one of its names, or the same table under another name (an Iceberg table of the
    section in the dynamic tables' warehouse): such records go where the section's routes
    send them, never to a second writer of that table."""
    names, identities = named
    return name in names or table_identity(dynamic) in identities


def lowest_committed(offsets: Sequence[WriterOffsets]) -> WriterOffsets:
    """Per partition the lowest position over the tables; a partition one of them never
    committed is left out (it starts at kafka.starting.offsets, so that table misses none of
    its records: the others skip theirs)."""
    if not offsets:
        return WriterOffsets.empty()
    common = set(offsets[0].next_offsets).intersection(*(o.next_offsets for o in offsets[1:]))
    return WriterOffsets({tp: min(o.next_offsets[tp] for o in offsets) for tp in common})


def committed_offsets_of(cfg: LakesinkConfig) -> WriterOffsets:
    """Where the ingestion's writer stands: its table's committed offsets, or with many
    tables the lowest over them (`lowest_committed`)."""
    if not cfg["tables"]:
        return plugin_of(cfg.settings).committed_offsets(cfg.settings)
    return lowest_committed(
        [plugin_of(t.settings).committed_offsets(t.settings) for _, t in all_table_configs(cfg)]
    )


def committed_topic_ids_of(cfg: LakesinkConfig) -> dict[str, str]:
    """The topic ids the writer's commits recorded (over every table, with many)."""
    if not cfg["tables"]:
        return plugin_of(cfg.settings).committed_topic_ids(cfg.settings)
    ids: dict[str, str] = {}
    for _, t in all_table_configs(cfg):
        for topic, topic_id in plugin_of(t.settings).committed_topic_ids(t.settings).items():
            ids.setdefault(topic, topic_id)
    return ids
