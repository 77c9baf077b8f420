"""`lakesink demo`: the whole story on embedded defaults, on one machine, in one command.

Starts a local Kafka-protocol broker (noida-db), creates a topic, produces sample events,
ingests them exactly once with Spark into a Hudi table under ./lakehouse/, reads the table back
with hudi-rs, and prints a summary and the exactly-once audit.

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

from lakesink.cli.output import say, table
from lakesink.config import build_config
from lakesink.extras import require


def run_demo(args: argparse.Namespace) -> int:
    from lakesink.cli.ingest import ingest
    from lakesink.cli.verify import audit_config, print_report
    from lakesink.kafka.embedded_broker import EmbeddedBroker, noida_db_binary
    from lakesink.kafka.producer import SAMPLE_EVENT_DDL, produce_sample_events

    require("hudi", "lakesink demo (it reads the table back with hudi-rs)")
    noida_db_binary()  # the embedded broker: fail before anything starts when it is missing
    table_path = Path(args.dir).resolve() / "demo_events"
    if table_path.exists():
        say(f"lakesink demo: removing the previous demo table {table_path}")
        shutil.rmtree(table_path)
    say("lakesink demo: starting a local Kafka-protocol broker (noida-db) ...")
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
        cfg = build_config(
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
            }
        )
        say(f"lakesink demo: ingesting with Spark {cfg['spark.master']} into {table_path} ...")
        result = ingest(cfg, once=True, debug=args.debug)
        rate = result.records / result.elapsed_s if result.elapsed_s else 0.0
        say(
            f"lakesink demo: {result.records:,} records in {result.batches} commits, "
            f"{result.elapsed_s:.1f}s from start ({rate:,.0f} records/s); first commit after "
            f"{result.first_commit_s or 0:.1f}s"
        )
        show_table(str(table_path))
        report = audit_config(cfg)
        print_report(report)
    say(
        f"\nThe table is at {table_path}. Read it with hudi-rs:\n"
        f'  python -c "import hudi; '
        f"t = hudi.HudiTableBuilder.from_base_uri('{table_path}').build(); "
        f'print(sum(b.num_rows for b in t.read()))"'
    )
    return 0 if report.ok else 10


def show_table(path: str) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    hudi = require("hudi", "lakesink demo (it reads the table back with hudi-rs)")
    t = pa.Table.from_batches(hudi.HudiTableBuilder.from_base_uri(path).build().read())
    say(f"\nhudi-rs reads {t.num_rows:,} rows; per date partition and event type:")
    grouped = t.group_by(["dt", "event_type"]).aggregate([("amount", "sum"), ("event_id", "count")])
    grouped = grouped.sort_by([("dt", "ascending"), ("event_type", "ascending")])
    rows = [
        [r["dt"], r["event_type"], r["event_id_count"], f"{r['amount_sum']:,.2f}"]
        for r in grouped.to_pylist()[:12]
    ]
    say(table(["dt", "event_type", "events", "amount"], rows))
    sample = t.sort_by([("kafka_partition", "ascending"), ("kafka_offset", "ascending")]).slice(
        0, 3
    )
    say("\nfirst rows:")
    for r in sample.select(
        ["kafka_partition", "kafka_offset", "event_id", "event_type", "amount", "ts"]
    ).to_pylist():
        say(f"  {r}")
    _ = pc  # pyarrow.compute registers group_by kernels
