"""Table config ↔ hoodie.properties, and the Java properties text format."""

from __future__ import annotations

import zlib

import pytest

from lakesink.errors import CorruptTableError, UnsupportedTableError
from lakesink.formats.hudi.table.config import TableConfig, parse_properties, render_properties
from lakesink.protocol.instant import TimelineLayout


@pytest.mark.parametrize("version", [6, 8])
def test_config_round_trips_through_properties(version: int) -> None:
    cfg = TableConfig("trips", ("id", "ts"), ("day", "hour"), version=version)  # type: ignore[arg-type]
    props = cfg.to_properties()
    assert TableConfig.from_properties(parse_properties(render_properties(props))) == cfg
    assert props["hoodie.table.version"] == str(version)
    assert props["hoodie.timeline.layout.version"] == ("2" if version == 8 else "1")
    assert props["hoodie.table.partition.fields"] == "day,hour"
    assert props["hoodie.datasource.write.hive_style_partitioning"] == "true"
    assert props["hoodie.table.timeline.timezone"] == "UTC"
    assert props["hoodie.table.recordkey.fields"] == "id,ts"
    assert props["hoodie.table.base.file.format"] == "PARQUET"
    assert props["hoodie.table.checksum"] == str(zlib.crc32(b"default.trips"))
    assert cfg.layout is (TimelineLayout.V2 if version == 8 else TimelineLayout.V1)


def test_version_8_names_the_timeline_folder() -> None:
    props = TableConfig("t", ("id",)).to_properties()
    assert props["hoodie.timeline.path"] == "timeline"
    assert "hoodie.table.partition.fields" not in props
    assert TableConfig("t", ("id",)).timeline_folder() == ".hoodie/timeline"


def test_an_unknown_table_type_is_refused_naming_valid_types() -> None:
    with pytest.raises(UnsupportedTableError, match=r"BOGUS.*COPY_ON_WRITE, MERGE_ON_READ"):
        TableConfig("t", ("id",), table_type="BOGUS")
    props = TableConfig("t", ("id",)).to_properties()
    props["hoodie.table.type"] = "BOGUS"
    with pytest.raises(UnsupportedTableError, match="COPY_ON_WRITE"):
        TableConfig.from_properties(props)


def test_merge_on_read_round_trips_with_its_merge_mode() -> None:
    cfg = TableConfig("t", ("id",), table_type="MERGE_ON_READ")
    props = cfg.to_properties()
    assert props["hoodie.table.type"] == "MERGE_ON_READ"
    assert props["hoodie.record.merge.mode"] == "COMMIT_TIME_ORDERING"
    assert TableConfig.from_properties(props) == cfg


@pytest.mark.parametrize("version", ["5", "7", "9"])
def test_other_versions_are_refused(version: str) -> None:
    props = TableConfig("t", ("id",)).to_properties()
    props["hoodie.table.version"] = version
    with pytest.raises(UnsupportedTableError, match=f"version {version}.*6 and 8"):
        TableConfig.from_properties(props)


def test_missing_table_name_is_corrupt() -> None:
    props = TableConfig("t", ("id",)).to_properties()
    del props["hoodie.table.name"]
    with pytest.raises(CorruptTableError, match=r"hoodie\.table\.name"):
        TableConfig.from_properties(props)


def test_bad_names_are_refused() -> None:
    with pytest.raises(UnsupportedTableError, match="table name"):
        TableConfig("my-table", ("id",))
    with pytest.raises(UnsupportedTableError, match="record key"):
        TableConfig("t", ())


def test_java_properties_escaping_round_trips() -> None:
    props = {"a.b": 'x=y:z\\w #1 {"k": "v"}', "empty": "", "multi": "line1\nline2"}
    text = render_properties(props)
    assert parse_properties(text) == props


def test_parse_properties_reads_what_hudi_writes() -> None:
    text = (
        "#Updated at 2024-01-01T00:00:00Z\n#Mon Jan 01 00:00:00 UTC 2024\n"
        "hoodie.table.name=trips\n"
        'hoodie.table.create.schema={"type"\\:"record"}\n'
        "hoodie.x = spaced\n"
        "hoodie.long=a\\\n    b\n"
    )
    props = parse_properties(text)
    assert props["hoodie.table.name"] == "trips"
    assert props["hoodie.table.create.schema"] == '{"type":"record"}'
    assert props["hoodie.x"] == "spaced"
    assert props["hoodie.long"] == "ab"


def test_a_table_of_another_writer_is_refused_naming_everything_lakesink_cannot_keep() -> None:
    props = TableConfig("t", ("id",), ("day",)).to_properties()
    props.update(
        {
            "hoodie.table.version": "9",
            "hoodie.table.metadata.partitions": "files,column_stats",
            "hoodie.table.keygenerator.class": "org.apache.hudi.keygen.CustomKeyGenerator",
            "hoodie.populate.meta.fields": "false",
            "hoodie.table.cdc.enabled": "true",
            "hoodie.datasource.write.partitionpath.urlencode": "true",
        }
    )
    with pytest.raises(UnsupportedTableError) as err:
        TableConfig.from_properties(props)
    msg = str(err.value)
    for named in (
        "table version 9",
        "metadata table",
        "hoodie.metadata.enable=false",
        "CustomKeyGenerator",
        "SimpleKeyGenerator",
        "hoodie.populate.meta.fields=false",
        "hoodie.table.cdc.enabled=true",
        "hoodie.datasource.write.partitionpath.urlencode=true",
    ):
        assert named in msg


def test_a_key_generator_that_makes_other_keys_than_lakesink_is_refused() -> None:
    props = TableConfig("t", ("id",), ("day",)).to_properties()
    props["hoodie.table.keygenerator.class"] = "org.apache.hudi.keygen.ComplexKeyGenerator"
    with pytest.raises(UnsupportedTableError, match=r"ComplexKeyGenerator.*\['id'\]"):
        TableConfig.from_properties(props)
    props["hoodie.table.keygenerator.class"] = "org.apache.hudi.keygen.SimpleKeyGenerator"
    assert TableConfig.from_properties(props).record_key_fields == ("id",)
