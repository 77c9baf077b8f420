"""Recovery of failed writes (seed 003's lazy rollback): a writer's own unfinished instants at
its start, and any writer's instants whose heartbeat expired, are rolled back through their
transaction's `abort` — except pre-committed ones, which their owner publishes at restart."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lakesink.engine.transaction import TableTransaction, TxState
from lakesink.faults import crash_point
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.format import HudiFormat
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.timeline import Timeline
from lakesink.metrics import IngestionMetrics
from lakesink.protocol.instant import Instant, InstantTime
from lakesink.storage import StorageError

log = logging.getLogger(__name__)

INTENTS_DIR = Path(".hoodie") / ".lakesink" / "intents"
"""Per streaming instant: whose it is (`<t>.json`) and whether it is pre-committed."""


def intent_key(t: InstantTime) -> str:
    return f"{INTENTS_DIR}/{t.value}.json"


def precommitted_key(t: InstantTime) -> str:
    return f"{INTENTS_DIR}/{t.value}.precommitted"


def intent_owner(table: HudiTable, t: InstantTime) -> str | None:
    """The writer whose intent file names instant `t` (None: no intent, not a stream's)."""
    try:
        data: dict[str, Any] = json.loads(table.storage.read(intent_key(t)))
    except (OSError, ValueError, StorageError):
        return None
    owner = data.get("writer_id")
    return str(owner) if owner is not None else None


def is_precommitted(table: HudiTable, t: InstantTime) -> bool:
    return table.storage.exists(precommitted_key(t))


def recover_failed_writes(
    table: HudiTable,
    control: CommitControl,
    writer_id: str,
    *,
    keep: frozenset[InstantTime] = frozenset(),
    metrics: IngestionMetrics | None = None,
    crash: Callable[[str], None] = crash_point,
    timeline: Timeline | None = None,
) -> list[Instant]:
    """Roll back `writer_id`'s unfinished instants, and other writers' whose heartbeat
    expired — except those in `keep` and others' pre-committed ones (published later).
    `timeline`: a snapshot just taken (saves a LIST)."""
    rolled: list[Instant] = []
    if timeline is None:
        timeline = table.timeline()
    for instant in timeline.inflight_or_requested():
        if not instant.action.writes_data or instant.time in keep:
            continue
        owner = intent_owner(table, instant.time)
        if owner != writer_id and is_precommitted(table, instant.time):
            continue
        if owner == writer_id or control.heartbeat_expired(table, instant.time):
            tx = TableTransaction.resume(
                HudiFormat(table),
                control,
                instant.time,
                writer_id=owner or writer_id,
                action=instant.action,
                state=TxState.ACTIVE,
                metrics=metrics,
            )
            # Under the lock, checked again: a publisher holds the lock from its liveness
            # check to its completed file, so no instant completes while its files go.
            with tx.locked():
                current = table.timeline().get(instant.time)
                if current is None or current.is_completed:
                    continue
                if owner != writer_id and not control.heartbeat_expired(table, instant.time):
                    continue  # its writer resumed and beat again
                log.warning(
                    "table %s: rolling back instant %s of writer %s (writer %s recovering)",
                    table.config.name,
                    instant.time,
                    owner,
                    writer_id,
                )
                crash("during-rollback")
                tx.roll_back_pending(current)
                table.storage.delete(intent_key(instant.time))
                rolled.append(instant)
    if rolled and metrics is not None:
        metrics.record_rollback("recovery", len(rolled))
    return rolled
