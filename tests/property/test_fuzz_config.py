"""Fuzzing of configuration input: TOML and YAML files (garbage text, and well-formed files with
values of every type under real keys), environment variables and `--set` overrides.
Anything wrong gives ConfigError naming the problem, never another exception type."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from lakesink.config import (
    KEYS,
    ConfigError,
    LakesinkConfig,
    build_config,
    load_config,
    read_config_file,
)
from lakesink.errors import LakesinkError

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
KEY_NAMES = [k.name for k in KEYS]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # inf and nan too
    st.text(max_size=30),
    st.sampled_from(
        [
            "earliest",
            "latest",
            "json",
            "avro",
            "raw",
            "none",
            "all",
            "sync",
            "-1",
            "0",
            "1e309",
            "id BIGINT",
            "a=b,c",
            "6",
            "8",
            "7",
            "",
        ]
    ),
    st.dates(),
    st.datetimes(),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
configs = st.dictionaries(st.sampled_from(KEY_NAMES) | st.text(max_size=15), values, max_size=8)
BASE = {
    "kafka.bootstrap.servers": "127.0.0.1:9092",
    "kafka.topics": "t",
    "table.path": "/tmp/x",
    "value.format": "raw",
}


def _valid_or_config_error(load: object) -> None:
    try:
        cfg = load()  # type: ignore[operator]
    except ConfigError as e:
        assert str(e)
        return
    assert isinstance(cfg, LakesinkConfig | dict)


@FUZZ
@given(configs)
@example({"kafka.max.records.per.batch": float("inf")})
@example({"heartbeat.interval.s": float("nan")})
@example({"table.version": float("inf")})
@example({"route.dynamic.allow": [[]]})  # "[[]]": Python warns of a possible nested set
def test_build_config_with_any_values_gives_config_or_config_error(raw: dict[str, object]) -> None:
    _valid_or_config_error(lambda: build_config({**BASE, **raw}))
    _valid_or_config_error(lambda: build_config(raw))


@FUZZ
@given(
    st.one_of(st.text(max_size=300), st.binary(max_size=300).map(lambda b: b.decode("latin-1"))),
    st.sampled_from([".toml", ".yaml", ".yml"]),
)
@example("a = [1, {b = 2}]\n[x]\ny = 1979-05-27T07:32:00Z", ".toml")
@example("!!python/object:os.system {}", ".yaml")
@example("&a [*a]", ".yaml")
@example("- 1\n- 2", ".yaml")
@example("a: !!binary aGVsbG8=", ".yaml")
def test_garbage_configuration_files_give_config_error(
    tmp_path: Path, text: str, suffix: str
) -> None:
    path = tmp_path / f"c{suffix}"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    _valid_or_config_error(lambda: read_config_file(path))
    _valid_or_config_error(lambda: load_config(path, environ={}))


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dt.datetime | dt.date):
        return v.isoformat()
    if isinstance(v, float) and v != v:
        return "nan"
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return (
            "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items()) + "}"
        )
    return json.dumps(str(v))


@FUZZ
@given(configs, st.booleans())
def test_well_formed_files_with_bad_values_give_config_error(
    tmp_path: Path, raw: dict[str, object], as_yaml: bool
) -> None:
    data = {**BASE, **{k: v for k, v in raw.items() if v is not None}}
    if as_yaml:
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump(data, allow_unicode=True))
    else:
        path = tmp_path / "c.toml"
        path.write_text("".join(f"{json.dumps(k)} = {_toml_value(v)}\n" for k, v in data.items()))
    _valid_or_config_error(lambda: load_config(path, environ={}))


@FUZZ
@given(
    st.sampled_from([k.name for k in KEYS if k.name.endswith(".s") and "delay" not in k.name]),
    st.sampled_from([float("nan"), float("inf"), -1.0, 0.0, "nan", "inf", "-inf", "1e400"]),
)
def test_durations_must_be_finite_positive_numbers(key: str, value: object) -> None:
    # trigger.interval.s=0 is valid: micro-batches back to back
    assume(not (key == "trigger.interval.s" and value == 0.0))
    try:
        build_config({**BASE, key: value})
    except ConfigError as e:
        assert key in str(e)
    else:
        raise AssertionError(f"{key}={value!r} was accepted")


@FUZZ
@given(st.dictionaries(st.sampled_from(KEY_NAMES), st.text(max_size=20), max_size=6))
def test_environment_overrides_give_config_or_config_error(env_values: dict[str, str]) -> None:
    environ = {
        "LAKESINK_" + k.upper().replace(".", "_"): v.replace("\x00", "")
        for k, v in env_values.items()
    }
    try:
        load_config(None, overrides=BASE, environ=environ)
    except LakesinkError as e:
        assert isinstance(e, ConfigError)
