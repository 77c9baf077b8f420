"""Record keys decoded through a schema registry (key.format, lakesink.kafka.registry_keys)
against confluent-kafka's mock registry, in each key format (Avro, JSON Schema, Protobuf), from
the bytes of confluent-kafka's own serializers: the key's columns pinned from the key subject
(`<topic>-key`, or by the key record's name under the record strategies), a record key field
taken from the key, the key filling the value's nulls, bad keys as bad records."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import (
    record_subject_name_strategy,
    topic_record_subject_name_strategy,
)
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from lakesink.config import build_config
from lakesink.errors import ConfigError
from lakesink.kafka.ddl import ddl_to_arrow
from lakesink.kafka.registry import RegistrySettings, registry_client
from lakesink.kafka.registry_keys import RegistryKeys, decode_with_keys
from lakesink.spark.registry_columns import pin_registry_columns
from lakesink.spark.source import value_deserializer

TOPIC = "orders"
KEY_RECORD = "shop.OrderKey"  # the key's record name in every format
VALUE_RECORD = "shop.Order"
KEY_AVRO = {
    "type": "record",
    "name": "OrderKey",
    "namespace": "shop",
    "fields": [{"name": "region", "type": "string"}, {"name": "id", "type": "long"}],
}
KEY_JSON = {
    "title": KEY_RECORD,  # a JSON Schema's record name, for the record strategies
    "type": "object",
    "properties": {"region": {"type": "string"}, "id": {"type": "integer"}},
    "required": ["region", "id"],
}
VALUE = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": ["null", "long"], "default": None},
        {"name": "amount", "type": "double"},
    ],
}
KEY_FORMATS = ("avro", "jsonschema", "protobuf")
STRATEGIES = {
    "record": record_subject_name_strategy,
    "topic-record": topic_record_subject_name_strategy,
}


def _url() -> str:
    return f"mock://{uuid.uuid4().hex}"


def _config(url: str, **values: Any) -> Any:
    raw: dict[str, Any] = {
        "kafka.bootstrap.servers": "localhost:9092",
        "kafka.topics": TOPIC,
        "table.path": "/t",
        "value.format": "avro",
        "key.format": "avro",
        "schema.registry.url": url,
        "schema.registry.retry.s": 1,
    }
    raw.update(values)
    return build_config(raw)


def _client(url: str) -> Any:
    return registry_client(RegistrySettings(url=url, retry_s=1))


def _conf(strategy: str | None) -> dict[str, Any]:
    return {} if strategy is None else {"subject.name.strategy": STRATEGIES[strategy]}


def _serialize(
    url: str, schema: dict[str, Any], value: dict[str, Any], field: str, strategy: str | None = None
) -> bytes:
    serializer = AvroSerializer(_client(url), json.dumps(schema), conf=_conf(strategy))
    out = serializer(value, SerializationContext(TOPIC, field))
    assert out is not None
    return out


def _key_message(after_another: bool = False) -> Any:
    """The key as a Protobuf message built at run time (no generated code): shop.OrderKey;
    `after_another`: second in its file, after a message of other fields (one .proto file with
    a topic's several messages)."""
    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name=f"lakesink_key_{uuid.uuid4().hex}.proto", package="shop", syntax="proto3"
    )
    if after_another:
        note = fdp.message_type.add(name="OrderNote")
        note.field.add(name="note", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    key = fdp.message_type.add(name="OrderKey")
    key.field.add(name="region", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    key.field.add(name="id", number=2, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(KEY_RECORD))


def _key_serializer(
    url: str, fmt: str, strategy: str | None = None
) -> Callable[[dict[str, Any]], bytes]:
    """Keys {region, id} in `fmt`, as confluent-kafka's serializer of that format frames them
    (registering the key schema under the subject `strategy` names)."""
    ctx = SerializationContext(TOPIC, MessageField.KEY)
    client = _client(url)
    if fmt == "protobuf":
        # under the record strategies the subject names the message: it need not be the first
        message = _key_message(after_another=strategy is not None)
        conf = {"use.deprecated.format": False, **_conf(strategy)}
        proto = ProtobufSerializer(message, client, conf)

        def serialize(key: dict[str, Any]) -> bytes:
            out = proto(message(**key), ctx)
            assert out is not None
            return out

        return serialize
    if fmt == "jsonschema":
        to_json = JSONSerializer(json.dumps(KEY_JSON), client, conf=_conf(strategy))
    else:
        to_json = AvroSerializer(client, json.dumps(KEY_AVRO), conf=_conf(strategy))

    def serialize_dict(key: dict[str, Any]) -> bytes:
        out = to_json(key, ctx)
        assert out is not None
        return out

    return serialize_dict


@pytest.mark.parametrize("fmt", KEY_FORMATS)
def test_key_fields_join_the_row_and_a_record_key_field_comes_from_the_key(fmt: str) -> None:
    url = _url()
    key = _key_serializer(url, fmt)
    keys = [key({"region": "eu", "id": 1}), key({"region": "us", "id": 2})]
    values = [
        _serialize(url, VALUE, {"id": None, "amount": 1.5}, MessageField.VALUE),
        _serialize(url, VALUE, {"id": 2, "amount": 2.5}, MessageField.VALUE),
    ]
    cfg = _config(
        url,
        **{"key.format": fmt, "write.operation": "upsert", "table.record.key.fields": "region,id"},
    )
    pinned = pin_registry_columns(cfg, [TOPIC])
    key_columns = ddl_to_arrow(pinned["key.schema"])
    assert key_columns.names == ["region", "id"]
    assert key_columns.field("id").type == pa.int64()
    # Protobuf (proto3) has no required field; Avro's and the JSON Schema's are required
    assert key_columns.field("region").nullable == (fmt == "protobuf")
    deserializer = value_deserializer(pinned)
    assert deserializer.value_schema.names == ["id", "amount", "region"]
    decoded = decode_with_keys(deserializer, values, keys)
    assert decoded.failures == {}
    # the value's null id is filled from the key; region exists only in the key
    assert decoded.table.to_pylist() == [
        {"id": 1, "amount": 1.5, "region": "eu"},
        {"id": 2, "amount": 2.5, "region": "us"},
    ]


@pytest.mark.parametrize("fmt", KEY_FORMATS)
def test_bad_and_missing_keys_are_bad_records_naming_the_key(fmt: str) -> None:
    url = _url()
    good_key = _key_serializer(url, fmt)({"region": "eu", "id": 1})
    value = _serialize(url, VALUE, {"id": 1, "amount": 1.0}, MessageField.VALUE)
    pinned = pin_registry_columns(_config(url, **{"key.format": fmt}), [TOPIC])
    deserializer = value_deserializer(pinned)
    assert isinstance(deserializer, RegistryKeys)
    decoded = deserializer.decode_keyed(
        [value, value, value, value, b"not framed"],
        [b"plain text key", good_key[:-1], None, good_key, good_key],
    )
    assert decoded.failures[0].startswith("the record key: ")
    assert "magic byte" in decoded.failures[0]
    # a key cut short does not decode with its writer schema
    assert decoded.failures[1].startswith("the record key: "), decoded.failures[1]
    assert 4 in decoded.failures and not decoded.failures[4].startswith("the record key")
    rows = [{"id": 1, "amount": 1.0, "region": "eu"}]
    if fmt == "protobuf":
        # no key column is required: a record without a key keeps the value's id, region null
        assert 2 not in decoded.failures
        rows.insert(0, {"id": 1, "amount": 1.0, "region": None})
    else:
        assert "has no key" in decoded.failures[2] and "'region'" in decoded.failures[2]
    assert decoded.table.to_pylist() == rows


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("fmt", KEY_FORMATS)
def test_the_key_subject_follows_the_record_strategies(fmt: str, strategy: str) -> None:
    """The producers' serializers register the key under `<key record name>` (record) or
    `<topic>-<key record name>` (topic-record), the record name being Avro's namespace.name,
    the Protobuf message's full name or the JSON Schema's title: the key's columns are pinned
    from there."""
    url = _url()
    key = _key_serializer(url, fmt, strategy)({"region": "eu", "id": 7})
    value = _serialize(url, VALUE, {"id": None, "amount": 3.0}, MessageField.VALUE, strategy)
    subject = KEY_RECORD if strategy == "record" else f"{TOPIC}-{KEY_RECORD}"
    assert subject in _client(url).get_subjects()
    cfg = _config(
        url,
        **{
            "key.format": fmt,
            "schema.registry.subject.strategy": strategy,
            "schema.registry.record.name": VALUE_RECORD,
            "schema.registry.key.record.name": KEY_RECORD,
        },
    )
    pinned = pin_registry_columns(cfg, [TOPIC])
    assert ddl_to_arrow(pinned["key.schema"]).names == ["region", "id"]
    decoded = decode_with_keys(value_deserializer(pinned), [value], [key])
    assert decoded.failures == {}
    assert decoded.table.to_pylist() == [{"id": 7, "amount": 3.0, "region": "eu"}]
    # a key record name no serializer registered: one error naming the subject looked up
    other = cfg.with_overrides({"schema.registry.key.record.name": "shop.Other"})
    missing = "shop.Other" if strategy == "record" else f"{TOPIC}-shop.Other"
    with pytest.raises(ConfigError, match=f"no subject {missing}:"):
        pin_registry_columns(other, [TOPIC])


def test_key_settings_are_checked_and_the_key_subject_must_exist() -> None:
    url = _url()
    _serialize(url, VALUE, {"id": 1, "amount": 1.0}, MessageField.VALUE)
    with pytest.raises(ConfigError, match="no subject orders-key"):
        pin_registry_columns(_config(url), [TOPIC])
    with pytest.raises(ConfigError, match=r"key\.format=avro needs schema\.registry\.url"):
        _config(url, **{"schema.registry.url": None})
    with pytest.raises(ConfigError, match=r"key\.schema applies to key\.format"):
        _config(url, **{"key.format": "raw", "key.schema": "id BIGINT"})
    with pytest.raises(ConfigError, match=r"schema\.registry\.key\.record\.name applies to key"):
        _config(url, **{"key.format": "raw", "schema.registry.key.record.name": KEY_RECORD})
    with pytest.raises(ConfigError, match=r"the topic strategy names the key subject"):
        _config(url, **{"schema.registry.key.record.name": KEY_RECORD})
    record = {
        "schema.registry.subject.strategy": "record",
        "schema.registry.record.name": VALUE_RECORD,
    }
    with pytest.raises(ConfigError, match=r"needs schema\.registry\.key\.record\.name"):
        _config(url, **record)
    # declared key columns need no key subject, whatever the strategy
    assert _config(url, **record, **{"key.schema": "id BIGINT"})["key.schema"] == "id BIGINT"
    # a declared key.schema is kept as it is; a type the value's column disagrees with is refused
    declared = _config(url, **{"key.schema": "id STRING"})
    assert pin_registry_columns(declared, [TOPIC])["key.schema"] == "id STRING"
    with pytest.raises(ConfigError, match="key field 'id' is string"):
        value_deserializer(pin_registry_columns(declared, [TOPIC]))
    raw = _config(url, **{"key.format": "raw"})
    assert not isinstance(value_deserializer(pin_registry_columns(raw, [TOPIC])), RegistryKeys)
    assert pa.types.is_floating(
        value_deserializer(pin_registry_columns(raw, [TOPIC])).value_schema.field("amount").type
    )
