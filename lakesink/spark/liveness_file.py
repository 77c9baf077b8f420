"""Where a writer's liveness file is, and the active writer's liveness object
(lakesink.engine.liveness): beside the writer's other state on the table's storage, so
it works on an object store too."""

from __future__ import annotations

from lakesink.config import LakesinkConfig
from lakesink.engine.liveness import WriterLiveness
from lakesink.formats import plugin_of
from lakesink.storage import Storage


def liveness_key(cfg: LakesinkConfig) -> str:
    """`.hoodie/.lakesink/liveness/<writer>.json` in a Hudi table,
    `.lakesink/liveness/<namespace>.<table>/<writer>.json` in an Iceberg warehouse (the
    format's plugin decides); with many tables, in the first one (by name)."""
    cfg = _first_table(cfg)
    return plugin_of(cfg.settings).liveness_key(cfg.settings)


def writer_liveness(cfg: LakesinkConfig) -> WriterLiveness:
    """The active writer's liveness (not started yet)."""
    return WriterLiveness(
        liveness_storage(cfg),
        liveness_key(cfg),
        writer_id=cfg.writer_id,
        interval_s=cfg["standby.liveness.interval.s"],
    )


def liveness_storage(cfg: LakesinkConfig) -> Storage:
    """The storage the liveness file is on (`liveness_key`)."""
    return _first_table(cfg).table_storage


def _first_table(cfg: LakesinkConfig) -> LakesinkConfig:
    return cfg.table_configs()[0][1] if cfg["tables"] else cfg
