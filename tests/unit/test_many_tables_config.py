"""The `tables.<name>.*` section of a many-table ingestion (lakesink.config.tables): keys from
a file's nested sections and from flat `--set` keys alike, each table's configuration over the
top-level defaults, the clear errors; and the offsets arithmetic of recovery per table
(lowest committed over the tables, a table's ranges after its own position)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from lakesink.config import ConfigError, build_config, read_config_file
from lakesink.config.tables import Route
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets
from lakesink.spark.batch import ranges_after
from lakesink.spark.table_offsets import lowest_committed

BASE = {
    "kafka.bootstrap.servers": "localhost:9092",
    "kafka.topics": "orders,payments",
    "value.format": "json",
    "value.schema": "id BIGINT, region STRING",
}

TOML = """
"kafka.bootstrap.servers" = "localhost:9092"
"kafka.topics" = "orders,payments"
"value.format" = "json"
"value.schema" = "id BIGINT, region STRING"
"table.partition.by" = "region"
"route.default" = "rest"

[tables.orders]
table.path = "/data/orders"
route.topics = ["orders"]

[tables.europe]
table.path = "/data/warehouse"
table.format = "iceberg"
route.field = "region"
route.regex = "eu-.*"

[tables.rest]
table.path = "/data/rest"
table.partition.by = ""
"""


def _cfg(**tables: dict[str, Any]) -> Any:
    raw: dict[str, Any] = dict(BASE)
    for name, keys in tables.items():
        raw.update({f"tables.{name}.{k}": v for k, v in keys.items()})
    return build_config(raw)


def test_a_files_sections_and_flat_keys_give_the_same_tables(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(TOML)
    from_file = build_config(read_config_file(path))
    flat = {k: v for k, v in tomllib.loads(TOML).items() if k != "tables"}
    for name, keys in tomllib.loads(TOML)["tables"].items():
        for group, inner in keys.items():
            flat.update({f"tables.{name}.{group}.{k}": v for k, v in inner.items()})
    assert build_config(flat).table_specs == from_file.table_specs
    tables = {spec.name: (spec, cfg) for spec, cfg in from_file.table_configs()}
    assert list(tables) == ["europe", "orders", "rest"]  # commit order: by name
    europe, europe_cfg = tables["europe"]
    assert europe.route == Route(field="region", regex="eu-.*")
    assert europe_cfg["table.format"] == "iceberg"
    assert europe_cfg["table.partition.by"] == ("region",)  # the top-level default
    assert tables["rest"][1]["table.partition.by"] == ()  # its own
    assert tables["orders"][0].route.topics == ("orders",)
    # one writer over every table, each keeping that writer's offsets
    assert {cfg.writer_id for _, cfg in tables.values()} == {from_file.writer_id}
    assert not any(cfg["tables"] for _, cfg in tables.values())


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (
            {"a": {"table.path": "/t/a", "kafka.topics": "x"}},
            r"tables\.a\.kafka\.topics: .*top level",
        ),
        (
            {"a": {"table.path": "/t/a", "table.formt": "x"}},
            r"tables\.a\.table\.formt: unknown key",
        ),
        ({"a": {"table.path": "/t/a", "route.regex": "("}}, r"tables\.a\.route\.regex=.*regular"),
        ({"a": {"table.path": "/t/a", "route.regex": "x"}}, r"route\.field and route\.regex go"),
        (
            {"a": {"table.path": "/t/a", "route.topics": "x", "route.topic.pattern": "y"}},
            "only one",
        ),
        ({"a.b": {"table.path": "/t/a"}}, r"unknown key 'b.table.path'"),
        (
            {"a": {"table.path": "/t/a"}, "b": {"table.format": "hudi"}},
            r"tables\.b\.table\.path is required",
        ),
        ({"a": {"table.path": "/t/a"}, "b": {"table.path": "/t/a"}}, "are the same table"),
        ({"a": {"table.path": "/t/a", "table.format": "parquet"}}, r"tables\.a: table\.format="),
        (
            {
                "a": {
                    "table.path": "/t/a",
                    "write.operation": "cdc",
                    "table.record.key.fields": "id",
                }
            },
            "decoded for the whole ingestion",
        ),
    ],
)
def test_a_bad_table_key_is_named_with_what_is_valid(keys: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _cfg(**keys)


def test_what_many_tables_cannot_combine_with_is_refused() -> None:
    tables = {"tables.a.table.path": "/t/a", "tables.b.table.path": "/t/b"}
    with pytest.raises(ConfigError, match=r"route\.default='c' is not a table; .*a, b"):
        build_config({**BASE, **tables, "route.default": "c"})
    with pytest.raises(ConfigError, match=re.escape("commit.mode=async commits one table")):
        build_config({**BASE, **tables, "commit.mode": "async"})
    with pytest.raises(ConfigError, match=re.escape("write.path=direct cannot route to dynamic")):
        build_config(
            {
                **BASE,
                **tables,
                "write.path": "direct",
                "route.dynamic.field": "region",
                "route.dynamic.path": "/t/{table}",
            }
        )
    with pytest.raises(
        ConfigError, match=re.escape("route.default routes records among the tables")
    ):
        build_config({**BASE, "table.path": "/t/x", "route.default": "a"})


def test_the_checkpoint_of_many_tables_is_where_the_first_tables_would_be() -> None:
    cfg = _cfg(b={"table.path": "/t/b"}, a={"table.path": "/t/a"})
    assert str(cfg.checkpoint_location).startswith("/t/a/.hoodie/.lakesink/checkpoints/")


def test_a_route_takes_topics_by_name_or_pattern_or_every_one() -> None:
    assert Route(topics=("a",)).takes_topic("a") and not Route(topics=("a",)).takes_topic("ab")
    assert Route(topic_pattern="a.*").takes_topic("ab")
    assert not Route(topic_pattern="a").takes_topic("ab")  # in full
    assert Route().takes_everything and Route(field="f", regex="x").takes_topic("any")


A, B = TopicPartition("t", 0), TopicPartition("t", 1)


def test_the_writer_starts_at_the_lowest_offsets_committed_over_its_tables() -> None:
    ahead = WriterOffsets({A: 300, B: 50})
    behind = WriterOffsets({A: 200})
    # B: one table never committed it, so it starts where kafka.starting.offsets says
    assert lowest_committed([ahead, behind]) == WriterOffsets({A: 200})
    assert lowest_committed([ahead]) == ahead
    assert lowest_committed([]) == WriterOffsets.empty()


def test_a_table_ahead_takes_each_range_from_its_own_position() -> None:
    ranges = [OffsetRange(A, 200, 300), OffsetRange(B, 0, 100)]
    committed = WriterOffsets({A: 250, B: 100})
    assert ranges_after(committed, ranges) == [OffsetRange(A, 250, 300)]  # B's is done
    assert ranges_after(WriterOffsets({A: 200}), ranges) == ranges
    assert ranges_after(WriterOffsets({A: 300, B: 150}), ranges) == []


def test_dynamic_tables_are_hudi_tables_at_the_template_with_the_top_level_keys() -> None:
    cfg = _cfg(rest={"table.path": "/t/rest"}).with_overrides(
        {"route.dynamic.field": "tenant", "route.dynamic.path": "s3://b/tables/{table}"}
    )
    spec, table = cfg.dynamic_table_config("acme-1")
    assert table["table.path"] == "s3://b/tables/acme-1" and table.writer_id == cfg.writer_id
    assert spec.route == Route(field="tenant", regex=re.escape("acme-1"))
    assert re.fullmatch(spec.route.regex or "", "acme-1")
    assert not re.fullmatch(spec.route.regex or "", "acme_1")
    assert re.fullmatch(cfg["route.dynamic.allow"], "acme-1")
    assert not re.fullmatch(cfg["route.dynamic.allow"], "not/allowed")


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"route.dynamic.field": "t"}, r"route\.dynamic\.path=None: expected .*/\{table\}"),
        ({"route.dynamic.field": "t", "route.dynamic.path": "/d/{table}/x"}, "ending in"),
        ({"route.dynamic.path": "/d/{table}"}, "needs route.dynamic.field"),
    ],
)
def test_a_bad_dynamic_route_is_named(keys: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_config({**BASE, "tables.rest.table.path": "/t/rest", **keys})


def test_dynamic_routes_need_a_named_table() -> None:
    with pytest.raises(ConfigError, match=r"route\.dynamic\.field routes records among the tables"):
        build_config(
            {
                **BASE,
                "table.path": "/t/x",
                "route.dynamic.field": "t",
                "route.dynamic.path": "/d/{table}",
            }
        )


def test_dynamic_iceberg_tables_are_named_tables_of_the_templates_warehouse() -> None:
    cfg = _cfg(rest={"table.path": "/t/rest", "table.format": "hudi"}).with_overrides(
        {
            "table.format": "iceberg",
            "iceberg.namespace": "tenants",
            "route.dynamic.field": "tenant",
            "route.dynamic.path": "/data/warehouse/{table}",
        }
    )
    spec, table = cfg.dynamic_table_config("acme-1")
    assert table["table.format"] == "iceberg" and table["table.path"] == "/data/warehouse"
    assert table.table_name == "acme-1" and table["iceberg.namespace"] == "tenants"
    assert spec.route == Route(field="tenant", regex=re.escape("acme-1"))
    where = cfg.dynamic_location_config()  # what the catalog is listed from
    assert where["table.path"] == "/data/warehouse" and where["table.format"] == "iceberg"


def test_dynamic_tables_are_found_again_less_the_tables_of_the_section(tmp_path: Path) -> None:
    from lakesink.spark.table_offsets import dynamic_table_names, is_named_table, named_tables

    tenants = tmp_path / "tenants"
    for name in ("acme", "globex", "rest", "bad name", "empty"):
        (tenants / name).mkdir(parents=True)
    for name in ("acme", "globex", "rest", "bad name"):  # Hudi tables (but "empty")
        (tenants / name / ".hoodie").mkdir()
        (tenants / name / ".hoodie" / "hoodie.properties").write_text("hoodie.table.name=x\n")
    cfg = _cfg(
        rest={"table.path": str(tenants / "rest")}, europe={"table.path": "/w", "table.name": "eu"}
    ).with_overrides(
        {"route.dynamic.field": "tenant", "route.dynamic.path": str(tenants / "{table}")}
    )
    # "rest" is a table of the section; "bad name" is refused by route.dynamic.allow
    assert dynamic_table_names(cfg) == ["acme", "globex"]
    named = named_tables(cfg)
    assert is_named_table(cfg.dynamic_table_config("rest")[1], "rest", named)
    assert not is_named_table(cfg.dynamic_table_config("acme")[1], "acme", named)
    # an Iceberg table of the section in the dynamic tables' warehouse, under another name
    iceberg = _cfg(
        rest={"table.path": "/t/rest", "table.format": "hudi"},
        europe={"table.path": "/w", "table.name": "eu"},
    ).with_overrides(
        {
            "table.format": "iceberg",
            "route.dynamic.field": "tenant",
            "route.dynamic.path": "/w/{table}",
        }
    )
    named = named_tables(iceberg)
    assert is_named_table(iceberg.dynamic_table_config("eu")[1], "eu", named)
    assert not is_named_table(iceberg.dynamic_table_config("acme")[1], "acme", named)
    # nothing created yet: no catalog, no dynamic table
    assert (
        dynamic_table_names(
            iceberg.with_overrides({"route.dynamic.path": f"{tmp_path}/w/{{table}}"})
        )
        == []
    )
