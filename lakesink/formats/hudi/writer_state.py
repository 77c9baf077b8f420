"""A writer's commit state, as the table records it: the one module that knows it.

Every commit lakesink publishes carries, in its metadata's extra map, the writer that made it,
the Kafka offsets it ingested up to and the ids that tie it to a query, a batch and a backfill
(the keys below). Archival moves old commits away and first records each writer's newest
offsets and every archived backfill id in two index files beside the archive; the functions
here read a writer's state from the active timeline and fall back to those indexes.

`committed_offsets` is the one entry point for "the offsets this writer has committed".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# the keys of the state read here, re-exported for the Hudi side's callers
from lakesink.engine.writer_state import (
    BACKFILL_ID_KEY as BACKFILL_ID_KEY,
)
from lakesink.engine.writer_state import (
    BACKFILL_SOURCE_KEY as BACKFILL_SOURCE_KEY,
)
from lakesink.engine.writer_state import (
    BATCH_ID_KEY as BATCH_ID_KEY,
)
from lakesink.engine.writer_state import (
    COMMIT_ID_KEY as COMMIT_ID_KEY,
)
from lakesink.engine.writer_state import (
    LOST_KEY as LOST_KEY,
)
from lakesink.engine.writer_state import (
    OFFSETS_KEY as OFFSETS_KEY,
)
from lakesink.engine.writer_state import (
    QUERY_ID_KEY as QUERY_ID_KEY,
)
from lakesink.engine.writer_state import (
    RANGES_KEY as RANGES_KEY,
)
from lakesink.engine.writer_state import (
    SKIPPED_KEY as SKIPPED_KEY,
)
from lakesink.engine.writer_state import (
    TOPIC_IDS_KEY as TOPIC_IDS_KEY,
)
from lakesink.engine.writer_state import (
    WRITER_ID_KEY as WRITER_ID_KEY,
)
from lakesink.errors import TableNotFoundError
from lakesink.formats.hudi.instants import read_json, write_json
from lakesink.formats.hudi.table.archive import ARCHIVE_KEY
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.timeline import Timeline
from lakesink.protocol.instant import Action, Instant
from lakesink.protocol.offsets import WriterOffsets
from lakesink.storage import Storage

WRITERS_INDEX = "writers.json"
"""Beside the archive: each archived writer's newest instant and offsets."""
BACKFILLS_INDEX = "backfills.json"
"""Beside the archive: the backfill ids of archived commits."""


_PARSED_OFFSETS: dict[str, WriterOffsets] = {}
"""The `lakesink.offsets` text of a commit -> its WriterOffsets (a pure function of the text;
with hundreds of partitions, parsing it was a visible part of every commit)."""


def _offsets(text: str) -> WriterOffsets:
    found = _PARSED_OFFSETS.get(text)
    if found is None:
        found = WriterOffsets.from_json(json.loads(text))
        if len(_PARSED_OFFSETS) >= 256:
            _PARSED_OFFSETS.clear()
        _PARSED_OFFSETS[text] = found
    return found


_WRITER_ACTIONS = (Action.COMMIT, Action.DELTA_COMMIT)
"""The actions a writer's batches complete as: commits, and deltacommits on a merge-on-read
table (table.type)."""


def last_commit_of(timeline: Timeline, writer_id: str) -> tuple[Instant, WriterOffsets] | None:
    """The newest completed commit of `writer_id` on the active timeline and its offsets."""
    for instant in reversed(timeline.completed()):
        if instant.action not in _WRITER_ACTIONS:
            continue
        extra = timeline.commit_metadata(instant).extra
        if extra.get(WRITER_ID_KEY) == writer_id and OFFSETS_KEY in extra:
            return instant, _offsets(extra[OFFSETS_KEY])
    return None


def committed_offsets(
    table: HudiTable, writer_id: str, timeline: Timeline | None = None
) -> WriterOffsets:
    """The offsets `writer_id` has committed: from its newest active commit, else from the
    archive's index of writers (archival moved its last commit away), else none.
    `timeline`: a snapshot just taken (saves a LIST)."""
    found = last_commit_of(table.timeline() if timeline is None else timeline, writer_id)
    if found:
        return found[1]
    return archived_offsets(table, writer_id) or WriterOffsets.empty()


def committed_offsets_at(table_path: str | Path | Storage, writer_id: str) -> WriterOffsets:
    """`committed_offsets` of a table given by path; none when the table does not exist yet."""
    try:
        table = HudiTable.open(table_path)
    except TableNotFoundError:
        return WriterOffsets.empty()
    return committed_offsets(table, writer_id)


def committed_topic_ids_at(table_path: str | Path | Storage, writer_id: str) -> dict[str, str]:
    """The Kafka topic ids the writer's newest active commit recorded (none when it recorded
    none, the table does not exist or archival moved the commit away)."""
    try:
        table = HudiTable.open(table_path)
    except TableNotFoundError:
        return {}
    timeline = table.timeline()
    found = last_commit_of(timeline, writer_id)
    if found is None:
        return {}
    ids = json.loads(timeline.commit_metadata(found[0]).extra.get(TOPIC_IDS_KEY, "{}"))
    return {str(k): str(v) for k, v in ids.items()}


def backfill_committed(
    table: HudiTable, backfill_id: str, timeline: Timeline | None = None
) -> bool:
    """Whether a commit of backfill `backfill_id` is on the table (active or archived)."""
    tl = timeline or table.timeline()
    return backfill_id in archived_backfill_ids(table) or any(
        tl.commit_metadata(i).extra.get(BACKFILL_ID_KEY) == backfill_id
        for i in tl.completed()
        if i.action in _WRITER_ACTIONS
    )


# --- the archive's indexes ------------------------------------------------------------------
def record_archived_writers(
    table: HudiTable, timeline: Timeline, chosen: Sequence[Instant]
) -> None:
    """Before archival moves `chosen`: record the archived writers' newest offsets and the
    archived backfills (a backfill of the same files must stay done)."""
    path = f"{ARCHIVE_KEY}/{WRITERS_INDEX}"
    index: dict[str, Any] = read_json(table, path) or {}
    backfills = archived_backfill_ids(table)
    for inst in chosen:
        if inst.action not in _WRITER_ACTIONS:
            continue
        extra = timeline.commit_metadata(inst).extra
        if BACKFILL_ID_KEY in extra:
            backfills.add(extra[BACKFILL_ID_KEY])
        writer = extra.get(WRITER_ID_KEY)
        if writer is None or OFFSETS_KEY not in extra:
            continue
        prev = index.get(writer)
        if prev is None or str(prev["instant"]) < inst.time.value:
            index[writer] = {
                "instant": inst.time.value,
                "offsets": json.loads(extra[OFFSETS_KEY]),
            }
    write_json(table, path, index)
    write_json(table, f"{ARCHIVE_KEY}/{BACKFILLS_INDEX}", sorted(backfills))


def archived_backfill_ids(table: HudiTable) -> set[str]:
    """The backfill ids (`lakesink.backfill.id`) of archived commits."""
    ids: Any = read_json(table, f"{ARCHIVE_KEY}/{BACKFILLS_INDEX}")
    return {str(i) for i in ids} if isinstance(ids, list) else set()


def archived_offsets(table: HudiTable, writer_id: str) -> WriterOffsets | None:
    """The offsets of `writer_id`'s newest archived commit, if one was archived."""
    index: Any = read_json(table, f"{ARCHIVE_KEY}/{WRITERS_INDEX}")
    if not isinstance(index, dict) or writer_id not in index:
        return None
    return WriterOffsets.from_json(index[writer_id]["offsets"])
