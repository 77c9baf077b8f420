"""Values framed by a real schema registry (Apicurio Registry on loopback, registry_fixture.py),
produced with confluent-kafka's serializers and ingested into Hudi tables through the real
pipeline: each value decoded with its own writer schema (Avro in two versions, JSON Schema,
Protobuf from its registered file descriptor), every record landing once (the audit)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import audit_config, ingest_config, run_ingestion
from integration.registry_fixture import SchemaRegistry

from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.kafka.client import create_topic
from lakesink.kafka.producer import produce_values

pytestmark = pytest.mark.integration
pytest_plugins = ["registry_fixture"]

COLUMNS_DDL = "id BIGINT NOT NULL, name STRING, country STRING"

CUSTOMER_V1 = {
    "type": "record",
    "name": "Customer",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
}
# the second version adds an optional field the table already has as a nullable column
CUSTOMER_V2 = {
    **CUSTOMER_V1,
    "fields": [
        *CUSTOMER_V1["fields"],
        {"name": "country", "type": ["null", "string"], "default": None},
    ],
}
# a third adds a field the table does not have: with schema.evolution off, its values are dead
# letters naming it
CUSTOMER_V3 = {
    **CUSTOMER_V2,
    "fields": [*CUSTOMER_V2["fields"], {"name": "tier", "type": "int", "default": 0}],
}


def _client(registry: SchemaRegistry) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": registry.url})


def _produce(
    bootstrap: str,
    topic: str,
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
) -> None:
    create_topic(bootstrap, topic, 1)
    produce_values(bootstrap, topic, values, keys=keys)


def _rows(cfg: Any, columns: Sequence[str] = ("id", "name", "country")) -> list[tuple[Any, ...]]:
    t = TableReader(HudiTable.open(cfg["table.path"])).snapshot(columns=list(columns))
    return sorted(zip(*(t.column(c).to_pylist() for c in columns), strict=True))


def _dead_letter_reasons(bootstrap: str, topic: str) -> list[str]:
    """The reason header of every record in dead-letter topic `topic`."""
    from lakesink.kafka.client import watermarks
    from lakesink.kafka.dead_letters import ERROR_HEADER
    from lakesink.kafka.deserializers import RawDeserializer
    from lakesink.kafka.reader import read_range
    from lakesink.protocol.offsets import OffsetRange, TopicPartition

    tp = TopicPartition(topic, 0)
    low, high = watermarks(bootstrap, [tp], "read_committed")[tp]
    out = []
    for batch in read_range(bootstrap, OffsetRange(tp, low, high), deserializer=RawDeserializer()):
        for headers in batch.column("kafka_headers").to_pylist():
            out += [e["value"].decode() for e in headers or [] if e["key"] == ERROR_HEADER]
    return out


def _config(bootstrap: str, topic: str, table: Path, registry: SchemaRegistry, **more: Any) -> Any:
    return ingest_config(
        bootstrap,
        topic,
        table,
        schema__registry__url=registry.url,
        schema__registry__retry__s=10,
        **more,
    )


def test_avro_writer_versions_resolve_to_the_table_and_every_record_lands_once(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    schema_registry: SchemaRegistry,
) -> None:
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic, dlq = topic_factory("avro"), topic_factory("dlq")
    ctx = SerializationContext(topic, MessageField.VALUE)
    client = _client(schema_registry)
    v1, v2, v3 = (
        AvroSerializer(client, json.dumps(s)) for s in (CUSTOMER_V1, CUSTOMER_V2, CUSTOMER_V3)
    )
    values = [v1({"id": i, "name": f"n{i}"}, ctx) for i in range(6)]
    values += [v2({"id": i, "name": f"n{i}", "country": "NO"}, ctx) for i in range(6, 12)]
    values.append(v3({"id": 12, "name": "n12", "country": "SE", "tier": 2}, ctx))
    # an id the registry never gave out: a dead letter too, never a silent drop
    values.append(b"\x00" + (999_999).to_bytes(4, "big") + values[0][5:])
    _produce(kafka_bootstrap, topic, values)
    create_topic(kafka_bootstrap, dlq, 1)
    # the registry kept the versions under the topic's subject (BACKWARD allowed each)
    assert f"{topic}-value" in schema_registry.subjects()

    cfg = _config(
        kafka_bootstrap,
        topic,
        tmp_path / "avro",
        schema_registry,
        value__format="avro",
        value__schema=json.dumps(CUSTOMER_V2),
        schema__evolution="off",
        errors__tolerance="all",
        errors__deadletter__topic=dlq,
    )
    run_ingestion(cfg, spark)
    assert _rows(cfg) == [(i, f"n{i}", None) for i in range(6)] + [
        (i, f"n{i}", "NO") for i in range(6, 12)
    ]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert (report.rows_hudi_rs, report.dead_letters) == (12, 2)
    reasons = sorted(_dead_letter_reasons(kafka_bootstrap, dlq))
    assert "field 'tier'" in reasons[0] and "schema id 999999 is not in the registry" in reasons[1]


def test_json_schema_and_protobuf_topics_ingest_through_the_registry(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    schema_registry: SchemaRegistry,
) -> None:
    """The keys too, in the value's format (key.format): JSON Schema keys under `<topic>-key`,
    Protobuf keys (and values) under the topic-record strategy, `<topic>-<record name>`; the
    key's region field lands as a column."""
    from confluent_kafka.schema_registry import topic_record_subject_name_strategy
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    client = _client(schema_registry)
    json_topic, proto_topic = topic_factory("jsonschema"), topic_factory("protobuf")

    def region(i: int) -> str:
        return "eu" if i % 3 else "us"

    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string"},
            "country": {"type": ["string", "null"]},
        },
        "required": ["id", "name"],
    }
    to_json = JSONSerializer(json.dumps(schema), client)
    ctx = SerializationContext(json_topic, MessageField.VALUE)
    key_schema = {
        "type": "object",
        "properties": {"region": {"type": "string"}},
        "required": ["region"],
    }
    json_key = JSONSerializer(json.dumps(key_schema), client)
    key_ctx = SerializationContext(json_topic, MessageField.KEY)
    _produce(
        kafka_bootstrap,
        json_topic,
        [
            to_json({"id": i, "name": f"j{i}", "country": "FI" if i % 2 else None}, ctx)
            for i in range(8)
        ],
        [json_key({"region": region(i)}, key_ctx) for i in range(8)],
    )

    # a message type built at run time (no generated code); lakesink decodes it from the
    # file descriptor the serializer registered
    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name=f"lakesink_it_{uuid.uuid4().hex}.proto", package="shop", syntax="proto3"
    )
    msg = fdp.message_type.add(name="Customer")
    msg.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    msg.field.add(name="name", number=2, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    key_msg = fdp.message_type.add(name="CustomerKey")
    key_msg.field.add(name="region", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    customer = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Customer"))
    customer_key = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.CustomerKey"))
    by_record = {
        "use.deprecated.format": False,
        "subject.name.strategy": topic_record_subject_name_strategy,
    }
    to_proto = ProtobufSerializer(customer, client, by_record)
    proto_key = ProtobufSerializer(customer_key, client, by_record)
    ctx = SerializationContext(proto_topic, MessageField.VALUE)
    key_ctx = SerializationContext(proto_topic, MessageField.KEY)
    _produce(
        kafka_bootstrap,
        proto_topic,
        [to_proto(customer(id=i, name=f"p{i}"), ctx) for i in range(8)],
        [proto_key(customer_key(region=region(i)), key_ctx) for i in range(8)],
    )
    proto_subjects = {
        "schema__registry__subject__strategy": "topic-record",
        "schema__registry__record__name": "shop.Customer",
        "schema__registry__key__record__name": "shop.CustomerKey",
    }

    for topic, fmt, expected, more in (
        (
            json_topic,
            "jsonschema",
            [(i, f"j{i}", "FI" if i % 2 else None, region(i)) for i in range(8)],
            {},
        ),
        (
            proto_topic,
            "protobuf",
            [(i, f"p{i}", None, region(i)) for i in range(8)],
            proto_subjects,
        ),
    ):
        cfg = _config(
            kafka_bootstrap,
            topic,
            tmp_path / fmt,
            schema_registry,
            value__format=fmt,
            value__schema=COLUMNS_DDL,
            key__format=fmt,
            **more,
        )
        run_ingestion(cfg, spark)
        assert _rows(cfg, ("id", "name", "country", "region")) == expected, fmt
        report = audit_config(cfg)
        assert report.ok, (fmt, report.problems)
        assert report.rows_hudi_rs == 8, fmt


# a topic whose writer schema changes three times: a field added, a nested field added, int→long
EVOLVING_V1 = {
    "type": "record",
    "name": "Visit",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "visits", "type": "int"},
        {
            "name": "address",
            "type": {
                "type": "record",
                "name": "Address",
                "fields": [{"name": "city", "type": "string"}],
            },
        },
    ],
}
EVOLVING_V2 = {
    **EVOLVING_V1,
    "fields": [
        *EVOLVING_V1["fields"],
        {"name": "country", "type": ["null", "string"], "default": None},
    ],
}
EVOLVING_V3 = {
    **EVOLVING_V2,
    "fields": [
        EVOLVING_V2["fields"][0],
        EVOLVING_V2["fields"][1],
        {
            "name": "address",
            "type": {
                "type": "record",
                "name": "Address",
                "fields": [
                    {"name": "city", "type": "string"},
                    {"name": "zip", "type": ["null", "string"], "default": None},
                ],
            },
        },
        EVOLVING_V2["fields"][3],
    ],
}
EVOLVING_V4 = {
    **EVOLVING_V3,
    "fields": [
        EVOLVING_V3["fields"][0],
        {"name": "visits", "type": "long"},
        *EVOLVING_V3["fields"][2:],
    ],
}


VISIT_KEY = {
    "type": "record",
    "name": "VisitKey",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "region", "type": "string"}],
}


def _region(i: int) -> str:
    return "eu" if i % 2 else "us"


def _visit(i: int, version: int) -> dict[str, Any]:
    row: dict[str, Any] = {"id": i, "visits": i, "address": {"city": f"c{i % 3}"}}
    if version >= 2:
        row["country"] = "NO"
    if version >= 3:
        row["address"]["zip"] = f"z{i}"
    if version >= 4:
        row["visits"] = i + 2**40  # only a long holds it
    return row


@pytest.mark.parametrize("table_format", ["hudi", "iceberg"])
def test_registry_schema_versions_create_and_evolve_the_table(
    table_format: str,
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    schema_registry: SchemaRegistry,
) -> None:
    """No value.schema: the table is created from the subject's schema; versions registered
    after an ingestion fixed its columns are taken in by that ingestion (its query started
    again over evolved columns, the id noted in the checkpoint), evolving the table in its
    batch's commit; the Avro keys' region field lands as a column (key.format); every record
    once, and the readers agree: hudi-rs and lakesink's reader on a Hudi table; pyiceberg and
    DuckDB on an Iceberg table (one schema more, the evolution's). schema.field.mapping renames
    a field of the created table, a nested one, one a later version adds and the key's field:
    every reader sees the column names; the Iceberg table's name mapping lists the source
    names beside them, the evolved field's too."""
    import pyarrow as pa
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from lakesink.engine.evolution import concat_unified
    from lakesink.formats.hudi.audit import hudi_rs_batches
    from lakesink.spark.pipeline import Ingestion
    from lakesink.spark.registry_columns import noted_writer_ids

    topic = topic_factory("evolving")
    ctx = SerializationContext(topic, MessageField.VALUE)
    client = _client(schema_registry)
    # Avro keys under <topic>-key (key.format=avro): their region field is a column too
    key_ctx = SerializationContext(topic, MessageField.KEY)
    key_of = AvroSerializer(client, json.dumps(VISIT_KEY))

    def keys(ids: range) -> list[bytes | None]:
        return [key_of({"id": i, "region": _region(i)}, key_ctx) for i in ids]

    v1, v2, v3, v4 = (
        AvroSerializer(client, json.dumps(s))
        for s in (EVOLVING_V1, EVOLVING_V2, EVOLVING_V3, EVOLVING_V4)
    )
    cfg = _config(
        kafka_bootstrap,
        topic,
        tmp_path / "evolving",
        schema_registry,
        value__format="avro",
        value__schema=None,
        key__format="avro",
        schema__field__mapping=(
            "visits=visit_count,address.city=town,country=country_code,region=visit_region"
        ),
        **(
            {"table__format": "iceberg", "table__name": "visits"}
            if table_format == "iceberg"
            else {}
        ),
    )
    create_topic(kafka_bootstrap, topic, 1)
    produce_values(
        kafka_bootstrap, topic, [v1(_visit(i, 1), ctx) for i in range(4)], keys=keys(range(4))
    )
    assert run_ingestion(cfg, spark).records == 4
    # three versions registered after the ingestion fixed its columns (a field, a nested field,
    # a widened type): its first batch fails on the first new id, which is noted, and the query
    # starts again over columns that take them all in; one evolving commit
    running = Ingestion(cfg, spark)
    assert "country" not in running.cfg["value.schema"]
    for version, v, ids in ((2, v2, range(4, 7)), (3, v3, range(7, 10)), (4, v4, range(10, 13))):
        values = [v(_visit(i, version), ctx) for i in ids]
        produce_values(kafka_bootstrap, topic, values, keys=keys(ids))
    assert running.run(once=True, timeout_s=120).records == 9
    assert noted_writer_ids(cfg) == [client.get_version(f"{topic}-value", 2).schema_id]

    report = audit_config(cfg)
    assert report.ok, report.problems
    found = report.to_json()
    cols = ["id", "visit_count", "address", "country_code", "visit_region"]
    if table_format == "iceberg":
        from lakesink.formats.iceberg.audit import read_with_duckdb
        from lakesink.formats.iceberg.format import open_iceberg_table

        # pyiceberg and DuckDB read the 13 records
        assert found["kafka_records"] == 13, found
        assert found["readers"] == {"pyiceberg": 13, "duckdb": 13}, found
        opened = open_iceberg_table(cfg.settings, create=False)
        table = opened.pyiceberg
        ours = table.scan(selected_fields=tuple(cols)).to_arrow()
        # one schema for the created table, one for the commit that evolved it
        assert len(table.metadata.schemas) == 2, table.metadata.schemas
        duck = read_with_duckdb(opened, cols, [])
        assert duck is not None
        assert sorted(duck.to_pylist(), key=str) == sorted(ours.to_pylist(), key=str)
        mapping = json.loads(table.properties["schema.name-mapping.default"])
        names = {e["names"][0]: e for e in mapping}
        assert names["visit_count"]["names"] == ["visit_count", "visits"]
        assert names["country_code"]["names"] == ["country_code", "country"]  # the evolved one
        assert names["visit_region"]["names"] == ["visit_region", "region"]
        town = {f["names"][0]: f["names"] for f in names["address"]["fields"]}["town"]
        assert town == ["town", "city"]
        by_name = table.schema().find_field
        assert names["country_code"]["field-id"] == by_name("country_code").field_id
        # required in the registered record, under a required parent: required in the table
        assert by_name("address.town").required and not by_name("address.zip").required
    else:
        counts = {k: found[k] for k in ("rows_hudi_rs", "rows_lakesink", "kafka_records")}
        assert set(counts.values()) == {13}, counts
        ours = TableReader(HudiTable.open(cfg["table.path"])).snapshot(columns=cols)
    assert ours.schema.field("visit_count").type == pa.int64()
    by_id = {r["id"]: r for r in ours.to_pylist()}
    assert sorted(by_id) == list(range(13))
    for i in range(13):
        version = 1 if i < 4 else 2 if i < 7 else 3 if i < 10 else 4
        source = _visit(i, version)
        want = {
            "id": i,
            "visit_count": source["visits"],
            "address": {"town": source["address"]["city"], "zip": source["address"].get("zip")},
            "country_code": source.get("country"),
            "visit_region": _region(i),
        }
        assert by_id[i] == want, i
    if table_format == "iceberg":
        return
    theirs = concat_unified(hudi_rs_batches(str(cfg["table.path"])))
    assert sorted(theirs.select(cols).to_pylist(), key=str) == sorted(
        ours.select(cols).to_pylist(), key=str
    )


# A Debezium envelope as its Avro converter registers it (abridged: the converter adds the
# source's other fields and `transaction`)
_ROW = {
    "type": "record",
    "name": "Value",
    "namespace": "shop.public.accounts",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "owner", "type": ["null", "string"], "default": None},
    ],
}
ENVELOPE = {
    "type": "record",
    "name": "Envelope",
    "namespace": "shop.public.accounts",
    "fields": [
        {"name": "before", "type": ["null", _ROW], "default": None},
        {"name": "after", "type": ["null", "shop.public.accounts.Value"], "default": None},
        {
            "name": "source",
            "type": {
                "type": "record",
                "name": "Source",
                "namespace": "io.debezium.connector.postgresql",
                "fields": [
                    {"name": "connector", "type": "string"},
                    {"name": "ts_ms", "type": "long"},
                    {"name": "lsn", "type": ["null", "long"], "default": None},
                ],
            },
        },
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}


def test_debezium_avro_envelopes_through_the_registry_land_as_current_state(
    spark: Any,
    kafka_bootstrap: str,
    topic_factory: Callable[[str], str],
    tmp_path: Path,
    schema_registry: SchemaRegistry,
) -> None:
    """write.operation=cdc without value.schema: the row is the registered envelope's `after`,
    each change decoded by its id; deletes remove, the tombstone is skipped, an unknown id is a
    dead letter; hudi-rs and lakesink's reader hold the fold of the changes."""
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic, dlq = topic_factory("cdc-avro"), topic_factory("cdc-dlq")
    ctx = SerializationContext(topic, MessageField.VALUE)
    serialize = AvroSerializer(_client(schema_registry), json.dumps(ENVELOPE))

    def change(lsn: int, op: str, row: dict[str, Any]) -> bytes:
        side = "before" if op == "d" else "after"
        source = {"connector": "postgresql", "ts_ms": lsn, "lsn": lsn}
        out = serialize({"before": None, "after": None, side: row, "source": source, "op": op}, ctx)
        assert out is not None
        return bytes(out)

    first = change(10, "c", {"id": 1, "owner": "ada"})
    values: list[bytes | None] = [
        first,
        change(20, "c", {"id": 2, "owner": "bob"}),
        change(30, "u", {"id": 1, "owner": "ada lovelace"}),
        change(40, "d", {"id": 2, "owner": None}),
        None,  # the tombstone Debezium sends after a delete
        change(50, "c", {"id": 3, "owner": "cy"}),
    ]
    values.append(b"\x00" + (999_998).to_bytes(4, "big") + first[5:])  # an id never given out
    _produce(kafka_bootstrap, topic, values)
    create_topic(kafka_bootstrap, dlq, 1)
    cfg = _config(
        kafka_bootstrap,
        topic,
        tmp_path / "accounts",
        schema_registry,
        value__format="avro",
        value__schema=None,
        write__operation="cdc",
        table__record__key__fields="id",
        table__bucket__count=1,
        errors__tolerance="all",
        errors__deadletter__topic=dlq,
    )
    run_ingestion(cfg, spark)
    t = TableReader(HudiTable.open(cfg["table.path"])).snapshot(columns=["id", "owner"])
    assert sorted(zip(*(t.column(c).to_pylist() for c in ("id", "owner")), strict=True)) == [
        (1, "ada lovelace"),
        (3, "cy"),
    ]
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert (report.keys, report.rows_hudi_rs, report.dead_letters) == (2, 2, 1)
    (reason,) = _dead_letter_reasons(kafka_bootstrap, dlq)
    assert "schema id 999998 is not in the registry" in reason
