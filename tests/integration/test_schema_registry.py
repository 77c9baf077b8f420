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
# a third adds a field the table does not have: its values are dead letters naming it
CUSTOMER_V3 = {
    **CUSTOMER_V2,
    "fields": [*CUSTOMER_V2["fields"], {"name": "tier", "type": "int", "default": 0}],
}


def _client(registry: SchemaRegistry) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": registry.url})


def _produce(bootstrap: str, topic: str, values: Sequence[bytes | None]) -> None:
    create_topic(bootstrap, topic, 1)
    produce_values(bootstrap, topic, values)


def _rows(cfg: Any) -> list[tuple[Any, ...]]:
    t = TableReader(HudiTable.open(cfg["table.path"])).snapshot(columns=["id", "name", "country"])
    return sorted(zip(*(t.column(c).to_pylist() for c in ("id", "name", "country")), strict=True))


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
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    client = _client(schema_registry)
    json_topic, proto_topic = topic_factory("jsonschema"), topic_factory("protobuf")

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
    _produce(
        kafka_bootstrap,
        json_topic,
        [
            to_json({"id": i, "name": f"j{i}", "country": "FI" if i % 2 else None}, ctx)
            for i in range(8)
        ],
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
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    customer = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Customer"))
    to_proto = ProtobufSerializer(customer, client, {"use.deprecated.format": False})
    ctx = SerializationContext(proto_topic, MessageField.VALUE)
    _produce(
        kafka_bootstrap,
        proto_topic,
        [to_proto(customer(id=i, name=f"p{i}"), ctx) for i in range(8)],
    )

    for topic, fmt, expected in (
        (json_topic, "jsonschema", [(i, f"j{i}", "FI" if i % 2 else None) for i in range(8)]),
        (proto_topic, "protobuf", [(i, f"p{i}", None) for i in range(8)]),
    ):
        cfg = _config(
            kafka_bootstrap,
            topic,
            tmp_path / fmt,
            schema_registry,
            value__format=fmt,
            value__schema=COLUMNS_DDL,
        )
        run_ingestion(cfg, spark)
        assert _rows(cfg) == expected, fmt
        report = audit_config(cfg)
        assert report.ok, (fmt, report.problems)
        assert report.rows_hudi_rs == 8, fmt
