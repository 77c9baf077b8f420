"""`lakesink table create | show | timeline | files | clean | cluster | archive | rollback |
compact` of a Hudi table (lakesink.cli.table_commands parses them), and the commit control of
the table services and of `lakesink backfill`."""

from __future__ import annotations

import argparse
from typing import Any

from lakesink.console import emit_json, say, table
from lakesink.settings import Settings, StorageAccess


def control_of(args: argparse.Namespace, access: StorageAccess) -> Any:
    """The commit control that a command's lock options (--lock-provider, ...) describe."""
    from lakesink.formats.hudi.control import LockedCommitControl

    return LockedCommitControl(
        access.open(args.path if hasattr(args, "path") else args.table),
        lock_provider=args.lock_provider or ("postgres" if args.postgres_dsn else "filesystem"),
        postgres_dsn=args.postgres_dsn,
        lock_timeout_s=args.lock_timeout_s,
        heartbeat_interval_s=min(5.0, args.heartbeat_tolerance_s / 3),
        heartbeat_tolerance_s=args.heartbeat_tolerance_s,
    )


def backfill_control(
    args: argparse.Namespace, settings: Settings | None, access: StorageAccess
) -> Any:
    """The commit control of `lakesink backfill` into the Hudi table at `--table`: the lock and
    heartbeat of the configuration's `settings`, unless the command line names a lock."""
    if settings is not None and args.lock_provider is None and not args.postgres_dsn:
        from lakesink.formats.hudi.control import ControlSettings, LockedCommitControl

        return LockedCommitControl.from_settings(
            args.table, ControlSettings.from_settings(settings.commit)
        )
    return control_of(args, access)


def _split(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def run_table_command(args: argparse.Namespace, access: StorageAccess) -> int:
    """Run the `table` command `args` names on the Hudi table at its path (reached by
    `access`)."""
    from lakesink.formats.hudi.table.config import TableConfig
    from lakesink.formats.hudi.table.hudi_table import HudiTable

    if args.table_command == "create":
        t = HudiTable.create(
            access.open(args.path),
            TableConfig(
                name=args.name,
                version=args.table_version,
                record_key_fields=_split(args.record_key),
                partition_fields=_split(args.partition_by),
            ),
        )
        say(f"created {t.config.name} (version {t.config.version}) at {t.uri}")
        return 0
    tbl = HudiTable.open(access.open(args.path))
    if args.table_command == "compact":
        return _compact(tbl, args, access)
    if args.table_command in ("clean", "cluster", "archive", "rollback"):
        if args.table_command == "cluster":
            from lakesink.formats.hudi.services.clustering import refuse_merge_on_read

            refuse_merge_on_read(tbl)  # before taking the lock
        return _service(tbl, args, access)
    if args.table_command == "show":
        return _show(tbl, args.json)
    if args.table_command == "timeline":
        return _timeline(tbl, args.json)
    return _files(tbl, args.json)


def _show(tbl: Any, as_json: bool) -> int:
    from lakesink.formats.hudi.table.view import FileSystemView

    timeline = tbl.timeline()
    files = FileSystemView(tbl).latest_base_files()
    last = timeline.last_completed()
    info = {
        "path": str(tbl.uri),
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
    from lakesink.formats.hudi.writer_state import RANGES_KEY, WRITER_ID_KEY

    timeline = tbl.timeline()
    rows = []
    for i in timeline.instants:
        writer, ranges, records = "", "", ""
        if i.is_completed and i.action.writes_data:
            md = timeline.commit_metadata(i)
            writer = md.extra.get(WRITER_ID_KEY, "")
            ranges = md.extra.get(RANGES_KEY, "")
            records = str(md.total_records)
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
    from lakesink.formats.hudi.table.view import FileSystemView

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


def _compact(tbl: Any, args: argparse.Namespace, access: StorageAccess) -> int:
    """Finish the pending compactions, or schedule and run one (merge-on-read tables only)."""
    from lakesink.formats.hudi.services.compaction import compact

    r = compact(tbl, control_of(args, access))
    info = {
        "instant": str(r.instant.time) if r.instant else None,
        "file_groups": r.file_groups,
        "rows": r.rows,
        "reason": r.reason,
    }
    if args.json:
        emit_json(info)
    elif r.instant:
        say(f"compact: merged {r.file_groups} file slices into base files ({r.rows} rows)")
    else:
        say(f"compact: nothing to do ({r.reason})")
    return 0


def _service(tbl: Any, args: argparse.Namespace, access: StorageAccess) -> int:
    control = control_of(args, access)
    cmd = args.table_command
    info: dict[str, Any]
    if cmd == "clean":
        from lakesink.formats.hudi.services.clean import RetainPolicy, clean

        r = clean(tbl, control, RetainPolicy(args.retain_commits, args.retain_hours))
        info = {
            "instant": str(r.instant.time) if r.instant else None,
            "deleted": list(r.deleted),
            "rolled_back": [str(i.time) for i in r.rolled_back],
            "earliest_retained": str(r.plan.earliest_retained or ""),
        }
        text = f"clean: deleted {len(r.deleted)} files, rolled back {len(r.rolled_back)} instants"
    elif cmd == "cluster":
        from lakesink.formats.hudi.services.clustering import ClusteringOptions, cluster
        from lakesink.protocol.conflicts import strategy_named

        options = ClusteringOptions(
            small_file_bytes=args.small_file_bytes,
            target_file_bytes=args.target_file_bytes,
            min_files=args.min_files,
            max_bytes=args.max_bytes,
            partitions=tuple(args.partition) if args.partition else None,
        )
        c = cluster(tbl, control, options, strategy_named(args.strategy))
        info = {
            "instant": str(c.instant.time) if c.instant else None,
            "files_before": c.files_before,
            "files_after": c.files_after,
            "rows": c.rows,
        }
        text = (
            f"cluster: rewrote {c.files_before} files into {c.files_after} ({c.rows} rows)"
            if c.instant
            else "cluster: nothing to do"
        )
    elif cmd == "archive":
        from lakesink.errors import ConfigError
        from lakesink.formats.hudi.services.archival import ArchivePolicy, archive

        # merge-on-read: the deltacommits the compaction trigger counts stay
        try:
            policy = ArchivePolicy(
                args.min_instants,
                args.max_instants,
                compaction_every_commits=args.compaction_every_commits,
            )
        except ValueError as e:
            raise ConfigError(f"lakesink table archive: {e}") from e
        a = archive(tbl, control, policy)
        info = {
            "archived": [str(i.time) for i in a.archived],
            "active_before": a.active_before,
            "active_after": a.active_after,
            "held_back_by": a.held_back_by,
        }
        text = f"archive: moved {len(a.archived)} instants; {a.active_after} remain active"
        if a.held_back_by:
            text += f" (held back by {a.held_back_by})"
    else:
        from lakesink.errors import CommitError
        from lakesink.formats.hudi.services.lazy_rollback import rollback_failed_writes
        from lakesink.formats.hudi.table.rollback import rollback

        if args.instant:
            target = tbl.timeline().get(args.instant)
            if target is None or target.is_completed:
                raise CommitError(f"{args.instant} is not an inflight instant of {tbl.uri}")
            rolled = [rollback(tbl, target)]
        else:
            rolled = rollback_failed_writes(tbl, control)
        info = {"rolled_back": [str(i.time) for i in rolled]}
        text = f"rollback: {len(rolled)} instants rolled back"
    if args.json:
        emit_json(info)
    else:
        say(text)
    return 0
