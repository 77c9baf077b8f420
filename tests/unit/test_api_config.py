"""lakesink.load_config: the configurations the Python API accepts, and what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

import lakesink
from lakesink.config import LakesinkConfig
from lakesink.errors import ConfigError

BASE = {
    "kafka.bootstrap.servers": "127.0.0.1:9092",
    "kafka.topics": "events",
    "value.format": "raw",
    "table.path": "/tmp/t",
}


def test_load_config_accepts_dotted_and_nested_mappings_alike() -> None:
    nested = {
        "kafka": {"bootstrap.servers": "127.0.0.1:9092", "topics": ["events"]},
        "value": {"format": "raw"},
        "table": {"path": "/tmp/t"},
        "metrics": {"port": 9464},
    }
    a = lakesink.load_config({**BASE, "metrics.port": "9464"})
    b = lakesink.load_config(nested)
    assert a == b
    assert a["metrics.port"] == 9464 and a["metrics.host"] == "127.0.0.1"
    assert lakesink.load_config(a) is a


def test_load_config_reads_a_toml_file_and_no_environment_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[kafka]\nbootstrap.servers = "b:9092"\ntopics = "t"\n'
        '[value]\nformat = "raw"\n[table]\npath = "/tmp/x"\n'
    )
    monkeypatch.setenv("LAKESINK_KAFKA_TOPICS", "other")
    for source in (path, str(path)):
        cfg = lakesink.load_config(source)
        assert isinstance(cfg, LakesinkConfig)
        assert cfg["kafka.topics"] == ("t",)


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({**BASE, "metrics.port": 70000}, "metrics.port=70000"),
        ({**BASE, "metrics.port": "http"}, "metrics.port='http'"),
        ({**BASE, "metrics.lag.interval.s": 0}, "metrics.lag.interval.s=0"),
        ({**BASE, "metric.port": 1}, "did you mean 'metrics.port'"),
    ],
)
def test_load_config_names_a_bad_metrics_key_and_what_is_valid(
    raw: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigError) as e:
        lakesink.load_config(raw)
    assert named in str(e.value)
    assert e.value.exit_code == 2


def test_load_config_refuses_what_is_not_a_configuration() -> None:
    with pytest.raises(ConfigError, match="not int"):
        lakesink.load_config(42)  # type: ignore[arg-type]
