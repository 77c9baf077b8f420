"""Change streams through a schema registry (lakesink.kafka.registry_changes and the cdc half of
spark.registry_columns) against confluent-kafka's mock registry: Debezium's Avro envelopes, each
decoded with its own writer schema, read as the hand-given envelope path reads them; the row
pinned from the subject's latest envelope; the subject name strategies."""

from __future__ import annotations

import copy
import json
import pickle
import re
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, record_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from test_change_deserializer import _msg, _reader
from test_mutation_config import envelope_schema

from lakesink.config import build_config
from lakesink.errors import ConfigError
from lakesink.kafka.changes import ChangeDeserializer
from lakesink.kafka.dead_letters import FailedRecord
from lakesink.kafka.registry import RegistrySettings, registry_client
from lakesink.kafka.registry_subjects import SubjectNaming, subject_for
from lakesink.protocol.mutation import OPERATION_COLUMN, SOURCE_POSITION_COLUMN, RowOperation
from lakesink.spark.registry_columns import pin_registry_columns, registry_columns
from lakesink.spark.source import value_deserializer

TOPIC = "shop.public.customers"
ENVELOPE = "shop.public.customers.Envelope"
INSERT, UPDATE, DELETE = (op.code for op in RowOperation)
SOURCE = {"connector": "postgresql", "ts_ms": 1, "sequence": '["10","20"]', "lsn": 20}
ADA = {"id": 1, "name": "Ada", "updated": 1_700_000_000_000_001, "balance": "2.50"}


def _url() -> str:
    return f"mock://{uuid.uuid4().hex}"


def _client(url: str) -> Any:
    return registry_client(RegistrySettings(url=url, retry_s=1))


def _config(url: str, **values: Any) -> Any:
    raw: dict[str, Any] = {
        "kafka.bootstrap.servers": "127.0.0.1:9092",
        "kafka.topics": TOPIC,
        "table.path": "/t",
        "write.operation": "cdc",
        "table.record.key.fields": "id",
        "value.format": "avro",
        "schema.registry.url": url,
        "schema.registry.retry.s": 1,
    }
    raw.update(values)
    return build_config(raw)


def _serializer(url: str, schema: dict[str, Any], **conf: Any) -> Any:
    """Framed change events of `schema`, registered at once (as Debezium's converter does with
    its first event)."""
    serializer = AvroSerializer(_client(url), json.dumps(schema), conf=conf or None)

    def framed(op: str, row: dict[str, Any]) -> bytes:
        side = "before" if op == "d" else "after"
        event = {"before": None, "after": None, side: row, "source": SOURCE, "op": op}
        out = serializer(event, SerializationContext(TOPIC, MessageField.VALUE))
        assert out is not None
        return bytes(out)

    framed("c", ADA)
    return framed


def _with_email(schema: dict[str, Any]) -> dict[str, Any]:
    """The envelope after a column was added to the database's table."""
    out = copy.deepcopy(schema)
    row = out["fields"][0]["type"][1]
    row["fields"].append({"name": "email", "type": ["null", "string"], "default": None})
    return out


def test_debezium_envelopes_through_the_registry_read_as_hand_given_ones(tmp_path: Path) -> None:
    url = _url()
    framed = _serializer(url, envelope_schema())
    values = [
        framed("c", ADA),
        framed("u", {**ADA, "name": "Ada L.", "balance": "3.00"}),
        framed("d", {"id": 1, "name": None, "updated": None, "balance": None}),
        None,  # the tombstone after the delete
        b"\x00\x00\x00\x10\x92" + framed("c", ADA)[5:],  # framed with an id nobody registered
        framed("t", ADA),
    ]
    pinned = pin_registry_columns(_config(url), [TOPIC])
    d = value_deserializer(pinned)
    assert isinstance(d, ChangeDeserializer)
    assert d.row_schema.names == ["id", "name", "updated", "balance"]  # the envelope's `after`
    out = d.decode(values)
    assert out.skipped == {3}
    assert "schema id 4242 is not in the registry" in out.failures[4]
    assert "truncate" in out.failures[5]
    assert set(out.failures) == {4, 5}
    assert out.table.column(OPERATION_COLUMN).to_pylist() == [INSERT, UPDATE, DELETE]
    assert out.table.column("name").to_pylist() == ["Ada", "Ada L.", None]
    assert out.table.column(SOURCE_POSITION_COLUMN)[0].as_py() == f"{10:016x}{20:016x}"

    # the same values through the envelope schema given by hand, with the id it is registered
    # under: one decoder of envelopes, one result
    schema_id = int.from_bytes(values[0][1:5], "big")
    avsc = tmp_path / "envelope.avsc"
    avsc.write_text(json.dumps(envelope_schema()))
    by_hand = value_deserializer(
        build_config(
            {
                "kafka.bootstrap.servers": "127.0.0.1:9092",
                "kafka.topics": TOPIC,
                "table.path": "/t",
                "write.operation": "cdc",
                "table.record.key.fields": "id",
                "value.format": "avro",
                "value.schema.file": str(avsc),
                "value.avro.schema.ids": str(schema_id),
            }
        )
    ).decode(values[:4])
    assert by_hand.table.equals(d.decode(values[:4]).table)


def test_an_unknown_id_is_a_dead_letter_and_a_tombstone_is_skipped() -> None:
    url = _url()
    framed = _serializer(url, envelope_schema())
    d = value_deserializer(pin_registry_columns(_config(url), [TOPIC]))
    dead: list[FailedRecord] = []
    reader = _reader(d, "all", dead)
    unknown = b"\x00\x00\x00\x10\x92" + framed("c", ADA)[5:]
    (batch,) = reader._emit([_msg(0, framed("c", ADA)), _msg(1, None), _msg(2, unknown)])
    assert batch.column("kafka_offset").to_pylist() == [0]
    assert [f.offset for f in dead] == [2]
    assert "schema id 4242 is not in the registry" in (dead[0].error or "")
    assert reader.stats.records_skipped == 1


def test_declared_ddl_columns_take_each_writer_schemas_timestamp_unit() -> None:
    url = _url()
    framed = _serializer(url, envelope_schema())
    ddl = "id INT, balance DECIMAL(10,2), updated TIMESTAMP"
    d = value_deserializer(_config(url, **{"value.schema": ddl}))
    out = d.decode([framed("r", ADA)])
    assert out.failures == {}
    assert out.table.column("balance").to_pylist() == [Decimal("2.50")]
    # io.debezium.time.MicroTimestamp, from the writer schema's connect.name
    assert out.table.column("updated")[0].as_py().timestamp() == pytest.approx(1_700_000_000.000001)


def test_a_newer_row_than_the_pinned_one_is_a_bad_record_unless_ddl_declares_the_columns() -> None:
    url = _url()
    old = _serializer(url, envelope_schema())
    pinned = value_deserializer(pin_registry_columns(_config(url), [TOPIC]))
    new = _serializer(url, _with_email(envelope_schema()))  # registered while the run goes on
    values = [old("c", ADA), new("c", {**ADA, "id": 2, "email": "ada@example.com"})]
    out = pinned.decode(values)
    assert out.table.column("id").to_pylist() == [1]
    assert "field 'email'" in out.failures[1] and "table of keys" in out.failures[1]
    # declared as a DDL, the columns are those to keep: the new field is ignored
    declared = value_deserializer(_config(url, **{"value.schema": "id INT, name STRING"}))
    assert declared.decode(values).table.column("id").to_pylist() == [1, 2]
    # a run started after the change pins the latest envelope, the new column with it
    restarted = value_deserializer(pin_registry_columns(_config(url), [TOPIC]))
    assert "email" in restarted.row_schema.names
    assert restarted.decode(values).failures == {}


def test_the_deserializer_travels_to_tasks_without_its_cache() -> None:
    url = _url()
    framed = _serializer(url, envelope_schema())
    d = value_deserializer(pin_registry_columns(_config(url), [TOPIC]))
    d.decode([framed("c", ADA)])  # fills the cache of writer schemas
    copied = pickle.loads(pickle.dumps(d))
    assert copied.decode([framed("c", ADA)]).table.equals(d.decode([framed("c", ADA)]).table)


def test_cdc_through_the_registry_refuses_what_it_cannot_read() -> None:
    url = _url()
    with pytest.raises(ConfigError, match=re.escape("set value.format=avro, not protobuf")):
        _config(url, **{"value.format": "protobuf"})
    flat = {"type": "record", "name": "Flat", "fields": [{"name": "id", "type": "int"}]}
    _client(url).register_schema(f"{TOPIC}-value", Schema(json.dumps(flat), "AVRO"))
    with pytest.raises(ConfigError, match="is not a Debezium envelope") as refused:
        pin_registry_columns(_config(url), [TOPIC])
    assert f"subject {TOPIC}-value" in str(refused.value)
    with pytest.raises(ConfigError, match="has no subject other-value"):
        pin_registry_columns(_config(url, **{"kafka.topics": "other"}), ["other"])


def test_operation_field_records_through_the_registry_take_the_latest_record_as_row() -> None:
    url = _url()
    record = {
        "type": "record",
        "name": "Account",
        "namespace": "bank",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "Op", "type": "string"},
            {"name": "balance", "type": ["null", "long"], "default": None},
        ],
    }
    serializer = AvroSerializer(_client(url), json.dumps(record))
    ctx = SerializationContext(TOPIC, MessageField.VALUE)
    values = [
        serializer({"id": i, "Op": op, "balance": b}, ctx)
        for i, op, b in ((1, "I", 5), (1, "U", 7), (2, "D", None), (3, "X", 1))
    ]
    keys = {"cdc.format": "field", "cdc.op.field": "Op"}
    d = value_deserializer(pin_registry_columns(_config(url, **keys), [TOPIC]))
    assert d.row_schema.names == ["id", "Op", "balance"]
    out = d.decode(values)
    assert out.table.column(OPERATION_COLUMN).to_pylist() == [INSERT, UPDATE, DELETE]
    assert out.table.column("balance").to_pylist() == [5, 7, None]
    assert "'X', not one of D, I, U" in out.failures[3]
    with pytest.raises(ConfigError, match=re.escape("cdc.op.field=op is not a column")):
        value_deserializer(pin_registry_columns(_config(url, **{"cdc.format": "field"}), [TOPIC]))


# --- subject name strategies ----------------------------------------------------------------


def test_each_strategy_names_the_subject_as_the_registry_clients_do() -> None:
    assert subject_for(TOPIC) == f"{TOPIC}-value"
    assert SubjectNaming("record", ENVELOPE).subject(TOPIC) == ENVELOPE
    assert SubjectNaming("topic-record", ENVELOPE).subject(TOPIC) == f"{TOPIC}-{ENVELOPE}"
    with pytest.raises(ConfigError, match=re.escape("needs schema.registry.record.name")):
        _config(_url(), **{"schema.registry.subject.strategy": "topic-record"})
    with pytest.raises(
        ConfigError, match=re.escape("applies to schema.registry.subject.strategy record")
    ):
        _config(_url(), **{"schema.registry.record.name": ENVELOPE})


@pytest.mark.parametrize(
    ("strategy", "subject"),
    [("record", ENVELOPE), ("topic-record", f"{TOPIC}-{ENVELOPE}")],
)
def test_record_strategies_find_the_columns_under_their_subject(
    strategy: str, subject: str
) -> None:
    url = _url()
    keys = {"schema.registry.subject.strategy": strategy, "schema.registry.record.name": ENVELOPE}
    _client(url).register_schema(subject, Schema(json.dumps(envelope_schema()), "AVRO"))
    pinned = value_deserializer(pin_registry_columns(_config(url, **keys), [TOPIC]))
    assert pinned.row_schema.names == ["id", "name", "updated", "balance"]
    with pytest.raises(ConfigError, match=f"has no subject {TOPIC}-value"):
        pin_registry_columns(_config(url), [TOPIC])  # the topic strategy looks elsewhere
    # plain values too: the columns of a table created from the registry
    url = _url()
    plain = {"write.operation": "append", "table.record.key.fields": None, **keys}
    row = envelope_schema()["fields"][0]["type"][1]
    _client(url).register_schema(subject, Schema(json.dumps(_flat(row)), "AVRO"))
    columns = registry_columns(_config(url, **plain), [TOPIC])
    assert columns is not None and columns.names == ["id", "name", "updated", "balance"]


def test_the_record_strategy_matches_the_serializers_subject() -> None:
    url = _url()
    conf = {"subject.name.strategy": record_subject_name_strategy}
    framed = _serializer(url, envelope_schema(), **conf)
    keys = {"schema.registry.subject.strategy": "record", "schema.registry.record.name": ENVELOPE}
    d = value_deserializer(pin_registry_columns(_config(url, **keys), [TOPIC]))
    assert d.decode([framed("c", ADA)]).table.column("id").to_pylist() == [1]


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """The row record on its own, as a plain (non-change) value schema."""
    return {**row, "name": "Customer", "namespace": "shop"}
