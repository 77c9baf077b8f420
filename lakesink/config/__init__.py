"""lakesink's configuration: one registry of keys (name, type, default, doc), one frozen object.

Values come, later overriding earlier, from defaults, a TOML or YAML file, environment
variables (`LAKESINK_` + the key upper-cased with `.` → `_`, e.g. LAKESINK_KAFKA_BOOTSTRAP_SERVERS)
and `--set key=value` overrides. Every key is documented in docs/configuration.md, generated
from this registry by `lakesink config docs --markdown`.

The keys are defined one module per domain (`kafka`, `records`, `dead_letters`, `table`,
`mutation`, `iceberg`, `transform`, `commit`, `standby`, `spark`, `storage`, `metrics`,
`services`), with their parsers in `parsers`; `registry` assembles them and holds
`LakesinkConfig`. Only the edge (spark/, cli/, lakesink.api) reads a `LakesinkConfig`:
everything below it takes the typed settings it builds once (`LakesinkConfig.settings`,
lakesink.settings).
"""

from lakesink.config.kafka import SECURITY_KEYS
from lakesink.config.parsers import Key
from lakesink.config.reference import render_reference, render_terminal_reference
from lakesink.config.registry import (
    KEYS,
    KEYS_BY_NAME,
    LakesinkConfig,
    SparkStart,
    build_config,
    closest_key,
    env_overrides,
    flatten_keys,
    kafka_security_config,
    load_config,
    read_config_file,
    storage_access_from_env,
    storage_settings,
    table_storage_at,
)
from lakesink.errors import ConfigError
from lakesink.settings import parse_kv

__all__ = [
    "KEYS",
    "KEYS_BY_NAME",
    "SECURITY_KEYS",
    "ConfigError",
    "Key",
    "LakesinkConfig",
    "SparkStart",
    "build_config",
    "closest_key",
    "env_overrides",
    "flatten_keys",
    "kafka_security_config",
    "load_config",
    "parse_kv",
    "read_config_file",
    "render_reference",
    "render_terminal_reference",
    "storage_access_from_env",
    "storage_settings",
    "table_storage_at",
]
