"""The schema as a typed value (lakesink.engine.schema): a commit records its text only, so
Hudi's completed files and pending entries hold the same bytes whether the change carries the
Arrow half or not, and a change read back gives a schema that encodes to the same text."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from lakesink.engine import writer_state as keys
from lakesink.engine.async_commit import decode, encode
from lakesink.engine.change import SCHEMA_KEY, TableChange
from lakesink.engine.coordinator import PreparedCommit
from lakesink.engine.schema import NO_SCHEMA, TableSchema
from lakesink.formats import plugin_for
from lakesink.formats.hudi.table.avro_schema import avro_schema_for, with_meta_columns
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.timeline import encode_commit
from lakesink.protocol.instant import Action, Instant, InstantTime, State, TimelineLayout
from lakesink.protocol.offsets import TopicPartition, WriterOffsets
from lakesink.protocol.write_status import FileWrite

ROWS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])
AVRO = avro_schema_for(with_meta_columns(ROWS), "t_record")
T = InstantTime("20260101000000000")
P0 = TopicPartition("events", 0)


def _change(schema: TableSchema | str) -> TableChange:
    return TableChange(
        operation_type="INSERT",
        writes=(FileWrite("", "f0", f"f0_0-1-0_{T.value}.parquet", 3, 100),),
        schema=schema,  # type: ignore[arg-type]  # the text alone is taken too
        extra={keys.WRITER_ID_KEY: "w", keys.COMMIT_ID_KEY: "c0ffee"},
    )


def test_hudi_plugin_schema_is_the_avro_text_with_the_arrow_schema_and_no_field_ids() -> None:
    schema = plugin_for("hudi").commit_schema(ROWS, "t")
    assert schema.encode() == AVRO
    assert schema.arrow == ROWS and schema.field_ids is None


def test_iceberg_plugin_schema_has_no_text() -> None:
    schema = plugin_for("iceberg").commit_schema(ROWS, "t")
    assert schema.encode() == "" and not schema and schema.arrow == ROWS


@pytest.mark.parametrize("layout", list(TimelineLayout))
def test_hudi_commit_file_is_the_same_with_or_without_the_arrow_half(
    layout: TimelineLayout,
) -> None:
    instant = Instant(T, Action.COMMIT, State.COMPLETED)
    typed = encode_commit(layout, instant, CommitMetadata.of(_change(TableSchema(AVRO, ROWS))))
    text = encode_commit(layout, instant, CommitMetadata.of(_change(AVRO)))
    assert typed.as_dict == text.as_dict
    if layout is TimelineLayout.V1:  # (an Avro container of layout 2 has a random sync marker)
        assert typed.content == text.content
    assert typed.as_dict["extraMetadata"][SCHEMA_KEY] == AVRO


def test_pending_entry_round_trip_keeps_the_text_and_drops_the_arrow_half() -> None:
    prepared = PreparedCommit(
        instant_time=T,
        batch_id=1,
        metadata=_change(TableSchema(AVRO, ROWS)),
        base_offsets=WriterOffsets({P0: 0}),
        next_offsets=WriterOffsets({P0: 3}),
        records=3,
        files=1,
    )
    data = encode(prepared)
    assert data == encode(PreparedCommit(**{**_fields(prepared), "metadata": _change(AVRO)}))
    back = decode(data)
    assert back.metadata.schema.encode() == AVRO
    assert back.metadata.schema.arrow is None  # not rebuilt without the format
    assert back == prepared  # the Arrow half takes no part in equality
    assert encode(back) == data


def test_no_schema_records_no_key_and_field_ids_are_read_only() -> None:
    assert SCHEMA_KEY not in _change(NO_SCHEMA).extra_metadata()
    ids = {"id": 1, "name": 2}
    schema = TableSchema("", ROWS).with_field_ids(ids)
    ids["id"] = 9
    assert schema.field_ids == {"id": 1, "name": 2}
    assert schema != TableSchema("", ROWS)  # other field ids: another schema
    assert json.loads(_change(schema).to_json())["extraMetadata"] == {
        keys.WRITER_ID_KEY: "w",
        keys.COMMIT_ID_KEY: "c0ffee",
    }


def _fields(prepared: PreparedCommit) -> dict[str, object]:
    return {name: getattr(prepared, name) for name in PreparedCommit.__dataclass_fields__}


def test_iceberg_coordinator_adds_the_tables_field_ids(tmp_path: Path) -> None:
    from lakesink.formats.iceberg.catalog import CatalogSettings, open_catalog
    from lakesink.formats.iceberg.format import IcebergFormat
    from lakesink.formats.iceberg.schema import parse_partition_spec
    from lakesink.formats.iceberg.table import IcebergTable

    catalog = open_catalog(CatalogSettings(warehouse=str(tmp_path / "wh")))
    table = IcebergTable.open(catalog, ("lakesink", "t"), ROWS, parse_partition_spec(""))
    ids = IcebergFormat(table).field_ids()
    assert sorted(ids) == ["id", "name"] and sorted(ids.values()) == [1, 2]
    assert IcebergFormat(table).field_ids() == ids
