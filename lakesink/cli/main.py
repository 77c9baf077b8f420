"""`lakesink` — ingest Kafka topics into Hudi tables exactly once.

Errors that are the user's (bad config, missing table, …) print one line and exit with the
error class's code; no traceback. `--debug` shows tracebacks.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from lakesink.errors import LakesinkError


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="configuration file (.toml, .yaml)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a configuration key (repeatable)",
    )


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _version() -> str:
    """The installed distribution's version (a source tree without one installed: unknown)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lakesink")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    from lakesink.formats import FORMAT_NAMES, all_plugins

    parser = argparse.ArgumentParser(prog="lakesink", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="verbose logs and tracebacks")
    parser.add_argument(
        "--version", action="version", version=f"lakesink {_version()}", help="show the version"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="start a local broker, produce events, ingest them, audit")
    demo.add_argument("--events", type=int, default=200_000, help="events to produce")
    demo.add_argument("--partitions", type=int, default=4, help="topic partitions")
    demo.add_argument("--dir", default="lakehouse", help="where the table goes")
    demo.add_argument("--table-version", type=int, choices=(6, 8), default=8)
    demo.add_argument(
        "--format",
        choices=FORMAT_NAMES,
        default="hudi",
        help="the table format to ingest into (iceberg: a warehouse with a SQLite catalog)",
    )
    demo.add_argument("--keep-broker", action="store_true", help="leave the broker's data dir")
    demo.add_argument(
        "--cdc",
        action="store_true",
        help="a change stream instead (Debezium events of an accounts table: creates, updates, "
        "deletes, key changes) landed as a current-state table of keys, Hudi or, with "
        "--format iceberg, Iceberg (write.operation=cdc)",
    )
    demo.add_argument(
        "--changes", type=int, default=20_000, help="with --cdc: changes after the creates"
    )
    demo.add_argument(
        "--registry",
        action="store_true",
        help="a topic whose Avro schema evolves through a local schema registry (Apicurio "
        "Registry, scripts/setup-registry.sh): the table created from the registered schema, "
        "then evolved by three new versions (--events/40 visits each)",
    )

    ingest = sub.add_parser("ingest", help="run the streaming ingestion")
    _add_config_args(ingest)
    ingest.add_argument("--once", action="store_true", help="stop when caught up")
    ingest.add_argument(
        "--standby",
        action="store_true",
        help="a warm standby: start and warm Spark, wait until the active writer of this "
        "writer id stops or its liveness lapses (standby.takeover.after.s), then take over",
    )

    status = sub.add_parser("status", help="committed offsets, lag, recent instants")
    _add_config_args(status)
    status.add_argument("--json", action="store_true")
    status.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=_positive_seconds,
        metavar="SECONDS",
        help="a live view, refreshed every SECONDS (default 2) until Ctrl-C",
    )

    verify = sub.add_parser(
        "verify",
        help="the exactly-once audit: reads the table with readers lakesink did not write "
        "(hudi-rs or pyiceberg, DuckDB and Spark) and checks it against Kafka; the records "
        "transform.arrow filters out are applied to Kafka too and count as accounted for",
    )
    _add_config_args(verify)
    verify.add_argument("--json", action="store_true", help="the report as JSON")

    cfg = sub.add_parser("config", help="configuration reference")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    docs = cfg_sub.add_parser("docs", help="print the reference of every key as a table")
    docs.add_argument(
        "--markdown", action="store_true", help="as Markdown (the configuration page's source)"
    )
    check = cfg_sub.add_parser("check", help="validate a configuration and print it")
    _add_config_args(check)

    from lakesink.cli import broker, table_commands

    broker.add_parser(sub)
    table_commands.add_parser(sub)
    table_commands.add_backfill_parser(sub)
    for plugin in all_plugins():  # each format's own commands (`lakesink iceberg ...`)
        plugin.add_cli_commands(sub, _add_config_args)
    return parser


def _overrides(pairs: Sequence[str]) -> dict[str, str]:
    from lakesink.errors import ConfigError

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--set {pair!r} is not of the form key=value")
        out[key.strip()] = value
    return out


def load(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from lakesink.config import load_config

    return load_config(args.config, _overrides(args.set))


def run(args: argparse.Namespace) -> int:
    if args.command == "demo" and args.registry:
        from lakesink.cli.demo_registry import run_registry_demo

        return run_registry_demo(args)
    if args.command == "demo":
        from lakesink.cli.demo import run_demo

        return run_demo(args)
    if args.command == "broker":
        from lakesink.cli.broker import run_broker

        return run_broker(args)
    if args.command == "ingest":
        from lakesink.cli.ingest import run_ingest

        return run_ingest(load(args), once=args.once, debug=args.debug, standby=args.standby)
    if args.command == "status":
        from lakesink.cli.status import run_status

        if args.watch is not None and args.json:
            from lakesink.errors import ConfigError

            raise ConfigError("status: --watch and --json cannot be combined")
        return run_status(load(args), as_json=args.json, watch_s=args.watch)
    if args.command == "verify":
        from lakesink.cli.verify import run_verify

        return run_verify(load(args), as_json=args.json)
    if args.command == "config":
        if args.config_command == "docs":
            import shutil

            from lakesink.config import render_reference, render_terminal_reference

            width = min(120, shutil.get_terminal_size((100, 24)).columns)
            text = render_reference() if args.markdown else render_terminal_reference(width)
            sys.stdout.write(text)
            return 0
        cfg = load(args)
        for k, v in sorted(cfg.values.items()):
            print(f"{k} = {v!r}")
        return 0
    if args.command == "backfill":
        from lakesink.cli import table_commands

        return table_commands.run_backfill_command(args)
    if args.command == "table":
        from lakesink.cli import table_commands

        return table_commands.run(args)
    from lakesink.formats import plugin_with_command

    plugin = plugin_with_command(args.command)
    if plugin is None:
        raise AssertionError(args.command)
    return plugin.run_cli(args, load(args).settings)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from lakesink.kafka.security import LIBRDKAFKA_LOGGER

    # librdkafka retries a refused broker many times a second, logging each try: shown with
    # --debug only; the error that ends the command says what failed in one line.
    logging.getLogger(LIBRDKAFKA_LOGGER).setLevel(logging.DEBUG if args.debug else logging.CRITICAL)
    # py4j logs the stand-in error a failed batch raises to Spark, traceback and all; the
    # batch's own error is what the command reports. Its DEBUG level is the wire protocol:
    # every command sent to the JVM, the data-source options with their secrets among them.
    logging.getLogger("py4j").setLevel(logging.INFO if args.debug else logging.CRITICAL)
    try:
        return run(args)
    except LakesinkError as e:
        if args.debug:
            raise
        print(f"lakesink: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("lakesink: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
