"""Registry-driven columns (lakesink.spark.registry_columns, kafka.registry_schemas and
kafka.registry_subjects) against confluent-kafka's mock registry: a run's columns from the
latest registered version (one request at start), the table created from it, older versions
decoded by id, and what a writer schema the run's columns lack does under each
schema.evolution."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2

from lakesink.config import build_config
from lakesink.config.records import registry_settings
from lakesink.errors import ConfigError, SchemaEvolutionError
from lakesink.kafka import registry
from lakesink.kafka.ddl import ddl_to_arrow
from lakesink.kafka.registry import RegistryDeserializer, RegistrySettings, registry_client
from lakesink.kafka.registry_schemas import json_schema_columns, uncovered
from lakesink.kafka.registry_subjects import subject_versions, writer_columns
from lakesink.spark.registry_columns import (
    note_writer_schema,
    noted_writer_ids,
    pin_registry_columns,
    registry_columns,
)
from lakesink.spark.source import value_deserializer

TOPIC = "customers"
V1: dict[str, Any] = {
    "type": "record",
    "name": "Customer",
    "fields": [{"name": "id", "type": "long"}, {"name": "visits", "type": "int"}],
}
V2 = {
    **V1,
    "fields": [*V1["fields"], {"name": "country", "type": ["null", "string"], "default": None}],
}
ADDRESS = {
    "type": "record",
    "name": "Address",
    "fields": [{"name": "city", "type": "string"}],
}
ADDRESS_ZIP = {
    **ADDRESS,
    "fields": [*ADDRESS["fields"], {"name": "zip", "type": ["null", "string"], "default": None}],
}
V3 = {
    **V2,
    "fields": [*V2["fields"], {"name": "address", "type": ["null", ADDRESS], "default": None}],
}
V3_ZIP = {
    **V3,
    "fields": [*V2["fields"], {"name": "address", "type": ["null", ADDRESS_ZIP], "default": None}],
}
V4 = {
    **V3_ZIP,
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "visits", "type": "long"},  # widened from int
        *V3_ZIP["fields"][2:],
    ],
}


def _url() -> str:
    return f"mock://{uuid.uuid4().hex}"


def _register(url: str, *schemas: dict[str, Any], topic: str = TOPIC) -> None:
    client = registry_client(RegistrySettings(url=url, retry_s=1))
    for s in schemas:
        client.register_schema(f"{topic}-value", Schema(json.dumps(s), "AVRO"))


def _config(url: str, **values: Any) -> Any:
    raw: dict[str, Any] = {
        "kafka.bootstrap.servers": "localhost:9092",
        "kafka.topics": TOPIC,
        "table.path": "/t",
        "value.format": "avro",
        "schema.registry.url": url,
        "schema.registry.retry.s": 1,
    }
    raw.update(values)
    return build_config(raw)


def _serialize(url: str, schema: dict[str, Any], value: dict[str, Any]) -> bytes:
    settings = RegistrySettings(url=url, retry_s=1)
    serializer = AvroSerializer(registry_client(settings), json.dumps(schema))
    out = serializer(value, SerializationContext(TOPIC, MessageField.VALUE))
    assert out is not None
    return out


def test_uncovered_finds_new_nested_and_wider_fields() -> None:
    columns = [
        pa.field("id", pa.int64()),
        pa.field("n", pa.int32()),
        pa.field("a", pa.struct([pa.field("city", pa.string())])),
        pa.field("tags", pa.list_(pa.struct([pa.field("k", pa.string())]))),
    ]
    assert uncovered(columns, [pa.field("id", pa.int32()), pa.field("n", pa.int16())]) is None
    assert uncovered(columns, [pa.field("n", pa.int64())]) == "n"
    assert uncovered(columns, [pa.field("extra", pa.string())]) == "extra"
    nested = pa.struct([pa.field("city", pa.string()), pa.field("zip", pa.string())])
    assert uncovered(columns, [pa.field("a", nested)]) == "a.zip"
    tag = pa.list_(pa.struct([pa.field("k", pa.string()), pa.field("v", pa.string())]))
    assert uncovered(columns, [pa.field("tags", tag)]) == "tags.element.v"
    assert uncovered(columns, [pa.field("id", pa.string())]) == "id"


def test_columns_without_value_schema_come_from_the_latest_version() -> None:
    url = _url()
    _register(url, V1, V2, V3, V3_ZIP, V4)
    columns = registry_columns(_config(url), [TOPIC])
    assert columns is not None
    assert columns.names == ["id", "visits", "country", "address"]
    assert columns.field("visits").type == pa.int64()
    assert columns.field("address").type == pa.struct(
        [pa.field("city", pa.string(), nullable=False), pa.field("zip", pa.string())]
    )
    # a field every version has stays as required as the registry's latest schema has it
    assert not columns.field("id").nullable


def test_a_declared_schema_evolves_by_the_latest_version() -> None:
    url = _url()
    _register(url, V1, V2, V3)
    cfg = _config(url, **{"value.schema": json.dumps(V1)})
    columns = registry_columns(cfg, [TOPIC])
    assert columns is not None and columns.names == ["id", "visits", "country", "address"]
    pinned = pin_registry_columns(cfg, [TOPIC])
    assert ddl_to_arrow(pinned["value.schema"]).names == columns.names
    assert pinned["value.schema.file"] is None
    # off: the declared columns as they are (a wider writer schema is then a dead letter)
    off = _config(url, **{"value.schema": json.dumps(V1), "schema.evolution": "off"})
    assert registry_columns(off, [TOPIC]) is None
    assert pin_registry_columns(off, [TOPIC]) is off


def test_off_without_a_declared_schema_takes_the_latest_version_as_it_is() -> None:
    url = _url()
    _register(url, V1, V2)
    columns = registry_columns(_config(url, **{"schema.evolution": "off"}), [TOPIC])
    assert columns is not None
    assert columns.names == ["id", "visits", "country"]
    assert columns.field("visits").type == pa.int32()


def test_a_version_that_cannot_evolve_the_columns_is_one_error_at_start() -> None:
    url = _url()
    narrowed = {**V1, "fields": [{"name": "id", "type": "string"}, *V1["fields"][1:]]}
    _register(url, V1, narrowed)
    with pytest.raises(
        SchemaEvolutionError, match=r"version 2 of subject customers-value .*column 'id'"
    ):
        registry_columns(_config(url, **{"value.schema": json.dumps(V1)}), [TOPIC])


def test_no_subject_and_no_declared_schema_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no subject customers-value"):
        registry_columns(_config(_url()), [TOPIC])
    assert subject_versions(RegistrySettings(url=_url(), retry_s=1), "nothing-value", "avro") == []


def test_values_of_every_version_decode_into_the_pinned_columns() -> None:
    url = _url()
    old = _serialize(url, V1, {"id": 1, "visits": 3})
    mid = _serialize(url, V3, {"id": 2, "visits": 4, "country": "NO", "address": {"city": "Oslo"}})
    new = _serialize(
        url,
        V4,
        {"id": 3, "visits": 2**40, "country": None, "address": {"city": "Bergen", "zip": "5003"}},
    )
    pinned = pin_registry_columns(_config(url), [TOPIC])
    decoded = value_deserializer(pinned).decode([old, mid, new])
    assert decoded.failures == {}
    assert decoded.table.to_pylist() == [
        {"id": 1, "visits": 3, "country": None, "address": None},
        {"id": 2, "visits": 4, "country": "NO", "address": {"city": "Oslo", "zip": None}},
        {"id": 3, "visits": 2**40, "country": None, "address": {"city": "Bergen", "zip": "5003"}},
    ]


class _CountingClient:
    """The mock registry client, counting the requests lakesink makes of it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args[:2]))
            return method(*args, **kwargs)

        return counted


def test_a_run_starts_from_one_request_and_fetches_older_versions_by_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = _url()
    old = _serialize(url, V1, {"id": 1, "visits": 3})
    mid = _serialize(url, V3, {"id": 2, "visits": 4, "country": "NO", "address": {"city": "Oslo"}})
    _register(url, V3_ZIP, V4)
    cfg = _config(url)
    settings = registry_settings(cfg.values)
    assert settings is not None
    counting = _CountingClient(registry_client(settings))
    monkeypatch.setitem(registry._clients, settings, counting)
    pinned = pin_registry_columns(cfg, [TOPIC])
    # four versions registered, one request: the latest (never the version list)
    assert counting.calls == [("get_version", ("customers-value", "latest"))]
    assert ddl_to_arrow(pinned["value.schema"]).names == ["id", "visits", "country", "address"]
    counting.calls.clear()
    decoded = value_deserializer(pinned).decode([old, mid, old, mid])
    assert decoded.failures == {}
    assert [r["id"] for r in decoded.table.to_pylist()] == [1, 2, 1, 2]
    # each older version fetched once, by the id its values carry
    assert sorted(name for name, _ in counting.calls) == ["get_schema", "get_schema"]


def test_an_id_the_columns_lack_is_noted_and_taken_in_by_the_next_run(tmp_path: Any) -> None:
    url = _url()
    # an older version with a field the latest dropped
    older = _serialize(url, V2, {"id": 7, "visits": 1, "country": "SE"})
    _register(url, V1)
    cfg = _config(url, **{"checkpoint.location": str(tmp_path / "cp")})
    first = pin_registry_columns(cfg, [TOPIC])
    assert ddl_to_arrow(first["value.schema"]).names == ["id", "visits"]
    with pytest.raises(SchemaEvolutionError, match="field 'country'") as failed:
        value_deserializer(first).decode([older])
    schema_id = note_writer_schema(cfg, failed.value)
    assert schema_id is not None and noted_writer_ids(cfg) == [schema_id]
    assert note_writer_schema(cfg, failed.value) is None  # noted once: no second start
    assert note_writer_schema(cfg, SchemaEvolutionError("another error")) is None
    again = pin_registry_columns(cfg, [TOPIC])
    decoded = value_deserializer(again).decode([older])
    assert decoded.table.to_pylist() == [{"id": 7, "visits": 1, "country": "SE"}]


def test_a_writer_schema_newer_than_the_run_ends_the_batch_or_is_a_dead_letter() -> None:
    url = _url()
    _register(url, V1, V2)
    evolving = pin_registry_columns(_config(url), [TOPIC])
    off = pin_registry_columns(_config(url, **{"schema.evolution": "off"}), [TOPIC])
    # registered after the runs started: a nested field the columns lack
    later = _serialize(url, V3_ZIP, {"id": 5, "visits": 1, "address": {"city": "Oslo"}})
    with pytest.raises(
        SchemaEvolutionError, match=r"field 'address' of writer schema id .* starts again"
    ):
        value_deserializer(evolving).decode([later])
    decoded = value_deserializer(off).decode([later])
    assert (
        "field 'address'" in decoded.failures[0]
        and "schema.evolution is off" in decoded.failures[0]
    )
    # a nested field the table lacks is a dead letter too, never dropped silently
    settings = registry_settings(off.values)
    assert settings is not None
    with_address = _config(url, **{"value.schema": json.dumps(V3), "schema.evolution": "off"})
    d = value_deserializer(with_address)
    assert isinstance(d, RegistryDeserializer)
    assert "field 'address.zip'" in d.decode([later]).failures[0]


def test_json_schema_and_protobuf_writer_columns() -> None:
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "address": {"type": ["object", "null"], "properties": {"city": {"type": "string"}}},
        },
        "required": ["id"],
    }
    columns = json_schema_columns(schema)
    assert columns == pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("tags", pa.list_(pa.string())),
            pa.field("address", pa.struct([pa.field("city", pa.string())])),
        ]
    )
    with pytest.raises(ConfigError, match="any"):
        json_schema_columns({"type": "object", "properties": {"any": {}}})
    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name=f"lakesink_cols_{uuid.uuid4().hex}.proto", package="cols", syntax="proto3"
    )
    msg = fdp.message_type.add(name="Order")
    msg.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    msg.field.add(name="qty", number=2, type=f.TYPE_INT32, label=f.LABEL_REPEATED)
    line = msg.nested_type.add(name="Line")
    line.field.add(name="sku", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    settings = RegistrySettings(url=_url(), retry_s=1)
    import base64

    registered = Schema(base64.b64encode(fdp.SerializeToString()).decode(), "PROTOBUF")
    out = writer_columns("protobuf", registered, settings)
    assert out.schema == pa.schema(
        [pa.field("id", pa.int64()), pa.field("qty", pa.list_(pa.int32()))]
    )
    # a record name (the record strategies) picks its message of the file, nested too
    assert writer_columns("protobuf", registered, settings, "cols.Order") == out
    nested = writer_columns("protobuf", registered, settings, "cols.Order.Line")
    assert nested.schema == pa.schema([pa.field("sku", pa.string())])
    with pytest.raises(
        ConfigError, match=r"has no message cols\.Refund \(its messages: cols\.Order\)"
    ):
        writer_columns("protobuf", registered, settings, "cols.Refund")


def test_a_topic_subject_of_several_messages_takes_the_one_no_other_uses_or_is_refused() -> None:
    import base64

    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name=f"lakesink_many_{uuid.uuid4().hex}.proto", package="many", syntax="proto3"
    )
    part = fdp.message_type.add(name="Address")  # first, but a part of Customer
    part.field.add(name="city", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    customer = fdp.message_type.add(name="Customer")
    customer.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    customer.field.add(
        name="home", number=2, type=f.TYPE_MESSAGE, type_name=".many.Address",
        label=f.LABEL_OPTIONAL,
    )  # fmt: skip
    settings = RegistrySettings(url=_url(), retry_s=1)

    def registered() -> Schema:
        return Schema(base64.b64encode(fdp.SerializeToString()).decode(), "PROTOBUF")

    # the topic strategy names no message: Customer is the one no other message uses
    assert writer_columns("protobuf", registered(), settings).schema.names == ["id", "home"]
    refund = fdp.message_type.add(name="Refund")
    refund.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    fdp.name = f"lakesink_many_{uuid.uuid4().hex}.proto"
    with pytest.raises(ConfigError) as e:
        writer_columns("protobuf", registered(), settings)
    assert "top-level messages many.Address, many.Customer, many.Refund" in str(e.value)
    assert "schema.registry.record.name" in str(e.value)
    # a record name still picks its message
    assert writer_columns("protobuf", registered(), settings, "many.Refund").schema.names == ["id"]


def test_a_table_of_keys_keeps_its_declared_columns() -> None:
    url = _url()
    _register(url, V1, V2)
    keyed = {"value.schema": json.dumps(V1), "write.operation": "upsert"}
    cfg = _config(url, **keyed, **{"table.record.key.fields": "id"})
    assert registry_columns(cfg, [TOPIC]) is None
    later = _serialize(url, V2, {"id": 1, "visits": 1, "country": "NO"})
    failures = value_deserializer(cfg).decode([later]).failures
    assert "field 'country'" in failures[0] and "schema.evolution is off" in failures[0]
