"""KafkaServer's configuration without starting Java: properties, listeners, missing pieces."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakesink.errors import ConfigError
from lakesink.kafka.kafka_server import (
    LIB_ENV,
    KafkaServer,
    kafka_lib_dir,
    local_broker,
    new_cluster_id,
)


def test_missing_jars_are_a_config_error_naming_the_folder_and_the_setup_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(LIB_ENV, raising=False)
    monkeypatch.setenv("LAKESINK_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError) as e:
        kafka_lib_dir()
    assert str(tmp_path / "cache" / "kafka" / "lib") in str(e.value)
    assert "scripts/setup-kafka.sh" in str(e.value) and LIB_ENV in str(e.value)


def test_lib_folder_from_the_environment_is_used_when_it_holds_the_broker_jar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LIB_ENV, str(tmp_path))
    with pytest.raises(ConfigError, match=str(tmp_path)):
        kafka_lib_dir()
    (tmp_path / "kafka_2.13-4.3.1.jar").write_bytes(b"")
    assert kafka_lib_dir() == tmp_path


def test_properties_are_one_combined_kraft_node_on_loopback_with_replication_factor_one(
    tmp_path: Path,
) -> None:
    server = KafkaServer(data_dir=tmp_path)
    props = server.properties()
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == (
        f"PLAINTEXT://127.0.0.1:{server.port},CONTROLLER://127.0.0.1:{server.ports['CONTROLLER']}"
    )
    assert props["advertised.listeners"] == f"PLAINTEXT://127.0.0.1:{server.port}"
    assert props["controller.quorum.bootstrap.servers"] == server.address("controller")
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
    ):
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["log.dirs"] == str(tmp_path / "kraft-logs")


def test_extra_listeners_and_server_properties_are_added_and_override_defaults(
    tmp_path: Path,
) -> None:
    server = KafkaServer(
        data_dir=tmp_path,
        extra_listeners={"sasl_ssl": "SASL_SSL"},
        server_properties={"num.partitions": "3", "sasl.enabled.mechanisms": "SCRAM-SHA-512"},
    )
    props = server.properties()
    port = server.ports["SASL_SSL"]
    assert f"SASL_SSL://127.0.0.1:{port}" in props["listeners"].split(",")
    assert f"SASL_SSL://127.0.0.1:{port}" in props["advertised.listeners"].split(",")
    assert "SASL_SSL:SASL_SSL" in props["listener.security.protocol.map"].split(",")
    assert props["num.partitions"] == "3"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert server.address("sasl_ssl") == f"127.0.0.1:{port}"
    assert len(set(server.ports.values())) == 3


def test_an_extra_listener_may_not_take_a_reserved_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="CONTROLLER"):
        KafkaServer(data_dir=tmp_path, extra_listeners={"controller": "SSL"})


def test_cluster_ids_are_22_url_safe_characters_not_starting_with_a_dash() -> None:
    ids = {new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(len(i) == 22 and not i.startswith("-") and "=" not in i for i in ids)


def test_an_unknown_broker_kind_names_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="kafka, noida"):
        local_broker("redpanda")
