"""Timeline steps the table layer leaves to the commit engine: completing a non-data instant (a
clean), abandoning a pending one, and lakesink's files beside an instant (a table service's
plan)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from lakesink.errors import CommitError
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.timeline import next_completion_time
from lakesink.protocol.instant import Instant, InstantTime, State, TimelineLayout
from lakesink.storage import ObjectExistsError, StorageError

log = logging.getLogger(__name__)

SERVICES_DIR = Path(".hoodie") / ".lakesink" / "services"
"""lakesink's own files of table services (plans, last inline run), relative to the base."""


def complete_instant(table: HudiTable, instant: Instant, content: bytes) -> Instant:
    """Write the completed file of a non-data instant (a clean) atomically, never empty."""
    timeline = table.timeline()
    current = timeline.get(instant.time)
    if current is None or current.action is not instant.action or current.is_completed:
        raise CommitError(f"cannot complete {instant} in {timeline.where}: found {current}")
    done = instant.with_state(State.COMPLETED)
    if table.layout is TimelineLayout.V2:
        done = instant.with_state(State.COMPLETED, next_completion_time(timeline, instant.time))
    try:
        table.storage.create(timeline.key_of(done), content)
    except ObjectExistsError:
        raise CommitError(f"{done} is already completed") from None
    log.info("table %s: completed %s", table.config.name, done)
    return done


def abandon_pending(table: HudiTable, instant: Instant) -> None:
    """Remove a pending non-data instant (a clean that died): its inflight then requested file."""
    table.timeline().remove_pending(instant)


def plan_path(table: HudiTable, kind: str, instant_time: InstantTime) -> str:
    """The key of a service's plan file, relative to the table root."""
    return f"{SERVICES_DIR}/{kind}/{instant_time.value}.json"


def write_json(table: HudiTable, key: str, data: Any) -> None:
    """Write JSON to `key` of the table, whole (readers see the old or the new one)."""
    table.storage.write(key, json.dumps(data, sort_keys=True).encode())


def read_json(table: HudiTable, key: str) -> Any:
    try:
        return json.loads(table.storage.read(key))
    except (OSError, ValueError, StorageError):
        return None
