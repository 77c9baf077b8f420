"""`lakesink table create | show | timeline | files | clean | cluster | archive | rollback |
compact`, run by the plugin of the format of the table at the path given, and `lakesink
backfill`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from lakesink.console import emit_json, say
from lakesink.settings import DEFAULT_CLUSTERING_MAX_BYTES

if TYPE_CHECKING:
    from lakesink.formats.backfill import BackfillResult


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
        "clean": "roll back failed writes, delete files no retained view needs (a file slice's "
        "base file and log files together)",
        "cluster": "rewrite small files of partitions into target-size files (replacecommit; "
        "copy-on-write tables: compact a merge-on-read one)",
        "archive": "move old instants out of the active timeline (merge-on-read: the "
        "deltacommits the compaction trigger counts stay, as in Hudi)",
        "rollback": "roll back inflight instants whose heartbeat expired (or one named)",
        "compact": "merge-on-read: merge the log files of each file slice into a new base file "
        "(or finish a pending compaction)",
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
            cmd.add_argument(
                "--max-bytes",
                type=int,
                default=DEFAULT_CLUSTERING_MAX_BYTES,
                help="the most bytes of small files rewritten per partition, oldest first",
            )
            cmd.add_argument("--partition", action="append", default=None)
            cmd.add_argument(
                "--strategy", choices=("file-group", "ingestion-first"), default="file-group"
            )
        if name == "archive":
            cmd.add_argument("--min-instants", type=int, default=20)
            cmd.add_argument("--max-instants", type=int, default=30)
            cmd.add_argument(
                "--compaction-every-commits",
                type=int,
                default=5,
                help="merge-on-read: the table's table.compaction.every.commits N; the "
                "deltacommits since the last compaction stay while fewer than N, else the last "
                "N (Hudi's rule); 0: none stay for it",
            )
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


def run_backfill_command(args: argparse.Namespace) -> int:
    """`backfill` into the table at `--table` (an Iceberg table: `--config` names its catalog,
    `--table` its warehouse); the table's format decides how it commits."""
    from lakesink.config import LakesinkConfig, SparkStart, load_config, storage_access_from_env
    from lakesink.spark.backfill import backfill_plugin, run_backfill
    from lakesink.spark.session import get_spark

    cfg: LakesinkConfig | None = None
    if args.config or args.set:
        overrides = dict(kv.split("=", 1) for kv in args.set if "=" in kv)
        cfg = load_config(args.config, {**overrides, "table.path": args.table})
    # refuses what the format cannot honour (an Iceberg table without its catalog, lock options)
    control = backfill_plugin(args.table, cfg).backfill_control(
        args, cfg.settings if cfg is not None else None, storage_access_from_env()
    )
    spark = get_spark(
        cfg["spark.master"] if cfg is not None else args.spark_master,
        start=cfg.spark_start if cfg is not None else SparkStart.from_env(),
    )
    result = run_backfill(
        spark,
        args.table,
        args.source,
        fmt=args.format,
        cfg=cfg,
        control=control,
        writer_id=args.writer_id,
    )
    return _say_backfill(result, args.json)


def _say_backfill(result: BackfillResult, as_json: bool) -> int:
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


def run(args: argparse.Namespace) -> int:
    """Run a `table` command with the format of the table at its path (`create`: Hudi's)."""
    from lakesink.config import storage_access_from_env
    from lakesink.formats import default_plugin, plugin_at

    access = storage_access_from_env()
    plugin = default_plugin() if args.table_command == "create" else plugin_at(args.path, access)
    return plugin.run_table_command(args, access)
