"""Registry-framed values (lakesink.kafka.registry) against confluent-kafka's mock registry:
each value decoded with its own writer schema and resolved to the table's columns."""

from __future__ import annotations

import json
import pickle
import socket
import time
import uuid
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from lakesink.config import build_config
from lakesink.config.records import registry_settings
from lakesink.errors import ConfigError, SchemaRegistryError
from lakesink.kafka.deserializers import make_deserializer
from lakesink.kafka.registry import (
    RegistryDeserializer,
    RegistrySettings,
    message_indexes,
    registry_client,
)
from lakesink.security import Secret

COLUMNS = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("country", pa.string()),
    ]
)

AVRO_V1 = {
    "type": "record",
    "name": "Customer",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
}
AVRO_V2 = {
    **AVRO_V1,
    "fields": [
        *AVRO_V1["fields"],
        {"name": "country", "type": ["null", "string"], "default": None},
    ],
}


def mock_registry() -> RegistrySettings:
    return RegistrySettings(url=f"mock://{uuid.uuid4().hex}", retry_s=1)


def ctx(topic: str = "customers") -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def avro_bytes(settings: RegistrySettings, schema: dict[str, Any], value: dict[str, Any]) -> bytes:
    serializer = AvroSerializer(registry_client(settings), json.dumps(schema))
    out = serializer(value, ctx())
    assert out is not None
    return out


def test_avro_each_value_is_read_with_its_own_writer_schema() -> None:
    settings = mock_registry()
    v1 = avro_bytes(settings, AVRO_V1, {"id": 1, "name": "ada"})
    v2 = avro_bytes(settings, AVRO_V2, {"id": 2, "name": "bob", "country": "NO"})
    assert v1[1:5] != v2[1:5]  # two writer schema ids
    decoded = RegistryDeserializer("avro", COLUMNS, settings).decode([v1, v2, v1])
    assert decoded.failures == {}
    assert decoded.table.to_pylist() == [
        {"id": 1, "name": "ada", "country": None},
        {"id": 2, "name": "bob", "country": "NO"},
        {"id": 1, "name": "ada", "country": None},
    ]


def test_a_writer_field_the_table_lacks_is_a_dead_letter_naming_it() -> None:
    settings = mock_registry()
    wider = {**AVRO_V2, "fields": [*AVRO_V2["fields"], {"name": "tier", "type": "int"}]}
    good = avro_bytes(settings, AVRO_V1, {"id": 1, "name": "ada"})
    bad = avro_bytes(settings, wider, {"id": 2, "name": "bob", "country": None, "tier": 3})
    decoded = RegistryDeserializer("avro", COLUMNS, settings).decode([good, bad])
    assert decoded.table.column("id").to_pylist() == [1]
    assert list(decoded.failures) == [1]
    assert "field 'tier'" in decoded.failures[1]
    assert f"writer schema id {int.from_bytes(bad[1:5], 'big')}" in decoded.failures[1]


def test_unknown_ids_unframed_and_broken_values_are_failures_with_reasons() -> None:
    settings = mock_registry()
    good = avro_bytes(settings, AVRO_V1, {"id": 1, "name": "ada"})
    unknown = b"\x00" + (4242).to_bytes(4, "big") + good[5:]
    unframed = b"\x07not framed"
    truncated = good[:-2]
    trailing = good + b"\x00"
    decoded = RegistryDeserializer("avro", COLUMNS, settings).decode(
        [unknown, unframed, truncated, trailing, good]
    )
    assert decoded.table.num_rows == 1
    assert "schema id 4242 is not in the registry" in decoded.failures[0]
    assert "magic byte 0" in decoded.failures[1]
    assert "ends before its record does" in decoded.failures[2]
    assert "the record ends at byte" in decoded.failures[3]


def test_a_missing_required_column_and_a_tombstone_are_failures() -> None:
    settings = mock_registry()
    no_id = {"type": "record", "name": "N", "fields": [{"name": "name", "type": "string"}]}
    value = avro_bytes(settings, no_id, {"name": "x"})
    decoded = RegistryDeserializer("avro", COLUMNS, settings).decode([value, None])
    assert "required column 'id'" in decoded.failures[0]
    assert "tombstone" in decoded.failures[1]


def test_json_schema_values_are_validated_against_their_writer_schema() -> None:
    settings = mock_registry()
    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
        "required": ["id"],
    }
    serializer = JSONSerializer(json.dumps(schema), registry_client(settings))
    good = serializer({"id": 5, "name": "eve"}, ctx())
    assert good is not None
    wrong_type = good[:5] + b'{"id": "five"}'
    not_json = good[:5] + b'{"id": 5'
    decoded = RegistryDeserializer("jsonschema", COLUMNS, settings).decode(
        [good, wrong_type, not_json]
    )
    assert decoded.table.to_pylist() == [{"id": 5, "name": "eve", "country": None}]
    assert "does not match its JSON Schema" in decoded.failures[1]
    assert "at id" in decoded.failures[1]
    assert 1 in decoded.failures and 2 in decoded.failures


def test_json_schema_property_the_table_lacks_is_a_dead_letter() -> None:
    settings = mock_registry()
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "vip": {}}}
    serializer = JSONSerializer(json.dumps(schema), registry_client(settings))
    value = serializer({"id": 5}, ctx())
    decoded = RegistryDeserializer("jsonschema", COLUMNS, settings).decode([value])
    assert "field 'vip'" in decoded.failures[0]


def _order_messages() -> tuple[Any, Any]:
    """A .proto file built at run time (no generated code): messages Order and Refund."""
    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name=f"lakesink_test_{uuid.uuid4().hex}.proto", package="shop", syntax="proto3"
    )
    order = fdp.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    order.field.add(name="name", number=2, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    order.field.add(
        name="country",
        number=3,
        type=f.TYPE_STRING,
        label=f.LABEL_OPTIONAL,
        proto3_optional=True,
        oneof_index=0,
    )
    order.oneof_decl.add(name="_country")
    refund = fdp.message_type.add(name="Refund")
    refund.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Refund")),
    )


def test_protobuf_is_decoded_from_the_registered_file_descriptor() -> None:
    settings = mock_registry()
    order, refund = _order_messages()
    client = registry_client(settings)
    conf = {"use.deprecated.format": False}
    orders = ProtobufSerializer(order, client, conf)
    refunds = ProtobufSerializer(refund, client, conf)
    first = orders(order(id=1, name="a"), ctx())
    second = orders(order(id=2, name="b", country="SE"), ctx())
    other = refunds(refund(id=3), SerializationContext("refunds", MessageField.VALUE))
    assert first is not None and second is not None and other is not None
    assert message_indexes(other[5:])[0] == (1,)
    broken = second[:-1]
    decoded = RegistryDeserializer("protobuf", COLUMNS, settings).decode(
        [first, second, other, broken]
    )
    assert decoded.table.to_pylist() == [
        {"id": 1, "name": "a", "country": None},
        {"id": 2, "name": "b", "country": "SE"},
        {"id": 3, "name": None, "country": None},
    ]
    assert "Protobuf decode with writer schema id" in decoded.failures[3]


def test_message_indexes() -> None:
    assert message_indexes(b"\x00rest") == ((0,), 1)
    assert message_indexes(bytes([4, 2, 6])) == ((1, 3), 3)  # zigzag: 4 → 2 entries
    with pytest.raises(ValueError, match="cut off"):
        message_indexes(bytes([4, 2]))


def test_an_unreachable_registry_is_retried_then_one_clear_error() -> None:
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = RegistrySettings(url=f"http://127.0.0.1:{port}", retry_s=0.6)
    value = b"\x00\x00\x00\x00\x01\x02"
    started = time.monotonic()
    with pytest.raises(SchemaRegistryError, match="could not be reached for schema id 1"):
        RegistryDeserializer("avro", COLUMNS, settings).decode([value])
    assert time.monotonic() - started >= 0.2  # it did wait and retry


def test_the_deserializer_pickles_without_its_cache() -> None:
    settings = mock_registry()
    value = avro_bytes(settings, AVRO_V1, {"id": 9, "name": "z"})
    d = RegistryDeserializer("avro", COLUMNS, settings)
    d.decode([value])
    copy = pickle.loads(pickle.dumps(d))
    assert copy.decode([value]).table.to_pylist() == [{"id": 9, "name": "z", "country": None}]


def _config(**values: Any) -> Any:
    raw = {"kafka.bootstrap.servers": "localhost:9092", "kafka.topics": "t", "table.path": "/t"}
    raw.update(values)
    return build_config(raw)


def test_config_keys_choose_the_registry_path() -> None:
    cfg = _config(
        **{
            "value.format": "protobuf",
            "value.schema": "id BIGINT NOT NULL, name STRING, country STRING",
            "schema.registry.url": "mock://cfg",
            "schema.registry.basic.auth.user.info": "reader:hunter2",
            "schema.registry.cache.capacity": 5,
        }
    )
    settings = registry_settings(cfg.values)
    assert settings is not None
    assert isinstance(settings.user_info, Secret)
    assert "hunter2" not in repr(settings) and "hunter2" not in repr(cfg.values)
    # tasks get the secret apart from the configuration's JSON, as every secret key's
    from lakesink.spark.source import (
        CONFIG_OPTION,
        SECRETS_OPTION,
        decode_config,
        encode_config,
        encode_secrets,
    )

    options = {CONFIG_OPTION: encode_config(cfg), SECRETS_OPTION: encode_secrets(cfg)}
    assert "hunter2" not in options[CONFIG_OPTION]
    back = registry_settings(decode_config(options).values)
    assert back is not None and back.user_info is not None
    assert back.client_config()["basic.auth.user.info"] == "reader:hunter2"
    d = make_deserializer("protobuf", schema=cfg["value.schema"], registry=settings)
    assert isinstance(d, RegistryDeserializer)
    assert d.value_schema.names == ["id", "name", "country"]
    avro = make_deserializer("avro", schema=json.dumps(AVRO_V2), registry=settings)
    assert avro.value_schema.names == ["id", "name", "country"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"value.format": "jsonschema", "value.schema": "id BIGINT"}, "needs schema.registry.url"),
        (
            {"value.format": "raw", "schema.registry.url": "mock://x"},
            "applies to value.format avro, jsonschema or protobuf",
        ),
        (
            {
                "value.format": "protobuf",
                "schema.registry.url": "mock://x",
                "write.operation": "cdc",
                "table.record.key.fields": "id",
            },
            "cdc reads values through schema.registry.url in Avro",
        ),
        (
            {
                "value.format": "protobuf",
                "value.schema": "id BIGINT",
                "schema.registry.url": "https://reader:hunter2@registry.example:8081",
            },
            "must not carry credentials",
        ),
        (
            {
                "value.format": "avro",
                "value.schema": json.dumps(AVRO_V1),
                "value.avro.schema.ids": "3",
                "schema.registry.url": "mock://x",
            },
            "value.avro.schema.ids unset",
        ),
    ],
)
def test_config_refuses_registry_mistakes(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        _config(**values)
    assert "hunter2" not in str(refused.value)


def test_protobuf_nested_repeated_enum_and_map_fields_become_columns() -> None:
    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name=f"lakesink_rich_{uuid.uuid4().hex}.proto", package="rich", syntax="proto3"
    )
    status = fdp.enum_type.add(name="Status")
    status.value.add(name="NEW", number=0)
    status.value.add(name="PAID", number=1)
    order = fdp.message_type.add(name="Order")
    line = order.nested_type.add(name="Line")
    line.field.add(name="sku", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    entry = order.nested_type.add(name="TagsEntry", options=descriptor_pb2.MessageOptions())
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
    order.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    order.field.add(
        name="status", number=2, type=f.TYPE_ENUM, type_name=".rich.Status", label=f.LABEL_OPTIONAL
    )
    order.field.add(
        name="lines",
        number=3,
        type=f.TYPE_MESSAGE,
        type_name=".rich.Order.Line",
        label=f.LABEL_REPEATED,
    )
    order.field.add(
        name="first",
        number=4,
        type=f.TYPE_MESSAGE,
        type_name=".rich.Order.Line",
        label=f.LABEL_OPTIONAL,
    )
    order.field.add(
        name="tags",
        number=5,
        type=f.TYPE_MESSAGE,
        type_name=".rich.Order.TagsEntry",
        label=f.LABEL_REPEATED,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("rich.Order"))
    settings = mock_registry()
    serializer = ProtobufSerializer(
        cls, registry_client(settings), {"use.deprecated.format": False}
    )
    msg = cls(id=1, status=1)
    msg.lines.add(sku="a")
    msg.lines.add(sku="b")
    msg.tags["x"] = 7
    full = serializer(msg, ctx())
    bare = serializer(cls(id=2), ctx())
    line_type = pa.struct([pa.field("sku", pa.string())])
    columns = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("status", pa.string()),
            pa.field("lines", pa.list_(line_type)),
            pa.field("first", line_type),
            pa.field("tags", pa.map_(pa.string(), pa.int32())),
        ]
    )
    decoded = RegistryDeserializer("protobuf", columns, settings).decode([full, bare])
    assert decoded.failures == {}
    assert decoded.table.to_pylist() == [
        {
            "id": 1,
            "status": "PAID",
            "lines": [{"sku": "a"}, {"sku": "b"}],
            "first": None,
            "tags": [("x", 7)],
        },
        {"id": 2, "status": "NEW", "lines": [], "first": None, "tags": []},
    ]


def test_refused_credentials_fail_at_once_and_a_busy_registry_is_retried() -> None:
    import http.server
    import threading

    answers = [503, 401]  # first busy (retried), then the credentials are refused
    seen: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            status = answers.pop(0) if answers else 401
            body = json.dumps({"error_code": status, "message": "no"}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        settings = RegistrySettings(
            url=f"http://127.0.0.1:{server.server_port}",
            user_info=Secret("reader:wrong"),
            retry_s=30,
        )
        started = time.monotonic()
        with pytest.raises(SchemaRegistryError, match="refused schema id 1 \\(HTTP 401\\)"):
            RegistryDeserializer("avro", COLUMNS, settings).decode([b"\x00\x00\x00\x00\x01\x02"])
        assert time.monotonic() - started < 10  # not the whole retry budget
        assert len(seen) == 2 and all(h and h.startswith("Basic ") for h in seen)
    finally:
        server.shutdown()
        server.server_close()
