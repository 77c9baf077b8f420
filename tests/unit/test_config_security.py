"""Kafka security keys: secrets from env/file, masked everywhere, mapped onto every client."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from lakesink.cli.main import main
from lakesink.config import build_config, load_config
from lakesink.errors import ConfigError, KafkaAuthenticationError, KafkaAuthorizationError
from lakesink.kafka.security import ClientErrors, client_config, security_error
from lakesink.security import Secret, masked, resolve_secret, reveal_all

PASSWORD = "pw-Zq81-never-printed"

BASE = {
    "kafka.bootstrap.servers": "127.0.0.1:9093",
    "kafka.topics": "events",
    "value.schema": "id BIGINT",
    "table.path": "/tmp/t",
}


def _sasl(ca: Path, password: str = PASSWORD, **more: Any) -> dict[str, Any]:
    return {
        **BASE,
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "scram-sha-512",
        "kafka.sasl.username": "lakesink",
        "kafka.sasl.password": password,
        "kafka.ssl.ca.location": str(ca),
        **more,
    }


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    f = tmp_path / "ca.pem"
    f.write_text("-----BEGIN CERTIFICATE-----\n")
    return f


def test_secret_repr_str_and_format_show_only_the_source() -> None:
    s = Secret(PASSWORD, "env:KAFKA_PW")
    for shown in (repr(s), str(s), f"{s}", f"{s:>10}", repr([s]), repr({"k": s})):
        assert PASSWORD not in shown
    assert "env:KAFKA_PW" in repr(s)
    assert s.reveal() == PASSWORD
    assert pickle.loads(pickle.dumps(s)) == s


def test_secret_resolves_env_reference_at_load() -> None:
    s = resolve_secret("env:KAFKA_PW", {"KAFKA_PW": PASSWORD})
    assert (s.reveal(), s.source) == (PASSWORD, "env:KAFKA_PW")


def test_secret_resolves_file_reference_without_trailing_newline(tmp_path: Path) -> None:
    f = tmp_path / "pw"
    f.write_text(PASSWORD + "\n")
    s = resolve_secret(f"file:{f}")
    assert (s.reveal(), s.source) == (PASSWORD, f"file:{f}")


def test_literal_secret_is_kept_and_its_source_is_the_config() -> None:
    assert resolve_secret(PASSWORD) == Secret(PASSWORD, "config")


def test_missing_env_variable_names_key_and_variable(ca: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv("LAKESINK_TEST_NO_SUCH_VAR", raising=False)
    with pytest.raises(ConfigError) as e:
        build_config(_sasl(ca, password="env:LAKESINK_TEST_NO_SUCH_VAR"))
    assert "kafka.sasl.password" in str(e.value)
    assert "LAKESINK_TEST_NO_SUCH_VAR is not set" in str(e.value)


def test_unreadable_secret_file_names_the_file(ca: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read secret file .*nope"):
        build_config(_sasl(ca, password=f"file:{tmp_path / 'nope'}"))


def test_empty_secret_file_is_refused(ca: Path, tmp_path: Path) -> None:
    f = tmp_path / "empty"
    f.write_text("\n")
    with pytest.raises(ConfigError, match=r"kafka\.sasl\.password=\*\*\*\* is not valid.*empty"):
        build_config(_sasl(ca, password=f"file:{f}"))


def test_invalid_secret_value_is_masked_in_the_error(ca: Path) -> None:
    with pytest.raises(ConfigError) as e:
        build_config(_sasl(ca, password=123456789))  # type: ignore[arg-type]
    assert "123456789" not in str(e.value)
    assert "kafka.sasl.password=****" in str(e.value)


def test_config_repr_masks_secrets_and_keeps_the_value_usable(ca: Path) -> None:
    cfg = build_config(_sasl(ca))
    assert PASSWORD not in repr(cfg)
    assert PASSWORD not in str(cfg.consumer_config)
    assert PASSWORD not in repr(cfg.with_overrides({"table.path": "/tmp/u"}))
    assert cfg["kafka.sasl.password"].reveal() == PASSWORD


def test_password_from_lakesink_environment_variable(ca: Path) -> None:
    raw = _sasl(ca)
    del raw["kafka.sasl.password"]
    cfg = load_config(overrides=raw, environ={"LAKESINK_KAFKA_SASL_PASSWORD": PASSWORD})
    assert cfg["kafka.sasl.password"].reveal() == PASSWORD


def test_config_check_masks_secrets(
    ca: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.setenv("LAKESINK_TEST_KAFKA_PW", PASSWORD)
    f = tmp_path / "c.toml"
    f.write_text(
        "\n".join(
            f'"{k}" = {json.dumps(v)}' for k, v in _sasl(ca, "env:LAKESINK_TEST_KAFKA_PW").items()
        )
    )
    assert main(["config", "check", "--config", str(f)]) == 0
    out = capsys.readouterr()
    assert PASSWORD not in out.out + out.err
    assert "kafka.sasl.password = Secret('****', source='env:LAKESINK_TEST_KAFKA_PW')" in out.out


def test_config_check_error_never_shows_the_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a password given with a protocol that does not use it: refused, value not shown
    raw = {**BASE, "kafka.sasl.password": PASSWORD}
    args = ["config", "check"] + [a for k, v in raw.items() for a in ("--set", f"{k}={v}")]
    assert main(args) == ConfigError.exit_code
    out = capsys.readouterr()
    assert "kafka.sasl.password need kafka.security.protocol=sasl_ssl" in out.err
    assert PASSWORD not in out.out + out.err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"kafka.sasl.password": None}, r"needs kafka\.sasl\.password"),
        ({"kafka.sasl.mechanism": "GSSAPI"}, r"PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
        ({"kafka.security.protocol": "ssl"}, r"need kafka\.security\.protocol=sasl_ssl"),
        ({"kafka.ssl.ca.location": "/no/such/ca.pem"}, r"no such file: /no/such/ca\.pem"),
        ({"kafka.ssl.key.password": PASSWORD}, r"kafka\.ssl\.key\.password needs kafka\.ssl\.key"),
        ({"kafka.client.config": f"sasl.password={PASSWORD}"}, r"may not hold sasl\.password"),
        ({"kafka.consumer.config": f"ssl.key.password={PASSWORD}"}, r"may not hold ssl\.key"),
        ({"kafka.consumer.config": "ssl.cipher.suites=X"}, r"put it in kafka\.client\.config"),
        ({"kafka.client.config": "sasl.username=x"}, r"use kafka\.sasl\.username"),
    ],
)
def test_bad_security_settings_name_the_keys_never_the_secret(
    ca: Path, extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        build_config({**_sasl(ca), **extra})
    assert PASSWORD not in str(e.value)


def test_plaintext_default_adds_no_client_settings() -> None:
    cfg = build_config({**BASE, "kafka.consumer.config": "fetch.max.bytes=1000"})
    assert cfg.kafka_client_config == {}
    assert cfg.consumer_config == {"fetch.max.bytes": "1000"}


def test_security_keys_map_onto_every_client_and_reveal_only_at_creation(ca: Path) -> None:
    cfg = build_config(
        {
            **_sasl(ca),
            "kafka.client.config": "ssl.cipher.suites=HIGH",
            "kafka.consumer.config": "fetch.max.bytes=9",
        }
    )
    common = cfg.kafka_client_config
    assert common["security.protocol"] == "sasl_ssl"
    assert common["sasl.mechanism"] == "SCRAM-SHA-512"
    assert common["sasl.username"] == "lakesink"
    assert common["ssl.ca.location"] == str(ca)
    assert common["ssl.endpoint.identification.algorithm"] == "https"
    assert common["ssl.cipher.suites"] == "HIGH"
    assert isinstance(common["sasl.password"], Secret)
    assert cfg.consumer_config == {**common, "fetch.max.bytes": "9"}
    assert masked(common)["sasl.password"] == "****"
    errors = ClientErrors("b:1", common)
    built = client_config(common, errors)
    assert built["sasl.password"] == PASSWORD
    assert built["error_cb"] is errors
    assert reveal_all(common)["sasl.password"] == PASSWORD


def test_spark_options_keep_secrets_out_of_the_config_json(ca: Path) -> None:
    from lakesink.spark.source import (
        CONFIG_OPTION,
        SECRETS_OPTION,
        decode_config,
        encode_config,
        encode_secrets,
    )

    cfg = build_config(_sasl(ca))
    options = {CONFIG_OPTION: encode_config(cfg), SECRETS_OPTION: encode_secrets(cfg)}
    assert PASSWORD not in options[CONFIG_OPTION]
    back = decode_config(options)
    assert back["kafka.sasl.password"].reveal() == PASSWORD
    assert back.consumer_config.keys() == cfg.consumer_config.keys()


class _Err:
    def __init__(self, code: int, text: str) -> None:
        self._code, self._text = code, text

    def code(self) -> int:
        return self._code

    def str(self) -> str:
        return self._text

    def fatal(self) -> bool:
        return False


def test_wrong_password_is_one_line_naming_broker_and_principal() -> None:
    errors = ClientErrors(
        "127.0.0.1:9093", {"security.protocol": "sasl_ssl", "sasl.username": "u1"}
    )
    errors(_Err(-195, "127.0.0.1:9093/bootstrap: Connect to ipv4#127.0.0.1:9093 failed"))
    errors.raise_failure()  # a transport error is no refusal
    errors(
        _Err(
            -169,
            "sasl_ssl://127.0.0.1:9093/bootstrap: SASL authentication error: Authentication "
            "failed during authentication due to invalid credentials with SASL mechanism "
            "SCRAM-SHA-512 (after 338ms in state AUTH_REQ)",
        )
    )
    with pytest.raises(KafkaAuthenticationError) as e:
        errors.raise_failure()
    text = str(e.value)
    assert "\n" not in text
    assert "Kafka broker 127.0.0.1:9093" in text and "principal User:u1" in text
    assert "after 338ms" not in text
    assert not KafkaAuthenticationError.retriable


def test_untrusted_certificate_and_acl_errors_name_what_to_fix() -> None:
    tls = security_error(
        "h:1",
        "User:u1",
        _Err(-181, "sasl_ssl://h:1/bootstrap: SSL handshake failed: certificate verify failed\n"),
    )
    assert isinstance(tls, KafkaAuthenticationError)
    assert "kafka.ssl.ca.location" in str(tls) and "\n" not in str(tls)
    acl = security_error("h:1", "User:u1", _Err(29, "Broker: Topic authorization failed"))
    assert isinstance(acl, KafkaAuthorizationError)
    assert "principal User:u1" in str(acl) and "h:1" in str(acl)


def test_tls_error_after_the_handshake_is_not_a_refusal() -> None:
    errors = ClientErrors("h:1", {})
    errors(_Err(-181, "ssl://h:1/1: SSL transport error while reading: Connection reset"))
    errors(_Err(-181, "ssl://h:1/1: SSL handshake failed: Disconnected: broker restarting"))
    errors.raise_failure()
    assert errors.last is not None and "Disconnected" in errors.last


def test_example_sasl_ssl_config_loads_with_password_from_env(ca: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("KAFKA_PASSWORD", PASSWORD)
    example = Path(__file__).parents[2] / "examples" / "ingest-sasl-ssl.toml"
    cfg = load_config(example, {"kafka.ssl.ca.location": str(ca)})
    assert cfg.kafka_client_config["security.protocol"] == "sasl_ssl"
    assert cfg["kafka.sasl.password"] == Secret(PASSWORD, "env:KAFKA_PASSWORD")
    assert PASSWORD not in repr(cfg)


def test_ca_file_librdkafka_cannot_use_is_a_config_error_naming_it(ca: Path) -> None:
    from lakesink.kafka.client import list_partitions

    cfg = build_config(_sasl(ca))  # the file exists but holds no certificate
    with pytest.raises(ConfigError, match=r"ssl\.ca\.location") as e:
        list_partitions(cfg["kafka.bootstrap.servers"], ["events"], extra=cfg.kafka_client_config)
    assert PASSWORD not in str(e.value)


def test_tls_alert_from_a_broker_that_wants_a_client_certificate_is_a_refusal() -> None:
    errors = ClientErrors("h:1", {"security.protocol": "ssl"})
    errors(
        _Err(
            -195,
            "ssl://h:1/bootstrap: SSL transport error: error:0A000412:SSL routines::ssl/tls "
            "alert bad certificate: SSL alert number 42 (after 0ms in state APIVERSION_QUERY)",
        )
    )
    with pytest.raises(KafkaAuthenticationError) as e:
        errors.raise_failure()
    assert "User:ANONYMOUS" in str(e.value) and "kafka.ssl.certificate.location" in str(e.value)


def test_client_settings_keep_commas_inside_a_value() -> None:
    from lakesink.security import parse_client_properties

    props = parse_client_properties(
        "kafka.client.config", "ssl.cipher.suites=A-B,C-D,socket.timeout.ms=5", consumer_only=False
    )
    assert props == {"ssl.cipher.suites": "A-B,C-D", "socket.timeout.ms": "5"}


def test_a_file_path_the_file_system_refuses_is_a_config_error_naming_the_key() -> None:
    # found by the config fuzz test: a name too long for the file system raised OSError
    with pytest.raises(ConfigError, match=r"kafka\.ssl\.ca\.location.*not a usable file path"):
        build_config({**BASE, "kafka.ssl.ca.location": "x" * 5000})
