"""`lakesink demo --registry`: a topic whose schema evolves, landing through a schema registry.

Starts the local broker and a local Apicurio Registry (the app scripts/setup-registry.sh caches,
on loopback, in-memory, BACKWARD compatibility: lakesink.kafka.registry_server), produces visits
framed by the registry in Avro version 1 and ingests them into a table created from the
registered schema; then registers three compatible versions (a new field, a new nested field, a
widened type), produces visits of each and ingests again: the batch's commit evolves the table.
The table is read back and audited. No value.schema anywhere: the registry says it all.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from lakesink.config import load_config
from lakesink.console import say
from lakesink.errors import MissingExtraError
from lakesink.formats import FORMAT_KEY, plugin_of

TOPIC = "demo-visits"

_ADDRESS = {"type": "record", "name": "Address", "fields": [{"name": "city", "type": "string"}]}
_V1: dict[str, Any] = {
    "type": "record",
    "name": "Visit",
    "namespace": "demo",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "visits", "type": "int"},
        {"name": "address", "type": _ADDRESS},
    ],
}
_COUNTRY = {"name": "country", "type": ["null", "string"], "default": None}
_ZIP = {"name": "zip", "type": ["null", "string"], "default": None}
VERSIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("version 1", _V1),
    ("version 2 adds the field country", {**_V1, "fields": [*_V1["fields"], _COUNTRY]}),
    (
        "version 3 adds the nested field address.zip",
        {
            **_V1,
            "fields": [
                *_V1["fields"][:2],
                {"name": "address", "type": {**_ADDRESS, "fields": [*_ADDRESS["fields"], _ZIP]}},
                _COUNTRY,
            ],
        },
    ),
    (
        "version 4 widens visits from int to long",
        {
            **_V1,
            "fields": [
                _V1["fields"][0],
                {"name": "visits", "type": "long"},
                {"name": "address", "type": {**_ADDRESS, "fields": [*_ADDRESS["fields"], _ZIP]}},
                _COUNTRY,
            ],
        },
    ),
)
CITIES = ("Oslo", "Bergen", "Lyon", "Porto")


def visit(i: int, version: int) -> dict[str, Any]:
    """Visit `i` as version `version` (1-4) of the schema writes it."""
    row: dict[str, Any] = {"id": i, "visits": i % 50, "address": {"city": CITIES[i % 4]}}
    if version >= 2:
        row["country"] = ("NO", "NO", "FR", "PT")[i % 4]
    if version >= 3:
        row["address"]["zip"] = f"{1000 + i % 9000}"
    if version >= 4:
        row["visits"] = 2**33 + i  # wider than an int
    return row


def run_registry_demo(args: argparse.Namespace) -> int:
    from lakesink.cli.demo import fresh_table, require_demo_format, say_iceberg_warehouse
    from lakesink.cli.ingest import ingest
    from lakesink.cli.verify import audit_config, print_report
    from lakesink.kafka.embedded_broker import EmbeddedBroker, noida_db_binary
    from lakesink.kafka.kafka_server import java_binary
    from lakesink.kafka.registry_server import SchemaRegistry, registry_app_dir

    iceberg = require_demo_format(args)
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext
    except ImportError as e:
        raise MissingExtraError(
            f"lakesink demo --registry needs confluent-kafka's registry client and Avro "
            f"serializer ({e.name} is not installed): pip install 'lakesink[registry]'"
        ) from e
    # fail in one line, before anything starts, when a piece is missing
    registry_app_dir()
    java_binary()
    noida_db_binary()
    table_path = fresh_table(
        Path(args.dir).resolve() / ("iceberg-registry" if iceberg else "registry_visits")
    )
    per_version = max(args.events // 40, 100)
    with tempfile.TemporaryDirectory(prefix="lakesink-registry-") as work, EmbeddedBroker() as b:
        bootstrap = b.bootstrap_servers
        say("lakesink demo: starting a local schema registry (Apicurio Registry) ...")
        registry = SchemaRegistry(Path(work))
        try:
            registry.start()
            say(f"lakesink demo: broker on {bootstrap}, schema registry at {registry.url}")
            from lakesink.kafka.client import create_topic
            from lakesink.kafka.producer import produce_values

            create_topic(bootstrap, TOPIC, args.partitions)
            client = SchemaRegistryClient({"url": registry.url})
            ctx = SerializationContext(TOPIC, MessageField.VALUE)

            def produce(version: int) -> None:
                label, schema = VERSIONS[version - 1]
                serialize = AvroSerializer(client, json.dumps(schema))
                first = (version - 1) * per_version
                ids = range(first, first + per_version)
                values = [serialize(visit(i, version), ctx) for i in ids]
                for p in range(args.partitions):
                    produce_values(bootstrap, TOPIC, values[p :: args.partitions], partition=p)
                say(f"lakesink demo: {label}: produced {per_version:,} visits")

            cfg = load_config(
                None,
                {
                    "kafka.bootstrap.servers": bootstrap,
                    "kafka.topics": TOPIC,
                    "value.format": "avro",
                    "schema.registry.url": registry.url,
                    "table.path": str(table_path),
                    "table.version": args.table_version,
                    "writer.id": "demo-registry-writer",
                    "lock.provider": "filesystem",
                    **({FORMAT_KEY: "iceberg", "table.name": "visits"} if iceberg else {}),
                },
            )
            produce(1)
            say("lakesink demo: ingesting; the table is created from the registered schema ...")
            _ingest(ingest, cfg, args.debug)
            _show_columns(cfg)
            for version in (2, 3, 4):
                produce(version)
            say("lakesink demo: ingesting again; the commit evolves the table ...")
            _ingest(ingest, cfg, args.debug)
            _show_columns(cfg)
            report = audit_config(cfg, spark=iceberg)
            print_report(cfg, report)
        finally:
            registry.stop()
    if iceberg:
        say_iceberg_warehouse(table_path, "visits")
    else:
        say(f"\nThe table is at {table_path}.")
    say(
        "Its schema followed the topic's: see the docs page Schemas for the rules per format "
        "and what each reader sees."
    )
    return 0 if report.ok else 10


def _ingest(ingest: Any, cfg: Any, debug: bool) -> None:
    result = ingest(cfg, once=True, debug=debug)
    assert result is not None  # None only for a standby
    say(
        f"lakesink demo: {result.records:,} records in {result.batches} commits, "
        f"{result.elapsed_s:.1f}s"
    )


def _show_columns(cfg: Any) -> None:
    rows, reader, _ = plugin_of(cfg.settings).read_back(cfg.settings)
    columns = [f for f in rows.schema if not f.name.startswith(("kafka_", "_hoodie_"))]
    say(f"{reader} reads {rows.num_rows:,} rows; columns:")
    for f in columns:
        say(f"  {f.name}: {f.type}")
    last = rows.sort_by([("id", "descending")]).slice(0, 1).select([f.name for f in columns])
    for r in last.to_pylist():
        say(f"  newest row: {r}")
