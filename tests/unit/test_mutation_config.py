"""The row-mutation keys (write.operation, table.ordering.field, cdc.*, table.bucket.count):
their values in the typed settings, and each refusal naming the key and what would be valid."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lakesink.config import build_config
from lakesink.errors import ConfigError
from lakesink.protocol.mutation import SOURCE_POSITION_COLUMN, RowOperation
from lakesink.settings import DEFAULT_OP_VALUES, MutationSettings, parse_op_values

BASE: dict[str, Any] = {
    "kafka.bootstrap.servers": "127.0.0.1:9092",
    "kafka.topics": "shop.public.customers",
    "value.schema": "id INT NOT NULL, name STRING, version BIGINT, tags ARRAY<STRING>",
    "table.path": "/tmp/customers",
}
CDC: dict[str, Any] = {**BASE, "write.operation": "cdc", "table.record.key.fields": "id"}
INSERT, UPDATE, DELETE = RowOperation.INSERT, RowOperation.UPDATE, RowOperation.DELETE


def refused(raw: dict[str, Any], *pieces: str) -> str:
    """The message of the ConfigError `raw` is refused with; each piece must be in it."""
    with pytest.raises(ConfigError) as e:
        build_config(raw)
    message = str(e.value)
    for piece in pieces:
        assert piece in message, (piece, message)
    return message


# --- defaults and settings ------------------------------------------------------------------


def test_append_is_the_default_and_its_settings_order_nothing() -> None:
    s = build_config(BASE).settings.mutation
    assert s == MutationSettings()
    assert (s.operation, s.mutates, s.ordering_column) == ("append", False, None)
    assert (s.cdc_format, s.op_field, s.bucket_count) == ("debezium", "op", 8)
    assert dict(s.op_values) == {"I": INSERT, "U": UPDATE, "D": DELETE}


def test_each_key_lands_in_the_mutation_settings() -> None:
    cfg = build_config(
        {
            **CDC,
            "cdc.format": "field",
            "cdc.op.field": "name",
            "cdc.op.values": "c=insert, u = UPDATE ,d=delete,1=delete",
            "table.ordering.field": "version",
            "table.bucket.count": "16",
        }
    )
    s = cfg.settings.mutation
    assert (s.operation, s.cdc_format, s.op_field, s.bucket_count) == ("cdc", "field", "name", 16)
    assert s.ordering_field == s.ordering_column == "version"
    assert dict(s.op_values) == {"c": INSERT, "u": UPDATE, "d": DELETE, "1": DELETE}
    assert cfg["cdc.op.values"] == "c=insert,u=update,d=delete,1=delete"  # one spelling
    assert cfg.settings.table.record_key_fields == ("id",)


def test_the_ordering_column_of_each_mode() -> None:
    debezium = build_config(CDC).settings.mutation
    assert debezium.ordering_column == SOURCE_POSITION_COLUMN
    field = build_config({**CDC, "cdc.format": "field", "cdc.op.field": "name"}).settings
    assert field.mutation.ordering_column is None  # the later Kafka offset wins
    upsert = build_config({**CDC, "write.operation": "upsert"}).settings.mutation
    assert upsert.mutates and upsert.ordering_column is None
    ordered = build_config({**CDC, "table.ordering.field": "version"}).settings.mutation
    assert ordered.ordering_column == "version"


def test_upsert_takes_a_kafka_metadata_column_as_its_ordering_field() -> None:
    s = build_config(
        {**CDC, "write.operation": "upsert", "table.ordering.field": "kafka_timestamp"}
    ).settings.mutation
    assert s.ordering_column == "kafka_timestamp"


# --- values refused by their parser ---------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "piece"),
    [
        ("write.operation", "merge", "append, upsert, cdc"),
        ("cdc.format", "maxwell", "debezium, field"),
        ("cdc.op.values", "I=insert,U=upsert", "'upsert' is not one of insert, update, delete"),
        ("cdc.op.values", "I=insert,I=delete", "'I' is mapped twice"),
        ("cdc.op.values", "insert", "not of the form value=operation"),
        ("cdc.op.values", "=delete", "not of the form value=operation"),
        ("cdc.op.values", ",", "no value is mapped"),
        ("cdc.op.field", " ", "expected a field name"),
        ("table.bucket.count", "0", "positive whole number"),
        ("table.bucket.count", "2.5", "positive whole number"),
    ],
)
def test_a_bad_value_names_its_key_and_what_is_valid(key: str, value: str, piece: str) -> None:
    refused({**CDC, key: value}, key, piece)


def test_op_values_default_is_documented_and_parses() -> None:
    assert parse_op_values(DEFAULT_OP_VALUES) == {"I": INSERT, "U": UPDATE, "D": DELETE}


# --- combinations refused ---------------------------------------------------------------------


@pytest.mark.parametrize("operation", ["upsert", "cdc"])
def test_mutations_need_a_record_key_other_than_the_kafka_coordinates(operation: str) -> None:
    raw = {**BASE, "write.operation": operation}
    refused(raw, f"write.operation={operation}", "table.record.key.fields", "its own key")
    explicit = {**raw, "table.record.key.fields": "kafka_topic,kafka_partition,kafka_offset"}
    refused(explicit, "table.record.key.fields")


@pytest.mark.parametrize("operation", ["upsert", "cdc"])
def test_mutations_on_iceberg_tables_take_iceberg_write_mode(operation: str) -> None:
    raw = {**CDC, "write.operation": operation, "table.format": "iceberg"}
    assert build_config(raw).settings.mutation.operation == operation
    assert build_config(raw).settings.iceberg.write_mode == "copy-on-write"
    mor = {**raw, "iceberg.write.mode": "merge-on-read"}
    assert build_config(mor).settings.iceberg.write_mode == "merge-on-read"
    hudi_key = {**raw, "table.type": "merge_on_read"}
    refused(hudi_key, "table.type=MERGE_ON_READ", "iceberg.write.mode=merge-on-read")
    appends = {k: v for k, v in raw.items() if k != "table.record.key.fields"}
    appends["write.operation"] = "append"
    refused({**appends, "iceberg.write.mode": "merge-on-read"}, "write.operation=upsert or cdc")


@pytest.mark.parametrize("operation", ["upsert", "cdc"])
def test_mutations_of_hudi_tables_commit_synchronously_on_the_dataframe_path(
    operation: str,
) -> None:
    raw = {**CDC, "write.operation": operation}
    refused(
        {**raw, "commit.mode": "async"},
        f"write.operation={operation} on a Hudi table",
        "commit.mode=sync",
        "serves Iceberg tables of keys",
    )
    refused({**raw, "write.path": "direct"}, "write.path=direct", "write.path=auto or dataframe")
    # Iceberg tables of keys commit asynchronously too (each batch plans after the one before
    # is published: spark/sink.py), in either write mode
    iceberg = {**raw, "table.format": "iceberg", "commit.mode": "async"}
    for mode in ("copy-on-write", "merge-on-read"):
        cfg = build_config({**iceberg, "iceberg.write.mode": mode})
        assert cfg["commit.mode"] == "async" and cfg["write.operation"] == operation


def test_an_ordering_field_without_a_mutation_is_refused() -> None:
    refused({**BASE, "table.ordering.field": "version"}, "table.ordering.field", "upsert or cdc")


def test_the_ordering_field_must_be_a_column_and_not_a_key_field() -> None:
    refused(
        {**CDC, "table.ordering.field": "updated"},
        "table.ordering.field=updated",
        "not a column",
        "name, version, tags",
    )
    refused({**CDC, "table.ordering.field": "id"}, "table.ordering.field=id", "record key field")
    refused({**CDC, "table.ordering.field": "tags"}, "table.ordering.field=tags", "number")


def test_the_key_fields_must_be_columns_of_the_rows() -> None:
    refused(
        {**CDC, "table.record.key.fields": "id,tenant"},
        "table.record.key.fields names tenant",
        "id, name, version, tags",
    )
    # upsert rows hold the Kafka metadata columns too
    build_config({**CDC, "write.operation": "upsert", "table.record.key.fields": "kafka_key"})
    refused({**CDC, "write.operation": "upsert", "table.record.key.fields": "key"}, "kafka_key")


def test_cdc_reads_json_or_avro_values_only() -> None:
    raw = {**CDC, "value.format": "raw", "value.schema": None}
    refused(raw, "write.operation=cdc", "value.format=json or avro")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("transform.sql", "SELECT * FROM source"),
        ("transform.python", "m:f"),
        ("transform.arrow", "m:f"),
    ],
)
def test_cdc_refuses_a_transformation(key: str, value: str) -> None:
    refused({**CDC, key: value}, f"write.operation=cdc cannot apply {key}", "operation")


def test_upsert_with_a_transformation_leaves_the_columns_to_it() -> None:
    cfg = build_config(
        {
            **CDC,
            "write.operation": "upsert",
            "table.record.key.fields": "made_by_the_transform",
            "transform.arrow": "m:f",
        }
    )
    assert cfg.settings.mutation.operation == "upsert"


def test_the_operation_field_must_be_a_declared_column() -> None:
    raw = {**CDC, "cdc.format": "field", "cdc.op.field": "op"}
    refused(raw, "cdc.op.field=op", "value.schema")
    build_config({**raw, "value.schema": "id INT, op STRING"})


def test_declared_columns_may_not_take_the_names_of_added_columns() -> None:
    clash = {**CDC, "value.schema": "id INT, _source_position STRING"}
    refused(clash, "_source_position", "rename")
    # with an ordering field no source position is added: the name is free
    build_config({**clash, "value.schema": "id INT, v INT, _source_position STRING",
                  "table.ordering.field": "v"})  # fmt: skip
    refused({**CDC, "value.schema": "id INT, _lakesink_op INT"}, "_lakesink_op")


def test_cdc_with_avro_takes_the_row_from_the_envelopes_after_record(tmp_path: Path) -> None:
    avsc = tmp_path / "envelope.avsc"
    avsc.write_text(json.dumps(envelope_schema()))
    raw = {
        **CDC,
        "value.format": "avro",
        "value.schema": None,
        "value.schema.file": str(avsc),
        "value.avro.schema.ids": "7",
    }
    assert build_config(raw).settings.mutation.ordering_column == SOURCE_POSITION_COLUMN
    refused({**raw, "table.ordering.field": "missing"}, "not a column", "name, updated, balance")
    refused({**raw, "value.schema.file": str(tmp_path / "none.avsc")}, "cannot read")


def test_cdc_with_an_avro_schema_that_is_no_envelope_is_refused(tmp_path: Path) -> None:
    avsc = tmp_path / "flat.avsc"
    avsc.write_text(json.dumps({"type": "record", "name": "R", "fields": [
        {"name": "id", "type": "int"}]}))  # fmt: skip
    raw = {**CDC, "value.format": "avro", "value.schema": None, "value.schema.file": str(avsc),
           "value.avro.wire.format": "plain"}  # fmt: skip
    refused(raw, "not a Debezium envelope", "value.schema")
    build_config({**raw, "cdc.format": "field", "cdc.op.field": "id"})


def envelope_schema() -> dict[str, Any]:
    """A Debezium envelope's Avro schema as its Avro converter registers it (abridged)."""
    value = {
        "type": "record",
        "name": "Value",
        "namespace": "shop.public.customers",
        "fields": [
            {"name": "id", "type": "int"},
            {"name": "name", "type": ["null", "string"], "default": None},
            {
                "name": "updated",
                "type": [
                    "null",
                    {
                        "type": "long",
                        "connect.version": 1,
                        "connect.name": "io.debezium.time.MicroTimestamp",
                    },
                ],
                "default": None,
            },
            {"name": "balance", "type": ["null", "string"], "default": None},
        ],
    }
    source = {
        "type": "record",
        "name": "Source",
        "namespace": "io.debezium.connector.postgresql",
        "fields": [
            {"name": "connector", "type": "string"},
            {"name": "ts_ms", "type": "long"},
            {"name": "sequence", "type": ["null", "string"], "default": None},
            {"name": "lsn", "type": ["null", "long"], "default": None},
        ],
    }
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": "shop.public.customers",
        "fields": [
            {"name": "before", "type": ["null", value], "default": None},
            {"name": "after", "type": ["null", "shop.public.customers.Value"], "default": None},
            {"name": "source", "type": source},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": None},
        ],
    }


# --- the Change data capture page ---------------------------------------------------------------

CDC_PAGE = Path(__file__).parents[2] / "docs" / "cdc.md"


def test_the_pages_walk_through_configuration_loads_as_cdc() -> None:
    import re
    import textwrap
    import tomllib

    from lakesink.config import flatten_keys

    (block,) = re.findall(r"```toml\n(.*?)```", CDC_PAGE.read_text(), flags=re.S)
    cfg = build_config(flatten_keys(tomllib.loads(textwrap.dedent(block))))
    s = cfg.settings
    assert s.mutation.operation == "cdc" and s.mutation.ordering_column == SOURCE_POSITION_COLUMN
    assert s.table.record_key_fields == ("id",)


def test_the_page_names_every_mutation_key() -> None:
    from lakesink.config.mutation import MUTATION_KEYS

    page = CDC_PAGE.read_text()
    for key in MUTATION_KEYS:
        assert f"`{key.name}`" in page or f"`{key.name}=" in page, key.name
