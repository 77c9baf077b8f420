"""Record keys decoded through a schema registry (key.format, lakesink.kafka.registry_keys)
against confluent-kafka's mock registry: the key's columns pinned from `<topic>-key`, a record
key field taken from the key, the key filling the value's nulls, bad keys as bad records."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from lakesink.config import build_config
from lakesink.errors import ConfigError
from lakesink.kafka.ddl import ddl_to_arrow
from lakesink.kafka.registry import RegistrySettings, registry_client
from lakesink.kafka.registry_keys import RegistryKeys, decode_with_keys
from lakesink.spark.registry_columns import pin_registry_columns
from lakesink.spark.source import value_deserializer

TOPIC = "orders"
KEY = {
    "type": "record",
    "name": "OrderKey",
    "fields": [{"name": "region", "type": "string"}, {"name": "id", "type": "long"}],
}
VALUE = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": ["null", "long"], "default": None},
        {"name": "amount", "type": "double"},
    ],
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


def _serialize(url: str, schema: dict[str, Any], value: dict[str, Any], field: str) -> bytes:
    client = registry_client(RegistrySettings(url=url, retry_s=1))
    out = AvroSerializer(client, json.dumps(schema))(value, SerializationContext(TOPIC, field))
    assert out is not None
    return out


def test_key_fields_join_the_row_and_a_record_key_field_comes_from_the_key() -> None:
    url = _url()
    keys = [
        _serialize(url, KEY, {"region": "eu", "id": 1}, MessageField.KEY),
        _serialize(url, KEY, {"region": "us", "id": 2}, MessageField.KEY),
    ]
    values = [
        _serialize(url, VALUE, {"id": None, "amount": 1.5}, MessageField.VALUE),
        _serialize(url, VALUE, {"id": 2, "amount": 2.5}, MessageField.VALUE),
    ]
    cfg = _config(url, **{"write.operation": "upsert", "table.record.key.fields": "region,id"})
    pinned = pin_registry_columns(cfg, [TOPIC])
    assert ddl_to_arrow(pinned["key.schema"]).names == ["region", "id"]
    deserializer = value_deserializer(pinned)
    assert deserializer.value_schema.names == ["id", "amount", "region"]
    decoded = decode_with_keys(deserializer, values, keys)
    assert decoded.failures == {}
    # the value's null id is filled from the key; region exists only in the key
    assert decoded.table.to_pylist() == [
        {"id": 1, "amount": 1.5, "region": "eu"},
        {"id": 2, "amount": 2.5, "region": "us"},
    ]


def test_bad_and_missing_keys_are_bad_records_naming_the_key() -> None:
    url = _url()
    good_key = _serialize(url, KEY, {"region": "eu", "id": 1}, MessageField.KEY)
    value = _serialize(url, VALUE, {"id": 1, "amount": 1.0}, MessageField.VALUE)
    pinned = pin_registry_columns(_config(url), [TOPIC])
    deserializer = value_deserializer(pinned)
    assert isinstance(deserializer, RegistryKeys)
    decoded = deserializer.decode_keyed(
        [value, value, value, b"not framed"], [b"plain text key", None, good_key, good_key]
    )
    assert decoded.failures[0].startswith("the record key: ")
    assert "magic byte" in decoded.failures[0]
    assert "has no key" in decoded.failures[1] and "'region'" in decoded.failures[1]
    assert 3 in decoded.failures and not decoded.failures[3].startswith("the record key")
    assert decoded.table.to_pylist() == [{"id": 1, "amount": 1.0, "region": "eu"}]


def test_key_settings_are_checked_and_the_key_subject_must_exist() -> None:
    url = _url()
    _serialize(url, VALUE, {"id": 1, "amount": 1.0}, MessageField.VALUE)
    with pytest.raises(ConfigError, match="no subject orders-key"):
        pin_registry_columns(_config(url), [TOPIC])
    with pytest.raises(ConfigError, match=r"key\.format=avro needs schema\.registry\.url"):
        _config(url, **{"schema.registry.url": None})
    with pytest.raises(ConfigError, match=r"key\.schema applies to key\.format"):
        _config(url, **{"key.format": "raw", "key.schema": "id BIGINT"})
    with pytest.raises(ConfigError, match=r"schema\.registry\.subject\.strategy=topic"):
        _config(
            url,
            **{
                "schema.registry.subject.strategy": "record",
                "schema.registry.record.name": "Order",
            },
        )
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
