"""Configuration: defaults, file formats, overrides, and errors that name the key."""

import re
from pathlib import Path

import pytest

from lakesink.config import KEYS, build_config, load_config, render_reference
from lakesink.errors import ConfigError

BASE = {
    "kafka.bootstrap.servers": "127.0.0.1:9092",
    "kafka.topics": "events",
    "value.schema": "id BIGINT",
    "table.path": "/tmp/t",
}


def test_defaults_fill_every_key() -> None:
    cfg = build_config(BASE)
    assert cfg["kafka.topics"] == ("events",)
    assert cfg["commit.mode"] == "sync"
    assert cfg.writer_id == "t.events"


def test_bad_choice_names_key_and_valid_values() -> None:
    with pytest.raises(ConfigError, match=r"commit\.mode='maybe'.*sync, async"):
        build_config({**BASE, "commit.mode": "maybe"})


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("topics", "kafka.topics"),  # the same last part
        ("kafka.topic", "kafka.topics"),  # a letter left out: not errors.deadletter.topic
        ("kafka.bootstrap.server", "kafka.bootstrap.servers"),
        ("kafka.topics.pattern", "kafka.topic.pattern"),
        ("errors.deadletter.tabel", "errors.deadletter.table"),
        ("hudi.version", "table.version"),
    ],
)
def test_unknown_key_suggests_the_key_it_most_likely_means(typed: str, meant: str) -> None:
    with pytest.raises(
        ConfigError, match=rf"{re.escape(repr(typed))} \(did you mean {re.escape(repr(meant))}\?\)"
    ):
        build_config({**BASE, typed: "x"})


def test_unknown_key_far_from_every_key_gets_no_suggestion() -> None:
    with pytest.raises(ConfigError) as e:
        build_config({**BASE, "zzz": "x"})
    assert "did you mean" not in str(e.value)


def test_missing_required_key_is_named() -> None:
    raw = dict(BASE)
    del raw["table.path"]
    with pytest.raises(ConfigError, match=r"table\.path is required"):
        build_config(raw)


def test_json_needs_a_schema() -> None:
    raw = dict(BASE)
    del raw["value.schema"]
    with pytest.raises(ConfigError, match=r"value\.schema"):
        build_config(raw)


def test_dead_letter_tolerance_needs_a_topic() -> None:
    with pytest.raises(ConfigError, match=r"errors\.deadletter\.topic"):
        build_config({**BASE, "errors.tolerance": "all"})


def test_toml_nested_tables_env_and_overrides(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text(
        '[kafka]\nbootstrap.servers = "h:1"\ntopics = ["a", "b"]\n'
        '[value]\nschema = "id BIGINT"\n[table]\npath = "/x"\nversion = 6\n'
    )
    cfg = load_config(
        f, {"table.version": "8"}, environ={"LAKESINK_KAFKA_BOOTSTRAP_SERVERS": "e:2"}
    )
    assert cfg["kafka.topics"] == ("a", "b")
    assert cfg["kafka.bootstrap.servers"] == "e:2"
    assert cfg["table.version"] == 8


def test_yaml_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(
        "kafka:\n  bootstrap.servers: h:1\n  topics: a\nvalue.schema: id BIGINT\ntable.path: /x\n"
    )
    assert load_config(f)["kafka.topics"] == ("a",)


def test_garbled_file_names_the_file(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text("kafka = [")
    with pytest.raises(ConfigError, match=r"bad\.toml is not valid TOML"):
        load_config(f)


def test_reference_documents_every_key() -> None:
    ref = render_reference()
    assert all(f"`{k.name}`" in ref for k in KEYS)


def test_checked_in_reference_is_current() -> None:
    doc = Path(__file__).parents[2] / "docs" / "configuration.md"
    assert doc.read_text() == render_reference(), (
        "run: lakesink config docs --markdown > docs/configuration.md"
    )


@pytest.mark.parametrize(
    ("key", "value", "valid"),
    [
        ("kafka.max.records.per.batch", 2.5, "positive whole number"),
        ("kafka.max.records.per.batch", "2.5", "positive whole number"),
        ("kafka.max.records.per.task", "1e3", "positive whole number"),
        ("kafka.max.records.per.task", True, "positive whole number"),
        ("table.version", 8.5, "6 or 8"),
        ("table.version", "8.5", "6 or 8"),
        ("table.services.inline.every.commits", 0.5, "0 or a positive whole number"),
        ("table.services.clustering.tier.ratio", 1, "0 (no tiers) or a whole number of at least 2"),
        ("table.services.clustering.tier.ratio", -8, "0 or a positive whole number"),
    ],
)
def test_integer_key_refuses_a_non_integral_value_naming_key_value_and_what_is_valid(
    key: str, value: object, valid: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config({**BASE, key: value})
    message = str(caught.value)
    assert f"{key}={value!r} is not valid" in message and valid in message


@pytest.mark.parametrize(("value", "parsed"), [(8, 8), (8.0, 8), ("8", 8), (" 6 ", 6)])
def test_integer_key_takes_whole_numbers_in_any_spelling(value: object, parsed: int) -> None:
    assert build_config({**BASE, "table.version": value})["table.version"] == parsed


def test_setting_lists_keep_commas_inside_a_value() -> None:
    # a new setting starts only at ",name=": jar lists, Java options and cipher lists survive
    cfg = build_config(
        {
            **BASE,
            "spark.conf": "spark.jars=/a.jar,/b.jar,spark.driver.extraJavaOptions=-Dx=1,-Dy=2,"
            "spark.sql.shuffle.partitions=4",
            "kafka.client.config": "socket.timeout.ms=5,ssl.cipher.suites=A-B,C-D",
            "kafka.security.protocol": "plaintext",
        }
    )
    assert cfg.spark_conf == {
        "spark.jars": "/a.jar,/b.jar",
        "spark.driver.extraJavaOptions": "-Dx=1,-Dy=2",
        "spark.sql.shuffle.partitions": "4",
    }
    assert cfg.kafka_client_config["ssl.cipher.suites"] == "A-B,C-D"


def test_setting_list_without_key_value_is_named() -> None:
    with pytest.raises(ConfigError, match=r"spark\.conf.*'nonsense' is not of the form key=value"):
        build_config({**BASE, "spark.conf": "nonsense"})
