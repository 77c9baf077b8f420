"""`lakesink status` of a Hudi table: the writer's committed offsets, lag and pending epochs, the
offsets its commits passed over, and the table's files and timeline."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from lakesink.console import say, table
from lakesink.errors import TableNotFoundError
from lakesink.formats.hudi.writer_state import LOST_KEY, SKIPPED_KEY
from lakesink.formats.status import add_pending, print_head
from lakesink.protocol.offsets import TopicPartition
from lakesink.settings import Settings


def collect_status(
    settings: Settings,
    *,
    high_watermarks: Callable[[], Mapping[TopicPartition, int]],
    add_metrics: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """The status of the writer of `settings` and its table (HudiPlugin.status)."""
    from lakesink.formats.hudi.table.archive import load_archived_view
    from lakesink.formats.hudi.table.hudi_table import HudiTable
    from lakesink.formats.hudi.table.view import FileSystemView
    from lakesink.formats.hudi.writer_state import committed_offsets_at

    committed = committed_offsets_at(settings.table_storage(), settings.writer_id)
    marks = high_watermarks()
    partitions = []
    for tp in sorted(set(marks) | set(committed.next_offsets)):
        pos = committed.get(tp)
        hi = marks.get(tp)
        lag = None if hi is None else hi - (pos or 0)
        partitions.append(
            {"partition": tp.key(), "committed": pos, "high_watermark": hi, "lag": lag}
        )
    out: dict[str, Any] = {"writer_id": settings.writer_id, "partitions": partitions}
    add_pending(settings.commit, out)
    add_metrics(out)
    try:
        tbl = HudiTable.open(settings.table_storage())
    except TableNotFoundError:
        out["table"] = None
        return out
    out["skipped"] = skipped_spans(tbl, settings.writer_id)
    out["lost"] = skipped_spans(tbl, settings.writer_id, key=LOST_KEY)
    timeline = tbl.timeline()
    files = FileSystemView(tbl).latest_base_files()
    archived = load_archived_view(tbl.storage)
    out["table"] = {
        "path": tbl.uri,
        "version": tbl.config.version,
        "files": len(files),
        "active_instants": len(timeline.instants),
        "archived_up_to": str(archived.upto) if archived is not None else None,
        "instants": [str(i) for i in timeline.instants[-10:]],
        "inflight": [str(i) for i in timeline.inflight_or_requested()],
    }
    return out


def skipped_spans(table: Any, writer_id: str, *, key: str = SKIPPED_KEY) -> list[dict[str, Any]]:
    """Every span of offsets the writer's commits passed over (kafka.fail.on.data.loss=false):
    deleted from Kafka before they were read (SKIPPED_KEY), or lost by the broker after a batch
    was planned over them (LOST_KEY)."""
    from lakesink.formats.hudi.audit import completed_commits
    from lakesink.formats.hudi.writer_state import WRITER_ID_KEY

    out: list[dict[str, Any]] = []
    for instant, metadata in completed_commits(table):
        extra = metadata.extra
        if extra.get(WRITER_ID_KEY) != writer_id or key not in extra:
            continue
        for partition, start, end in json.loads(extra[key]):
            out.append(
                {
                    "partition": partition,
                    "from": start,
                    "to": end,
                    "records": end - start,
                    "instant": instant.time.value,
                }
            )
    return out


def print_status(st: dict[str, Any]) -> None:
    """`collect_status`'s status as text."""
    print_head(st)
    if st["table"] is None:
        say("table: not created yet")
        return
    if st["skipped"]:
        say(f"\nskipped (deleted from Kafka before they were read): {len(st['skipped'])} spans")
        say(_spans_table(st["skipped"]))
    if st["lost"]:
        say(
            f"\nlost (the broker's log end moved back below a planned batch): "
            f"{len(st['lost'])} spans"
        )
        say(_spans_table(st["lost"]))
    t = st["table"]
    say(f"\ntable {t['path']} (version {t['version']}): {t['files']} files")
    archived = f", archived up to {t['archived_up_to']}" if t["archived_up_to"] else ""
    say(f"timeline: {t['active_instants']} active instants{archived}")
    say("last instants:")
    for i in t["instants"]:
        say(f"  {i}")
    if t["inflight"]:
        say("inflight: " + ", ".join(t["inflight"]))


def _spans_table(spans: list[dict[str, Any]]) -> str:
    return table(
        ["partition", "from", "to", "offsets", "instant"],
        [[s["partition"], s["from"], s["to"], s["records"], s["instant"]] for s in spans],
    )
