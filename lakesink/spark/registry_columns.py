"""The value columns of a run whose values are framed by a schema registry, fixed once at start
on the driver (Spark's source schema cannot change while a query runs, and every task must
decode into the same columns).

With `schema.registry.url` and value.format avro, jsonschema or protobuf:

- the base is the declared `value.schema` / `value.schema.file`, or without one the latest
  schema registered under the first topic's value subject (by schema.registry.subject.strategy:
  `<topic>-value`, the record's name, or `<topic>-<record name>`; kafka.registry_subjects): the
  table is then created from the registry's schema;
- with `schema.evolution = add-and-widen`, every version registered under each topic's subject
  (oldest first) evolves the base by the engine's rules (`evolve`: fields added as optional,
  nested too; int→long, float→double; required→optional). A version that cannot evolve it is one
  SchemaEvolutionError at start naming subject, version and field: every value of that version
  would fail, so none is read;
- with `off` the base stays as it is: a writer schema it cannot hold is a dead letter. A table
  of keys (write.operation=upsert) takes `off` whatever the key says: such tables keep the
  schema they were created with.

The run's rows have these columns; the batch's commit evolves the table's own schema to them
(the sink's evolution, as when `value.schema` is edited between runs). An existing table is not
altered at start. A version registered while the run goes on ends its first batch with one
SchemaEvolutionError (registry.py), and the restarted run takes it in here.

A change stream (write.operation=cdc, Avro values) is a table of keys too: without declared
columns its row is the `after` record of the latest Debezium envelope registered under the first
topic's subject (with cdc.format=field, the latest record itself), pinned as that schema's Avro
JSON in `value.schema` (so that each writer schema's row is checked against it:
kafka.registry_changes); declared columns stay.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakesink.engine.evolution import evolve
from lakesink.errors import ConfigError, SchemaEvolutionError

if TYPE_CHECKING:
    from lakesink.config import LakesinkConfig

__all__ = [
    "pin_registry_columns",
    "registry_columns",
    "registry_evolution",
    "uses_registry_columns",
]


def registry_evolution(cfg: LakesinkConfig) -> str:
    """schema.evolution as the registry applies it: tables of keys (upsert) keep the schema
    they were created with (the sink evolves only appended tables), so for them it is off."""
    return str(cfg["schema.evolution"]) if cfg["write.operation"] == "append" else "off"


def uses_registry_columns(cfg: LakesinkConfig) -> bool:
    """Whether the registry decides this run's columns (see the module docstring)."""
    from lakesink.kafka.registry import REGISTRY_FORMATS

    return bool(cfg["schema.registry.url"]) and cfg["value.format"] in REGISTRY_FORMATS


def registry_columns(cfg: LakesinkConfig, topics: Iterable[str]) -> pa.Schema | None:
    """The value columns the registry and `cfg` give for `topics`; None where they are the
    declared columns unchanged."""
    from lakesink.config.records import registry_settings, subject_naming
    from lakesink.kafka.registry_subjects import subject_versions, writer_columns

    settings = registry_settings(cfg.values)
    assert settings is not None
    subject_for = subject_naming(cfg.values).subject
    fmt = cfg["value.format"]
    mode = registry_evolution(cfg)
    declared = cfg["value.schema"] is not None or cfg["value.schema.file"] is not None
    if declared and mode == "off":
        return None
    names = sorted(set(topics))
    if not names:
        raise ConfigError("no topic to ingest: the registry's subjects follow the topics")
    versions = {t: subject_versions(settings, subject_for(t), fmt) for t in names}
    if declared:
        from lakesink.kafka.deserializers import make_deserializer

        base = make_deserializer(
            fmt,
            schema=cfg["value.schema"],
            schema_file=cfg["value.schema.file"],
            registry=settings,
        ).value_schema
    else:
        first = next((t for t in names if versions[t]), None)
        if first is None:
            raise ConfigError(
                f"value.schema is not set and the schema registry has no subject "
                f"{subject_for(names[0])}: register the topic's value schema, or set "
                "value.schema (or value.schema.file)"
            )
        base = writer_columns(fmt, versions[first][-1].schema, settings).schema
    start = base
    if mode == "add-and-widen":
        for topic in names:
            for registered in versions[topic]:
                base = _evolved(base, fmt, registered, settings, subject_for(topic))
    if declared and base.equals(start):
        return None
    return base


def _evolved(base: pa.Schema, fmt: str, registered: Any, settings: Any, subject: str) -> pa.Schema:
    from lakesink.kafka.registry_subjects import writer_columns

    writer = writer_columns(fmt, registered.schema, settings)  # type: ignore[arg-type]
    try:
        return evolve(base, writer.schema, "add-and-widen", defaults=writer.defaults).schema
    except SchemaEvolutionError as e:
        raise SchemaEvolutionError(
            f"version {registered.version} of subject {subject} (schema id "
            f"{registered.schema_id}) cannot evolve the table's columns: {e}"
        ) from e


def pin_registry_columns(cfg: LakesinkConfig, topics: Iterable[str]) -> LakesinkConfig:
    """`cfg` with its value columns fixed for this run from the registry: `value.schema` set to
    their DDL (the deserializers accept one for avro too), `value.schema.file` cleared; `cfg`
    itself when the registry does not decide them or they are the declared ones."""
    if not uses_registry_columns(cfg):
        return cfg
    if cfg["write.operation"] == "cdc":
        return _pinned_envelope(cfg, topics)
    columns = registry_columns(cfg, topics)
    if columns is None:
        return cfg
    from lakesink.kafka.ddl import arrow_to_ddl

    return cfg.with_overrides({"value.schema": arrow_to_ddl(columns), "value.schema.file": None})


def _pinned_envelope(cfg: LakesinkConfig, topics: Iterable[str]) -> LakesinkConfig:
    """A change stream's `cfg` with `value.schema` set to the latest schema registered under
    the first topic's subject that has one (Avro schema JSON: a Debezium envelope's `after`
    record is the row, or the record itself with cdc.format=field); `cfg` itself when
    value.schema or value.schema.file declares the row."""
    if cfg["value.schema"] is not None or cfg["value.schema.file"] is not None:
        return cfg
    from lakesink.config.records import registry_settings, subject_naming
    from lakesink.kafka.changes import declared_rows
    from lakesink.kafka.registry_subjects import subject_versions

    settings = registry_settings(cfg.values)
    assert settings is not None
    naming = subject_naming(cfg.values)
    names = sorted(set(topics))
    if not names:
        raise ConfigError("no topic to ingest: the registry's subjects follow the topics")
    for topic in names:
        subject = naming.subject(topic)
        versions = subject_versions(settings, subject, "avro")
        if versions:
            latest = versions[-1]
            envelope = latest.schema.schema_str
            try:
                declared_rows("avro", cfg.settings.mutation.cdc_format, envelope, None)
            except ConfigError as e:
                raise ConfigError(
                    f"version {latest.version} of subject {subject} (schema id "
                    f"{latest.schema_id}): {e}"
                ) from e
            return cfg.with_overrides({"value.schema": envelope, "value.schema.file": None})
    raise ConfigError(
        f"value.schema is not set and the schema registry has no subject "
        f"{naming.subject(names[0])}: register the topic's change events (Debezium's Avro "
        "converter does on its first event), or declare the row's columns in value.schema"
    )
