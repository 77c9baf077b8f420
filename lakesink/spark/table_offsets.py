"""The tables of a many-table ingestion (those named, and the dynamic ones found on storage)
and where its writer stands: the lowest offsets committed over them (lakesink.spark.routing).
Spark-free, for the source on the driver."""

from __future__ import annotations

import re
from collections.abc import Sequence

from lakesink.config import LakesinkConfig
from lakesink.config.tables import TableSpec, dynamic_parent
from lakesink.formats import plugin_of
from lakesink.protocol.offsets import WriterOffsets
from lakesink.storage import open_storage

# a folder holding this is a Hudi table (the marker hudi-rs and Hudi look for)
HOODIE_PROPERTIES = ".hoodie/hoodie.properties"

__all__ = [
    "all_table_configs",
    "committed_offsets_of",
    "committed_topic_ids_of",
    "dynamic_table_names",
    "lowest_committed",
]


def all_table_configs(cfg: LakesinkConfig) -> list[tuple[TableSpec, LakesinkConfig]]:
    """The tables of the tables section, then the dynamic tables created so far (by name)."""
    named = cfg.table_configs()
    return named + [cfg.dynamic_table_config(n) for n in dynamic_table_names(cfg)]


def dynamic_table_names(cfg: LakesinkConfig) -> list[str]:
    """The dynamic tables (`route.dynamic.*`) that exist: the folders under the template's
    parent whose name route.dynamic.allow takes and that hold a Hudi table, less the names of
    the tables section (one LIST, and one HEAD per folder)."""
    if not cfg["route.dynamic.field"]:
        return []
    named = {spec.name for spec in cfg.table_specs}
    allow = re.compile(cfg["route.dynamic.allow"])
    parent = open_storage(dynamic_parent(cfg["route.dynamic.path"]), cfg.values)
    try:
        folders = parent.list_folder("").folders
    except FileNotFoundError:  # no dynamic table yet
        return []
    return sorted(
        name
        for name in folders
        if name not in named
        and allow.fullmatch(name)
        and parent.exists(f"{name}/{HOODIE_PROPERTIES}")
    )


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
