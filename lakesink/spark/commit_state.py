"""What the table knows about a writer: its committed offsets, read from completed instants."""

from __future__ import annotations

import json
from pathlib import Path

from lakesink.errors import TableNotFoundError
from lakesink.protocol.instant import Action, Instant
from lakesink.protocol.offsets import WriterOffsets
from lakesink.storage import Storage
from lakesink.table.hudi_table import HudiTable
from lakesink.table.timeline import Timeline

WRITER_ID_KEY = "lakesink.writer_id"
OFFSETS_KEY = "lakesink.offsets"  # the writer's next offsets after this commit, all partitions
RANGES_KEY = "lakesink.ranges"  # the ranges this commit ingested
SKIPPED_KEY = "lakesink.skipped"  # spans deleted from Kafka before they were read, passed over
TOPIC_IDS_KEY = "lakesink.topic_ids"  # Kafka's id of each topic the offsets belong to
QUERY_ID_KEY = "lakesink.query_id"
BATCH_ID_KEY = "lakesink.batch_id"
COMMIT_ID_KEY = "lakesink.commit_id"
BACKFILL_ID_KEY = "lakesink.backfill.id"  # digest of a backfill's source files


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


def last_commit_of(timeline: Timeline, writer_id: str) -> tuple[Instant, WriterOffsets] | None:
    """The newest completed commit of `writer_id` and the offsets it recorded."""
    for instant in reversed(timeline.completed()):
        if instant.action is not Action.COMMIT:
            continue
        extra = timeline.commit_metadata(instant).extra
        if extra.get(WRITER_ID_KEY) == writer_id and OFFSETS_KEY in extra:
            return instant, _offsets(extra[OFFSETS_KEY])
    return None


def committed_offsets(
    table: HudiTable, writer_id: str, timeline: Timeline | None = None
) -> WriterOffsets:
    """From the newest active commit of the writer, else from the archive's index of writers
    (archival moved its last commit away). `timeline`: a snapshot just taken (saves a LIST)."""
    found = last_commit_of(timeline or table.timeline(), writer_id)
    if found:
        return found[1]
    from lakesink.services.archival import archived_offsets

    return archived_offsets(table, writer_id) or WriterOffsets.empty()


def committed_offsets_at(table_path: str | Path | Storage, writer_id: str) -> WriterOffsets:
    """Committed offsets of a writer, or none when the table does not exist yet."""
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
    for instant in reversed(timeline.completed()):
        if instant.action is not Action.COMMIT:
            continue
        extra = timeline.commit_metadata(instant).extra
        if extra.get(WRITER_ID_KEY) == writer_id and OFFSETS_KEY in extra:
            ids = json.loads(extra.get(TOPIC_IDS_KEY, "{}"))
            return {str(k): str(v) for k, v in ids.items()}
    return {}
