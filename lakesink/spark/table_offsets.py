"""Where a many-table ingestion's writer stands: the lowest offsets committed over its tables
(lakesink.spark.routing). Spark-free, for the source on the driver."""

from __future__ import annotations

from collections.abc import Sequence

from lakesink.config import LakesinkConfig
from lakesink.formats import plugin_of
from lakesink.protocol.offsets import WriterOffsets

__all__ = ["committed_offsets_of", "committed_topic_ids_of", "lowest_committed"]


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
        [plugin_of(t.settings).committed_offsets(t.settings) for _, t in cfg.table_configs()]
    )


def committed_topic_ids_of(cfg: LakesinkConfig) -> dict[str, str]:
    """The topic ids the writer's commits recorded (over every table, with many)."""
    if not cfg["tables"]:
        return plugin_of(cfg.settings).committed_topic_ids(cfg.settings)
    ids: dict[str, str] = {}
    for _, t in cfg.table_configs():
        for topic, topic_id in plugin_of(t.settings).committed_topic_ids(t.settings).items():
            ids.setdefault(topic, topic_id)
    return ids
