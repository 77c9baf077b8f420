"""Lazy rollback of failed writes (seed 003): an inflight instant of any writer whose heartbeat
expired is rolled back, its files deleted by markers. The logic is the writer's recovery
(`lakesink.formats.hudi.recovery`), reused here for the cleaner and the CLI; pending cleans whose
heartbeat expired are abandoned (a clean only deletes files that are garbage anyway)."""

from __future__ import annotations

import logging

from lakesink.formats.hudi.control import SERVICES_WRITER_ID, CommitControl
from lakesink.formats.hudi.instants import abandon_pending
from lakesink.formats.hudi.recovery import recover_failed_writes
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.protocol.instant import Action, Instant

log = logging.getLogger(__name__)


def rollback_failed_writes(
    table: HudiTable, control: CommitControl, *, writer_id: str = SERVICES_WRITER_ID
) -> list[Instant]:
    """Roll back every failed write (expired heartbeat) and abandon dead cleans; returns the
    instants rolled back or abandoned."""
    rolled = recover_failed_writes(table, control, writer_id)
    for inst in table.timeline().inflight_or_requested(Action.CLEAN):
        if control.heartbeat_expired(table, inst.time):
            log.warning(
                "table %s: abandoning clean %s whose heartbeat expired", table.config.name, inst
            )
            abandon_pending(table, inst)
            rolled.append(inst)
    return rolled
