"""`lakesink iceberg expire-snapshots | rewrite-data-files | remove-orphan-files`: maintenance of
the Iceberg table a configuration names (`table.format=iceberg`), each one catalog commit."""

from __future__ import annotations

import argparse
from typing import Any

from lakesink.console import emit_json, say
from lakesink.settings import Settings

HELP = {
    "expire-snapshots": "expire old snapshots, keeping each writer's newest commit (its offsets)",
    "rewrite-data-files": "apply position deletes, rewrite small data files into target-size "
    "ones (replace snapshots)",
    "remove-orphan-files": "delete unreferenced files older than a safety window",
}


def add_parser(sub: Any, add_config_args: Any) -> None:
    p = sub.add_parser("iceberg", help="maintain an Iceberg table (table.format=iceberg)")
    isub = p.add_subparsers(dest="iceberg_command", required=True)
    for name, text in HELP.items():
        cmd = isub.add_parser(name, help=text)
        add_config_args(cmd)
        cmd.add_argument("--json", action="store_true")
        if name == "expire-snapshots":
            cmd.add_argument(
                "--older-than-hours",
                type=float,
                default=None,
                help="default: table.services.clean.retain.hours, else 120 (5 days)",
            )
        if name == "rewrite-data-files":
            cmd.add_argument(
                "--small-file-bytes",
                type=int,
                default=None,
                help="default: table.services.clustering.small.file.bytes",
            )
            cmd.add_argument(
                "--target-file-bytes",
                type=int,
                default=None,
                help="default: table.target.file.size.bytes",
            )
            cmd.add_argument(
                "--min-files",
                type=int,
                default=None,
                help="default: table.services.clustering.min.files (at least 2)",
            )
        if name == "remove-orphan-files":
            cmd.add_argument(
                "--older-than-hours",
                type=float,
                default=None,
                help="the safety window (default: table.services.orphans.retain.hours, 72; "
                "files of in-flight batches are younger)",
            )


def run(args: argparse.Namespace, settings: Settings) -> int:
    from dataclasses import replace

    from lakesink.formats.iceberg import services as m
    from lakesink.formats.iceberg.format import open_iceberg_table

    options = m.IcebergMaintenanceOptions.from_settings(settings)
    table = open_iceberg_table(settings, create=False)
    cmd = args.iceberg_command
    info: dict[str, Any]
    if cmd == "expire-snapshots":
        hours = (
            args.older_than_hours
            if args.older_than_hours is not None
            else options.expire_older_than_hours
        )
        e = m.expire_snapshots(table, hours)
        info = {
            "table": table.name,
            "older_than_hours": hours,
            "expired": list(e.expired),
            "retained": e.retained,
        }
        text = f"expire-snapshots: expired {len(e.expired)} snapshots, {e.retained} retained"
    elif cmd == "rewrite-data-files":
        rw = options.rewrite
        given = {
            "small_file_bytes": args.small_file_bytes,
            "target_file_bytes": args.target_file_bytes,
            "min_files": args.min_files,
        }
        # by hand: every small file, not a size tier at a time as the inline runs take them
        rw = replace(rw, tier_ratio=0, **{k: v for k, v in given.items() if v is not None})
        r = m.rewrite_data_files(table, rw)
        info = {
            "table": table.name,
            "snapshot_id": r.snapshot_id,
            "files_before": r.files_before,
            "files_after": r.files_after,
            "rows": r.rows,
            "attempts": r.attempts,
        }
        text = (
            f"rewrite-data-files: replaced {r.files_before} files by {r.files_after} "
            f"({r.rows} rows) in snapshot {r.snapshot_id}"
            if r.snapshot_id is not None
            else "rewrite-data-files: nothing to do"
        )
    else:
        hours = (
            args.older_than_hours
            if args.older_than_hours is not None
            else options.orphan_older_than_hours
        )
        o = m.remove_orphan_files(table, hours, storage_options=settings.storage)
        info = {"table": table.name, "older_than_hours": hours, "deleted": list(o.deleted)}
        text = f"remove-orphan-files: deleted {len(o.deleted)} files"
    if args.json:
        emit_json(info)
    else:
        say(text)
    return 0
