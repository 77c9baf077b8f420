"""schema.field.mapping: source fields renamed to columns once, for every decoder
(lakesink.kafka.field_mapping), its errors, the keys that name columns, and the Iceberg name
mapping of the tables lakesink creates (lakesink.formats.iceberg.name_mapping)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakesink.config import build_config
from lakesink.errors import ConfigError
from lakesink.kafka.field_mapping import FieldMapping, MappedValues, mapped_values
from lakesink.kafka.json_bulk import JsonDeserializer

ROWS = pa.schema(
    [
        pa.field("userId", pa.int64()),
        pa.field("address", pa.struct([pa.field("city", pa.string()), pa.field("zip", pa.string())])),  # noqa: E501
        pa.field("items", pa.list_(pa.struct([pa.field("sku", pa.string())]))),
    ]
)  # fmt: skip
MAPPING = "userId=user_id, address=addr, address.city=town, items.sku=code"


def test_items_parse_into_one_spelling_with_column_paths_and_aliases() -> None:
    m = FieldMapping.parse(MAPPING)
    assert m.text() == "userId=user_id,address=addr,address.city=town,items.sku=code"
    assert m.column("address.city") == "addr.town" and m.column("address.zip") == "addr.zip"
    assert m.source("user_id") == "userId" and m.source("other") == "other"
    assert m.aliases() == {
        "user_id": ("userId",),
        "addr": ("address",),
        "addr.town": ("city",),
        "items.code": ("sku",),
    }
    assert not FieldMapping.parse("") and not FieldMapping.parse(None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a", "'a' is not of the form source=column"),
        ("a=", "'a=' is not of the form source=column"),
        ("a=b,c=b", "a and c both map to column b"),
        ("x.a=b,x.c=b", "x.a and x.c both map to column b"),
        ("a=b,a=c", "a is mapped twice (b, c)"),
        ("a=1st", "'1st' is not a valid column name"),
        ("a=b.c", "'b.c' is not a valid column name"),
        ("a..b=c", "'a..b' is not a field path"),
    ],
)
def test_bad_mappings_are_one_config_error_naming_the_item(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"schema\.field\.mapping") as e:
        FieldMapping.parse(text)
    assert message in str(e.value)


def test_the_same_target_under_different_parents_is_two_columns() -> None:
    m = FieldMapping.parse("a=id,address.a=id")
    assert m.column("address.a") == "address.id"


def test_a_mapped_field_landing_on_an_unmapped_one_is_refused_naming_both() -> None:
    rows = pa.schema([pa.field("userId", pa.int64()), pa.field("user_id", pa.int64())])
    with pytest.raises(ConfigError, match="fields userId and user_id both land on column user_id"):
        FieldMapping.parse("userId=user_id").rename_schema(rows)
    # swapping two names is no collision
    swapped = FieldMapping.parse("userId=user_id,user_id=userId").rename_schema(rows)
    assert swapped.names == ["user_id", "userId"]


def test_tables_are_renamed_nested_too_keeping_values_and_nulls() -> None:
    m = FieldMapping.parse(MAPPING)
    table = pa.Table.from_pylist(
        [
            {"userId": 1, "address": {"city": "Oslo", "zip": "0150"}, "items": [{"sku": "a"}]},
            {"userId": 2, "address": None, "items": None},
            {"userId": None, "address": {"city": None, "zip": "1"}, "items": []},
        ],
        schema=ROWS,
    )
    for t in (table, table.slice(1)):  # a slice keeps its offsets under the new names
        out = m.rename_table(t)
        assert out.schema == m.rename_schema(ROWS)
        assert out.schema.field("addr").type.names == ["town", "zip"]
        assert out.to_pylist() == [
            {
                "user_id": r["userId"],
                "addr": None if r["address"] is None else
                {"town": r["address"]["city"], "zip": r["address"]["zip"]},
                "items": None if r["items"] is None else [{"code": i["sku"]} for i in r["items"]],
            }
            for r in t.to_pylist()
        ]  # fmt: skip


def test_mapped_values_rename_what_any_decoder_yields_and_keep_its_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = JsonDeserializer("userId BIGINT, address STRUCT<city: STRING>")
    with caplog.at_level(logging.WARNING, logger="lakesink.kafka.field_mapping"):
        d = MappedValues(inner, FieldMapping.parse("userId=user_id,address.city=town,gone=g"))
        MappedValues(inner, FieldMapping.parse("userId=user_id,address.city=town,gone=g"))
    # a mapped field the rows lack: one warning per process, not an error
    assert [r.getMessage() for r in caplog.records if "gone" in r.getMessage()] == [
        "schema.field.mapping maps gone, which the rows do not have (fields: userId, "
        "address); it applies when a schema brings it"
    ]
    assert d.value_schema.names == ["user_id", "address"]
    out = d.decode([b'{"userId": 1, "address": {"city": "Oslo"}}', b"not json"])
    assert out.table.to_pylist() == [{"user_id": 1, "address": {"town": "Oslo"}}]
    assert list(out.failures) == [1]
    assert mapped_values(inner, FieldMapping()) is inner


# --- the configuration: keys name columns -------------------------------------------------


def _cfg(tmp_path: Path, **extra: Any) -> Any:
    return build_config(
        {
            "kafka.bootstrap.servers": "h:1",
            "kafka.topics": "t",
            "table.path": str(tmp_path / "t"),
            "value.schema": "userId BIGINT, op STRING, seq BIGINT",
            "schema.field.mapping": "userId=user_id,op=operation,seq=version",
            **extra,
        }
    )


def test_the_key_is_written_back_in_one_spelling_and_reaches_the_settings(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, **{"schema.field.mapping": " userId = user_id ,, seq=version"})
    assert cfg["schema.field.mapping"] == "userId=user_id,seq=version"
    assert cfg.settings.table.field_mapping == (("userId", "user_id"), ("seq", "version"))
    with pytest.raises(ConfigError, match=r"schema\.field\.mapping.*'1x' is not a valid column"):
        _cfg(tmp_path, **{"schema.field.mapping": "userId=1x"})


def test_record_key_and_ordering_fields_name_the_mapped_columns(tmp_path: Path) -> None:
    upsert = {"write.operation": "upsert", "table.ordering.field": "version"}
    _cfg(tmp_path, **upsert, **{"table.record.key.fields": "user_id"})
    with pytest.raises(ConfigError, match=r"table\.record\.key\.fields names userId, not column"):
        _cfg(tmp_path, **upsert, **{"table.record.key.fields": "userId"})


def test_a_change_stream_by_field_decodes_with_mapped_key_ordering_and_op(tmp_path: Path) -> None:
    from lakesink.protocol.mutation import OPERATION_COLUMN
    from lakesink.spark.source import value_deserializer

    cfg = _cfg(
        tmp_path,
        **{
            "write.operation": "cdc",
            "cdc.format": "field",
            "cdc.op.field": "operation",
            "table.record.key.fields": "user_id",
            "table.ordering.field": "version",
        },
    )
    d = value_deserializer(cfg)
    values = [b'{"userId": 7, "op": "I", "seq": 1}', b'{"userId": 7, "op": "D", "seq": 2}']
    rows = d.decode(values).table.to_pylist()
    assert [(r["user_id"], r["operation"], r["version"], r[OPERATION_COLUMN]) for r in rows] == [
        (7, "I", 1, 0),
        (7, None, 2, 2),
    ]  # a delete keeps its key and ordering columns, under their column names


def test_upsert_refuses_a_record_without_its_mapped_key(tmp_path: Path) -> None:
    from lakesink.spark.source import value_deserializer

    cfg = _cfg(tmp_path, **{"write.operation": "upsert", "table.record.key.fields": "user_id"})
    out = value_deserializer(cfg).decode([b'{"userId": null, "op": "x", "seq": 1}'])
    assert out.failures == {0: "the record key column 'user_id' is null"}


# --- the Iceberg name mapping -------------------------------------------------------------


def _table(tmp_path: Path, rows: pa.Schema, aliases: dict[str, tuple[str, ...]]) -> Any:
    from lakesink.formats.iceberg.catalog import CatalogSettings, open_catalog
    from lakesink.formats.iceberg.table import IcebergTable

    catalog = open_catalog(CatalogSettings(warehouse=str(tmp_path / "warehouse")))
    return IcebergTable.open(catalog, "ns.t", rows, aliases=aliases, evolution="add-and-widen")


def test_created_iceberg_tables_map_column_and_source_names_to_their_field_ids(
    tmp_path: Path,
) -> None:
    from pyiceberg.io.pyarrow import pyarrow_to_schema
    from pyiceberg.schema import index_by_id

    m = FieldMapping.parse(MAPPING)
    table = _table(tmp_path, m.rename_schema(ROWS), m.aliases())
    iceberg = table.pyiceberg
    prop = json.loads(iceberg.properties["schema.name-mapping.default"])
    schema = iceberg.schema()
    ids = {n: schema.find_field(n).field_id for n in ("user_id", "addr", "addr.town", "items")}
    assert prop[0] == {"names": ["user_id", "userId"], "field-id": ids["user_id"]}
    assert prop[1]["names"] == ["addr", "address"] and prop[1]["field-id"] == ids["addr"]
    assert prop[1]["fields"][0] == {"names": ["town", "city"], "field-id": ids["addr.town"]}
    # a file without field ids (another tool's) resolves by name: source names and columns alike
    for written in (ROWS, m.rename_schema(ROWS)):
        resolved = pyarrow_to_schema(written, name_mapping=iceberg.metadata.name_mapping())
        assert sorted(index_by_id(resolved)) == sorted(index_by_id(schema))
        assert resolved.find_field(written.names[0]).field_id == ids["user_id"]


def test_an_evolving_commit_gives_new_fields_their_entries_and_aliases(tmp_path: Path) -> None:
    from lakesink.formats.iceberg.evolution import plan_evolution, stage_schema
    from lakesink.formats.iceberg.on_base import transaction

    m = FieldMapping.parse("userId=user_id,countryCode=country")
    first = m.rename_schema(pa.schema([pa.field("userId", pa.int64())]))
    table = _table(tmp_path, first, m.aliases())
    wider = m.rename_schema(ROWS.append(pa.field("countryCode", pa.string())).remove(2).remove(1))
    planned = plan_evolution(table.pyiceberg, wider, "add-and-widen", table.name)
    assert planned is not None
    tx = transaction(table.pyiceberg)
    stage_schema(tx, planned.schema, table.name, table.aliases)
    tx.commit_transaction()
    table.refresh()
    prop = json.loads(table.pyiceberg.properties["schema.name-mapping.default"])
    country = table.pyiceberg.schema().find_field("country").field_id
    assert prop == [
        {"names": ["user_id", "userId"], "field-id": 1},
        {"names": ["country", "countryCode"], "field-id": country},
    ]
