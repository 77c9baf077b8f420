"""`lakesink table create | show | timeline | files`."""

from __future__ import annotations

import argparse
from typing import Any

from lakesink.cli.output import emit_json, say, table


def add_parser(sub: Any) -> None:
    p = sub.add_parser("table", help="inspect and manage a Hudi table")
    tsub = p.add_subparsers(dest="table_command", required=True)
    create = tsub.add_parser("create", help="create an empty table")
    create.add_argument("path")
    create.add_argument("--name", required=True)
    create.add_argument("--table-version", type=int, choices=(6, 8), default=8)
    create.add_argument("--record-key", default="kafka_topic,kafka_partition,kafka_offset")
    create.add_argument("--partition-by", default="")
    for name, text in (
        ("show", "table properties and a summary"),
        ("timeline", "instants with their states and times"),
        ("files", "latest base files per partition"),
    ):
        cmd = tsub.add_parser(name, help=text)
        cmd.add_argument("path")
        cmd.add_argument("--json", action="store_true")


def _split(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def run(args: argparse.Namespace) -> int:
    from lakesink.table.config import TableConfig
    from lakesink.table.hudi_table import HudiTable

    if args.table_command == "create":
        t = HudiTable.create(
            args.path,
            TableConfig(
                name=args.name,
                version=args.table_version,
                record_key_fields=_split(args.record_key),
                partition_fields=_split(args.partition_by),
            ),
        )
        say(f"created {t.config.name} (version {t.config.version}) at {t.base_path}")
        return 0
    tbl = HudiTable.open(args.path)
    if args.table_command == "show":
        return _show(tbl, args.json)
    if args.table_command == "timeline":
        return _timeline(tbl, args.json)
    return _files(tbl, args.json)


def _show(tbl: Any, as_json: bool) -> int:
    from lakesink.table.view import FileSystemView

    timeline = tbl.timeline()
    files = FileSystemView(tbl).latest_base_files()
    last = timeline.last_completed()
    info = {
        "path": str(tbl.base_path),
        "name": tbl.config.name,
        "version": tbl.config.version,
        "record_key_fields": list(tbl.config.record_key_fields),
        "partition_fields": list(tbl.config.partition_fields),
        "instants": len(timeline.instants),
        "completed": len(timeline.completed()),
        "inflight": [str(i) for i in timeline.inflight_or_requested()],
        "last_completed": str(last) if last else None,
        "files": len(files),
        "bytes": sum(getattr(f, "file_size_bytes", 0) or 0 for f in files),
        "properties": tbl.properties(),
    }
    if as_json:
        emit_json(info)
        return 0
    for k, v in info.items():
        if k != "properties":
            say(f"{k:18} {v}")
    return 0


def _timeline(tbl: Any, as_json: bool) -> int:
    from lakesink.spark.commit_state import RANGES_KEY, WRITER_ID_KEY

    timeline = tbl.timeline()
    rows = []
    for i in timeline.instants:
        writer, ranges, records = "", "", ""
        if i.is_completed and i.action.writes_data:
            md = timeline.commit_metadata(i)
            writer = md.extra.get(WRITER_ID_KEY, "")
            ranges = md.extra.get(RANGES_KEY, "")
            records = str(md.total_records())
        rows.append(
            {
                "time": i.time.value,
                "action": i.action.value,
                "state": i.state.name.lower(),
                "completed_at": i.completion_time.value if i.completion_time else "",
                "writer": writer,
                "records": records,
                "ranges": ranges,
            }
        )
    if as_json:
        emit_json(rows)
        return 0
    say(
        table(
            ["time", "action", "state", "completed at", "writer", "records"],
            [
                [r["time"], r["action"], r["state"], r["completed_at"], r["writer"], r["records"]]
                for r in rows
            ],
        )
    )
    return 0


def _files(tbl: Any, as_json: bool) -> int:
    from lakesink.table.view import FileSystemView

    files = FileSystemView(tbl).latest_base_files()
    rows = [
        {
            "partition": getattr(f, "partition_path", ""),
            "path": str(getattr(f, "path", f)),
            "bytes": getattr(f, "file_size_bytes", None),
        }
        for f in files
    ]
    if as_json:
        emit_json(rows)
        return 0
    say(
        table(
            ["partition", "file", "bytes"], [[r["partition"], r["path"], r["bytes"]] for r in rows]
        )
    )
    return 0
