"""`lakesink demo`: the whole story on embedded defaults, on one machine, in one command.

Starts a local Kafka-protocol broker (noida-db), creates a topic, produces sample events,
ingests them exactly once with Spark into a Hudi table under ./lakehouse/, reads the table back
with hudi-rs, and prints a summary and the exactly-once audit. `--format iceberg` ingests into
an Iceberg table instead (the warehouse ./lakehouse/iceberg with its SQLite catalog, the table
`lakesink.demo_events`), reads it back with pyiceberg and audits it with pyiceberg, DuckDB and
Spark (Iceberg's Java runtime, where scripts/setup-iceberg-reader.sh built its environment).

The sample events are produced without transactions (an idempotent producer) and ingested into
a new table from offset 0: noida-db 0.2.3 returns no committed records under read_committed to a
consumer starting mid-log after an aborted transaction, and the demo never creates one
(docs/kafka-brokers.md lists what lakesink relies on from a broker).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from lakesink.config import LakesinkConfig, load_config
from lakesink.console import say, table
from lakesink.extras import require
from lakesink.formats import FORMAT_KEY, plugin_of

if TYPE_CHECKING:
    import pyarrow as pa


def run_demo(args: argparse.Namespace) -> int:
    from lakesink.cli.ingest import ingest
    from lakesink.cli.verify import audit_config, print_report
    from lakesink.kafka.embedded_broker import EmbeddedBroker, noida_db_binary
    from lakesink.kafka.producer import SAMPLE_EVENT_DDL, produce_sample_events

    if getattr(args, "cdc", False):
        return run_cdc_demo(args)
    iceberg = require_demo_format(args)
    noida_db_binary()  # the embedded broker: fail before anything starts when it is missing
    table_path = fresh_table(Path(args.dir).resolve() / ("iceberg" if iceberg else "demo_events"))
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        say(
            f"lakesink demo: broker on {bootstrap}; producing {args.events:,} events "
            f"to topic 'demo-events' ({args.partitions} partitions) ..."
        )
        t0 = time.monotonic()
        counts = produce_sample_events(bootstrap, "demo-events", args.events, args.partitions)
        say(
            f"lakesink demo: produced {sum(counts.values()):,} events "
            f"in {time.monotonic() - t0:.1f}s"
        )
        # the environment's LAKESINK_* settings apply (e.g. spark.start.cache.dir); the demo's
        # own broker, topic and table win over them
        cfg = load_config(
            None,
            {
                "kafka.bootstrap.servers": bootstrap,
                "kafka.topics": "demo-events",
                "value.format": "json",
                "value.schema": SAMPLE_EVENT_DDL,
                "table.path": str(table_path),
                "table.version": args.table_version,
                "table.partition.date.from": "ts",
                "kafka.max.records.per.batch": max(args.events // 4, 1000),
                "writer.id": "demo-writer",
                "lock.provider": "filesystem",
                **({FORMAT_KEY: "iceberg", "table.name": "demo_events"} if iceberg else {}),
            },
        )
        say(f"lakesink demo: ingesting with Spark {cfg['spark.master']} into {table_path} ...")
        result = ingest(cfg, once=True, debug=args.debug)
        assert result is not None  # None only for a standby
        rate = result.records / result.elapsed_s if result.elapsed_s else 0.0
        say(
            f"lakesink demo: {result.records:,} records in {result.batches} commits, "
            f"{result.elapsed_s:.1f}s from start ({rate:,.0f} records/s); first commit after "
            f"{result.first_commit_s or 0:.1f}s"
        )
        show_table(cfg)
        report = audit_config(cfg, spark=True)
        print_report(cfg, report)
    if iceberg:
        say_iceberg_warehouse(table_path, "demo_events")
        return 0 if report.ok else 10
    say(
        f"\nThe table is at {table_path}. Read it with hudi-rs:\n"
        f'  python -c "import hudi; '
        f"t = hudi.HudiTableBuilder.from_base_uri('{table_path}').build(); "
        f'print(sum(b.num_rows for b in t.read()))"'
    )
    return 0 if report.ok else 10


def say_iceberg_warehouse(table_path: Path, table_name: str) -> None:
    """Where a demo's Iceberg warehouse is and how to read its table `lakesink.<table_name>`."""
    say(
        f"\nThe Iceberg warehouse is at {table_path} (SQLite catalog {table_path}/catalog.db). "
        "Read it with pyiceberg:\n"
        f'  python -c "from pyiceberg.catalog.sql import SqlCatalog; '
        f"c = SqlCatalog('lakesink', uri='sqlite:///{table_path}/catalog.db', "
        f"warehouse='file://{table_path}'); "
        f"print(c.load_table('lakesink.{table_name}').scan().to_arrow().num_rows)\"\n"
        "Spark, Trino and DuckDB: 'Reading with other engines' on the docs page "
        "'Apache Iceberg tables'"
    )


def fresh_table(table_path: Path) -> Path:
    """`table_path` with the previous demo's table gone; says that the broker starts next."""
    if table_path.exists():
        say(f"lakesink demo: removing the previous demo table {table_path}")
        shutil.rmtree(table_path)
    say("lakesink demo: starting a local Kafka-protocol broker (noida-db) ...")
    return table_path


def show_table(cfg: LakesinkConfig) -> None:
    rows, reader, what = plugin_of(cfg.settings).read_back(cfg.settings)
    say(f"\n{reader} reads {rows.num_rows:,} rows{what}")
    summarize(rows, reader)


def summarize(t: pa.Table, reader: str) -> None:
    """Events and amounts per date partition (when the table has one) and event type."""
    import pyarrow.compute as pc

    keys = [k for k in ("dt", "event_type") if k in t.column_names]
    grouped = t.group_by(keys).aggregate([("amount", "sum"), ("event_id", "count")])
    grouped = grouped.sort_by([(k, "ascending") for k in keys])
    rows = [
        [*(r[k] for k in keys), r["event_id_count"], f"{r['amount_sum']:,.2f}"]
        for r in grouped.to_pylist()[:12]
    ]
    say(f"per {' and '.join(keys)} ({reader}):")
    say(table([*keys, "events", "amount"], rows))
    sample = t.sort_by([("kafka_partition", "ascending"), ("kafka_offset", "ascending")]).slice(
        0, 3
    )
    say("\nfirst rows:")
    for r in sample.select(
        ["kafka_partition", "kafka_offset", "event_id", "event_type", "amount", "ts"]
    ).to_pylist():
        say(f"  {r}")
    _ = pc  # pyarrow.compute registers group_by kernels


CDC_ACCOUNTS = 1_000


def require_demo_format(args: argparse.Namespace) -> bool:
    """Whether a demo writes an Iceberg table (`--format iceberg`), after checking that the
    extra it reads the table back with is installed (MissingExtraError naming it otherwise)."""
    iceberg = getattr(args, "format", "hudi") == "iceberg"
    if iceberg:
        require("pyiceberg", "lakesink demo --format iceberg (it writes an Iceberg table)")
    else:
        require("hudi", "lakesink demo (it reads the table back with hudi-rs)")
    return bool(iceberg)


def run_cdc_demo(args: argparse.Namespace) -> int:
    """`lakesink demo --cdc`: a Debezium-shaped change stream of an `accounts` table (made up by
    lakesink.kafka.sample_changes: no database needed) ingested with write.operation=cdc into a
    Hudi table keyed by `id` (`--format iceberg`: an Iceberg table of keys, `lakesink.accounts`
    in the warehouse ./lakehouse/iceberg-cdc); the table is compared with the rows the changes
    leave, then the fold audit runs (the table equals the fold of the committed records by
    key)."""
    from lakesink.cli.ingest import ingest
    from lakesink.cli.verify import audit_config, print_report
    from lakesink.kafka.embedded_broker import EmbeddedBroker, noida_db_binary
    from lakesink.kafka.sample_changes import ACCOUNTS_DDL, produce_sample_changes

    iceberg = require_demo_format(args)
    noida_db_binary()
    table_path = fresh_table(Path(args.dir).resolve() / ("iceberg-cdc" if iceberg else "accounts"))
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        stream = produce_sample_changes(
            bootstrap, "bank.public.accounts", CDC_ACCOUNTS, args.changes, args.partitions
        )
        counts = stream.counts
        say(
            f"lakesink demo: produced {len(stream.records):,} change events of "
            f"{CDC_ACCOUNTS:,} accounts to 'bank.public.accounts': {counts['c']:,} creates, "
            f"{counts['u']:,} updates, {counts['d']:,} deletes and their tombstones"
        )
        cfg = load_config(
            None,
            {
                "kafka.bootstrap.servers": bootstrap,
                "kafka.topics": "bank.public.accounts",
                "value.format": "json",
                "value.schema": ACCOUNTS_DDL,
                "write.operation": "cdc",
                "table.record.key.fields": "id",
                "table.bucket.count": 4,
                "table.path": str(table_path),
                "table.version": args.table_version,
                "kafka.max.records.per.batch": max(len(stream.records) // 4, 1000),
                "writer.id": "demo-cdc-writer",
                "lock.provider": "filesystem",
                **({FORMAT_KEY: "iceberg", "table.name": "accounts"} if iceberg else {}),
            },
        )
        say(f"lakesink demo: ingesting with Spark {cfg['spark.master']} into {table_path} ...")
        result = ingest(cfg, once=True, debug=args.debug)
        assert result is not None  # None only for a standby
        say(
            f"lakesink demo: {result.records:,} changes applied in {result.batches} commits, "
            f"{result.elapsed_s:.1f}s from start (tombstones carry no change)"
        )
        rows, reader, _ = plugin_of(cfg.settings).read_back(cfg.settings)
        got = {r["id"]: r for r in rows.to_pylist()}
        columns = ("owner", "balance", "updated_at")
        differ = [
            k
            for k in stream.rows.keys() | got.keys()
            if k not in got
            or k not in stream.rows
            or any(got[k][c] != stream.rows[k][c] for c in columns)
        ]
        say(
            f"\n{reader} reads {len(got):,} accounts; the change stream leaves "
            f"{len(stream.rows):,}; accounts that differ: {len(differ):,}"
        )
        for key in sorted(got)[:3]:
            say(f"  {{{', '.join(f'{c}: {got[key][c]}' for c in ('id', *columns))}}}")
        report = audit_config(cfg, spark=iceberg)  # Spark with Iceberg's runtime reads it too
        print_report(cfg, report)
    if iceberg:
        say(
            f"\nThe Iceberg warehouse is at {table_path} (SQLite catalog {table_path}/catalog.db), "
            "one row per account in lakesink.accounts. Read it with pyiceberg:\n"
            f'  python -c "from pyiceberg.catalog.sql import SqlCatalog; '
            f"c = SqlCatalog('lakesink', uri='sqlite:///{table_path}/catalog.db', "
            f"warehouse='file://{table_path}'); "
            f"print(c.load_table('lakesink.accounts').scan().to_arrow().num_rows)\"\n"
        )
        return 0 if report.ok and not differ else 10
    say(
        f"\nThe table is at {table_path}, one row per account. Read it with hudi-rs:\n"
        f'  python -c "import hudi; '
        f"t = hudi.HudiTableBuilder.from_base_uri('{table_path}').build(); "
        f'print(sum(b.num_rows for b in t.read()))"'
    )
    return 0 if report.ok and not differ else 10
