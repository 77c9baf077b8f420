"""`lakesink table create | show | timeline | files | clean | cluster | archive | rollback`, and
`lakesink backfill`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from lakesink.cli.output import emit_json, say, table
from lakesink.errors import ConfigError
from lakesink.formats import plugin_of


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
    services = {
        "clean": "roll back failed writes, delete files no retained view needs",
        "cluster": "rewrite small files of partitions into target-size files (replacecommit)",
        "archive": "move old instants out of the active timeline",
        "rollback": "roll back inflight instants whose heartbeat expired (or one named)",
    }
    for name, text in services.items():
        cmd = tsub.add_parser(name, help=text)
        cmd.add_argument("path")
        cmd.add_argument("--json", action="store_true")
        _add_lock_args(cmd)
        if name == "clean":
            cmd.add_argument("--retain-commits", type=int, default=30)
            cmd.add_argument("--retain-hours", type=float, default=None)
        if name == "cluster":
            cmd.add_argument("--small-file-bytes", type=int, default=100 * 1024 * 1024)
            cmd.add_argument("--target-file-bytes", type=int, default=128 * 1024 * 1024)
            cmd.add_argument("--min-files", type=int, default=2)
            cmd.add_argument("--partition", action="append", default=None)
            cmd.add_argument(
                "--strategy", choices=("file-group", "ingestion-first"), default="file-group"
            )
        if name == "archive":
            cmd.add_argument("--min-instants", type=int, default=20)
            cmd.add_argument("--max-instants", type=int, default=30)
        if name == "rollback":
            cmd.add_argument("--instant", help="roll back this inflight instant (even if alive)")


def _add_lock_args(cmd: Any) -> None:
    cmd.add_argument("--lock-provider", choices=("filesystem", "postgres", "none"))
    cmd.add_argument("--postgres-dsn", default=None)
    cmd.add_argument("--lock-timeout-s", type=float, default=60.0)
    cmd.add_argument("--heartbeat-tolerance-s", type=float, default=60.0)


def add_backfill_parser(sub: Any) -> None:
    p = sub.add_parser("backfill", help="write files into a table beside the streaming writer")
    p.add_argument(
        "--table",
        required=True,
        help="the table's path (Hudi); with table.format=iceberg in --config, the warehouse",
    )
    p.add_argument("--from", dest="source", required=True, help="a file or folder of files")
    p.add_argument("--format", choices=("parquet", "json", "csv"), default="parquet")
    p.add_argument(
        "--config",
        "-c",
        help="configuration file (lock, heartbeat, partitioning; an Iceberg table's catalog)",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--writer-id", default=None)
    p.add_argument("--spark-master", default="local[2]")
    p.add_argument("--json", action="store_true")
    _add_lock_args(p)


def _control(args: argparse.Namespace) -> Any:
    from lakesink.config import table_storage_at
    from lakesink.formats.hudi.control import LockedCommitControl

    return LockedCommitControl(
        table_storage_at(args.path if hasattr(args, "path") else args.table),
        lock_provider=args.lock_provider or ("postgres" if args.postgres_dsn else "filesystem"),
        postgres_dsn=args.postgres_dsn,
        lock_timeout_s=args.lock_timeout_s,
        heartbeat_interval_s=min(5.0, args.heartbeat_tolerance_s / 3),
        heartbeat_tolerance_s=args.heartbeat_tolerance_s,
    )


def run_backfill_command(args: argparse.Namespace) -> int:
    if not (args.config or args.set):
        return _hudi_backfill(args, None)
    from lakesink.config import load_config

    overrides = dict(kv.split("=", 1) for kv in args.set if "=" in kv)
    cfg = load_config(args.config, {**overrides, "table.path": args.table})
    return _BACKFILL_OF_FORMAT[plugin_of(cfg).name](args, cfg)


def _hudi_backfill(args: argparse.Namespace, cfg: Any) -> int:
    """`backfill` into the Hudi table at `--table` (`cfg`: its configuration, when given)."""
    from lakesink.config import SparkStart
    from lakesink.formats.iceberg.inspection import iceberg_kind
    from lakesink.spark.backfill import run_backfill
    from lakesink.spark.session import get_spark

    if iceberg_kind(args.table):
        raise ConfigError(
            f"backfill: {args.table} is an Iceberg table; give the configuration of its catalog "
            "(--config with table.format=iceberg, --table the warehouse)"
        )
    if cfg is not None and args.lock_provider is None and not args.postgres_dsn:
        from lakesink.formats.hudi.control import ControlSettings, LockedCommitControl

        control: Any = LockedCommitControl.from_settings(
            args.table, ControlSettings.from_config(cfg)
        )
    else:
        control = _control(args)
    spark = get_spark(
        cfg["spark.master"] if cfg is not None else args.spark_master,
        start=cfg.spark_start if cfg is not None else SparkStart.from_env(),
    )
    result = run_backfill(
        spark,
        args.table,
        args.source,
        fmt=args.format,
        control=control,
        cfg=cfg,
        writer_id=args.writer_id,
    )
    return _say_backfill(result, args.json)


def _iceberg_backfill(args: argparse.Namespace, cfg: Any) -> int:
    """`backfill` into the Iceberg table of `cfg` (`--table`: its warehouse, as table.path)."""
    from lakesink.spark.iceberg_backfill import run_iceberg_backfill
    from lakesink.spark.session import get_spark

    if args.lock_provider is not None or args.postgres_dsn:
        raise ConfigError(
            "backfill: --lock-provider and --postgres-dsn are for Hudi tables; an Iceberg "
            "table's catalog orders its commits"
        )
    spark = get_spark(cfg["spark.master"], start=cfg.spark_start)
    result = run_iceberg_backfill(
        spark, cfg, args.source, fmt=args.format, writer_id=args.writer_id
    )
    return _say_backfill(result, args.json)


# The Spark backfill of each format (Spark code stays in spark/, which a format cannot import)
_BACKFILL_OF_FORMAT: dict[str, Callable[[argparse.Namespace, Any], int]] = {
    "hudi": _hudi_backfill,
    "iceberg": _iceberg_backfill,
}


def _say_backfill(result: Any, as_json: bool) -> int:
    if as_json:
        emit_json(result.to_json())
    elif result.already_committed:
        say(f"backfill {result.backfill_id} was committed before; nothing written")
    else:
        what = (
            f"snapshot {result.snapshot_id}"
            if result.snapshot_id is not None
            else f"instant {result.instant_time}"
        )
        say(
            f"backfill {result.backfill_id} committed {what} as writer "
            f"{result.writer_id}: {result.records:,} records in {result.files} files"
        )
    return 0


def _split(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def run(args: argparse.Namespace) -> int:
    from lakesink.config import table_storage_at
    from lakesink.formats.hudi.table.config import TableConfig
    from lakesink.formats.hudi.table.hudi_table import HudiTable

    if args.table_command == "create":
        t = HudiTable.create(
            table_storage_at(args.path),
            TableConfig(
                name=args.name,
                version=args.table_version,
                record_key_fields=_split(args.record_key),
                partition_fields=_split(args.partition_by),
            ),
        )
        say(f"created {t.config.name} (version {t.config.version}) at {t.uri}")
        return 0
    from lakesink.formats.iceberg.inspection import iceberg_kind, refuse_iceberg, run_table_command

    if iceberg_kind(args.path) is not None:
        if args.table_command in ("clean", "cluster", "archive", "rollback"):
            raise refuse_iceberg(f"table {args.table_command}")
        return run_table_command(args.table_command, args.path, args.json)
    tbl = HudiTable.open(table_storage_at(args.path))
    if args.table_command in ("clean", "cluster", "archive", "rollback"):
        return _service(tbl, args)
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


def _service(tbl: Any, args: argparse.Namespace) -> int:
    control = _control(args)
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
        from lakesink.formats.hudi.services.archival import ArchivePolicy, archive

        a = archive(tbl, control, ArchivePolicy(args.min_instants, args.max_instants))
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
