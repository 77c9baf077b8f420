"""The value columns of a run whose values are framed by a schema registry, fixed once at start
on the driver (Spark's source schema cannot change while a query runs, and every task must
decode into the same columns).

With `schema.registry.url` and value.format avro, jsonschema or protobuf:

- the base is the declared `value.schema` / `value.schema.file`, or without one the latest
  schema registered under the first topic's value subject (by schema.registry.subject.strategy:
  `<topic>-value`, the record's name, or `<topic>-<record name>`; kafka.registry_subjects): the
  table is then created from the registry's schema;
- with `schema.evolution = add-and-widen`, the latest version registered under each topic's
  subject evolves the base by the engine's rules (`evolve`: fields added as optional, nested
  too; int→long, float→double; required→optional), and so does every writer schema id noted in
  the checkpoint (`note_writer_schema`). Only the latest version is asked for at start (one
  request per topic): an older version's values decode by their id (registry.py's per-id cache),
  their missing fields null, their narrower types widened. A version that cannot evolve the
  columns is one SchemaEvolutionError at start naming subject, version and field;
- with `off` the base stays as it is: a writer schema it cannot hold is a dead letter. A table
  of keys (write.operation=upsert) takes `off` whatever the key says: such tables keep the
  schema they were created with.

The run's rows have these columns; the batch's commit evolves the table's own schema to them
(the sink's evolution, as when `value.schema` is edited between runs). An existing table is not
altered at start. A writer schema the columns cannot hold (a version registered while the run
goes on, or an older one with a field the latest dropped) ends its first batch with one
SchemaEvolutionError (registry.py); the ingestion notes its id in the checkpoint
(`note_writer_schema`) and starts its query again over columns that take it in
(pipeline.Ingestion.run), as does a later start of the process.

A change stream (write.operation=cdc, Avro values) is a table of keys too: without declared
columns its row is the `after` record of the latest Debezium envelope registered under the first
topic's subject (with cdc.format=field, the latest record itself), pinned as that schema's Avro
JSON in `value.schema` (so that each writer schema's row is checked against it:
kafka.registry_changes); declared columns stay.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakesink.engine.evolution import evolve
from lakesink.errors import ConfigError, SchemaEvolutionError

if TYPE_CHECKING:
    from lakesink.config import LakesinkConfig

log = logging.getLogger(__name__)

__all__ = [
    "note_writer_schema",
    "noted_writer_ids",
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
    from lakesink.kafka.registry_subjects import latest_version, writer_columns

    settings = registry_settings(cfg.values)
    assert settings is not None
    naming = subject_naming(cfg.values)
    subject_for = naming.subject
    fmt = cfg["value.format"]
    mode = registry_evolution(cfg)
    declared = cfg["value.schema"] is not None or cfg["value.schema.file"] is not None
    if declared and mode == "off":
        return None
    names = sorted(set(topics))
    if not names:
        raise ConfigError("no topic to ingest: the registry's subjects follow the topics")
    latest = {t: latest_version(settings, subject_for(t), fmt) for t in names}
    if declared:
        from lakesink.kafka.deserializers import make_deserializer

        base = make_deserializer(
            fmt,
            schema=cfg["value.schema"],
            schema_file=cfg["value.schema.file"],
            registry=settings,
        ).value_schema
    else:
        first = next((latest[t] for t in names if latest[t] is not None), None)
        if first is None:
            raise ConfigError(
                f"value.schema is not set and the schema registry has no subject "
                f"{subject_for(names[0])}: register the topic's value schema, or set "
                "value.schema (or value.schema.file)"
            )
        base = writer_columns(fmt, first.schema, settings, naming.record_name).schema
    start = base
    if mode == "add-and-widen":
        for topic in names:
            registered = latest[topic]
            if registered is not None:
                where = (
                    f"version {registered.version} of subject {subject_for(topic)} "
                    f"(schema id {registered.schema_id})"
                )
                base = _evolved(base, fmt, registered.schema, settings, where, naming.record_name)
        for schema_id in noted_writer_ids(cfg):
            base = _evolved_by_id(base, fmt, schema_id, settings, naming.record_name)
    if declared and base.equals(start):
        return None
    return base


def _evolved(
    base: pa.Schema, fmt: str, schema: Any, settings: Any, where: str, record: str | None
) -> pa.Schema:
    from lakesink.kafka.registry_subjects import writer_columns

    writer = writer_columns(fmt, schema, settings, record)  # type: ignore[arg-type]
    try:
        return evolve(base, writer.schema, "add-and-widen", defaults=writer.defaults).schema
    except SchemaEvolutionError as e:
        raise SchemaEvolutionError(f"{where} cannot evolve the table's columns: {e}") from e


def _evolved_by_id(
    base: pa.Schema, fmt: str, schema_id: int, settings: Any, record: str | None
) -> pa.Schema:
    """`base` evolved by a writer schema a value was seen with; an id the registry no longer
    knows is passed over (its values are dead letters, registry.py)."""
    from lakesink.kafka.registry import UnknownSchemaId
    from lakesink.kafka.registry_subjects import schema_by_id

    try:
        schema = schema_by_id(settings, schema_id, fmt)  # type: ignore[arg-type]
    except UnknownSchemaId as e:
        log.warning("writer schema id %d noted in the checkpoint: %s", schema_id, e)
        return base
    return _evolved(base, fmt, schema, settings, f"writer schema id {schema_id}", record)


# --- writer schema ids noted in the checkpoint ------------------------------------------------

_NOTED_FILE = "lakesink-registry-writer-ids.json"


def _noted_path(cfg: LakesinkConfig) -> Path:
    return Path(cfg.checkpoint_location) / _NOTED_FILE


def noted_writer_ids(cfg: LakesinkConfig) -> list[int]:
    """The writer schema ids earlier runs of this checkpoint met and could not hold, in the
    order met."""
    path = _noted_path(cfg)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        log.warning("%s cannot be read (%s); it is written again when needed", path, e)
        return []
    return [int(i) for i in raw] if isinstance(raw, list) else []


def note_writer_schema(cfg: LakesinkConfig, error: BaseException | str) -> int | None:
    """After a failed batch: when `error` is registry.py's SchemaEvolutionError for a writer
    schema the run's columns lack (NOT_IN_COLUMNS) and its id is not noted yet, note it in the
    checkpoint for the next run's columns (`registry_columns`) and return it; else None (an id
    noted already that still does not fit is not worth another start)."""
    if not uses_registry_columns(cfg):
        return None
    from lakesink.kafka.registry import NOT_IN_COLUMNS

    found = re.search(r"writer schema id (\d+) " + re.escape(NOT_IN_COLUMNS), str(error))
    if found is None:
        return None
    ids = noted_writer_ids(cfg)
    schema_id = int(found.group(1))
    if schema_id in ids:
        return None
    path = _noted_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([*ids, schema_id]))
    tmp.replace(path)
    return schema_id


def pin_registry_columns(cfg: LakesinkConfig, topics: Iterable[str]) -> LakesinkConfig:
    """`cfg` with its value columns fixed for this run from the registry: `value.schema` set to
    their DDL (the deserializers accept one for avro too), `value.schema.file` cleared; `cfg`
    itself when the registry does not decide them or they are the declared ones. With
    key.format through the registry and no key.schema, the key's columns are pinned too."""
    cfg = _pinned_key(cfg, topics)
    if not uses_registry_columns(cfg):
        return cfg
    if cfg["write.operation"] == "cdc":
        return _pinned_envelope(cfg, topics)
    columns = registry_columns(cfg, topics)
    if columns is None:
        return cfg
    from lakesink.kafka.ddl import arrow_to_ddl

    return cfg.with_overrides({"value.schema": arrow_to_ddl(columns), "value.schema.file": None})


def _pinned_key(cfg: LakesinkConfig, topics: Iterable[str]) -> LakesinkConfig:
    """`cfg` with `key.schema` set to the columns of the latest schema registered under the
    first topic's key subject that has one (`<topic>-key`, or by the key record's name under
    the record strategies: kafka.registry_subjects); `cfg` itself with key.format=raw or a
    declared key.schema (kafka.registry_keys)."""
    if cfg["key.format"] == "raw" or cfg["key.schema"] is not None:
        return cfg
    from lakesink.config.records import registry_settings, subject_naming
    from lakesink.kafka.ddl import arrow_to_ddl
    from lakesink.kafka.registry_subjects import latest_version, writer_columns

    settings = registry_settings(cfg.values)
    if settings is None:  # the config's checks refuse it; nothing to pin from
        return cfg
    naming = subject_naming(cfg.values)
    key_subject = naming.key_subject
    names = sorted(set(topics))
    for topic in names:
        latest = latest_version(settings, key_subject(topic), cfg["key.format"])
        if latest is not None:
            record = naming.key_record_name if naming.strategy != "topic" else None
            columns = writer_columns(cfg["key.format"], latest.schema, settings, record).schema
            return cfg.with_overrides({"key.schema": arrow_to_ddl(columns)})
    raise ConfigError(
        f"key.format={cfg['key.format']} and key.schema is not set, but the schema registry has "
        f"no subject {key_subject(names[0]) if names else '<topic>-key'}: register the topic's "
        "key schema, or declare the key's columns in key.schema"
    )


def _pinned_envelope(cfg: LakesinkConfig, topics: Iterable[str]) -> LakesinkConfig:
    """A change stream's `cfg` with `value.schema` set to the latest schema registered under
    the first topic's subject that has one (Avro schema JSON: a Debezium envelope's `after`
    record is the row, or the record itself with cdc.format=field); `cfg` itself when
    value.schema or value.schema.file declares the row."""
    if cfg["value.schema"] is not None or cfg["value.schema.file"] is not None:
        return cfg
    from lakesink.config.records import registry_settings, subject_naming
    from lakesink.kafka.changes import declared_rows
    from lakesink.kafka.registry_subjects import latest_version

    settings = registry_settings(cfg.values)
    assert settings is not None
    naming = subject_naming(cfg.values)
    names = sorted(set(topics))
    if not names:
        raise ConfigError("no topic to ingest: the registry's subjects follow the topics")
    for topic in names:
        subject = naming.subject(topic)
        latest = latest_version(settings, subject, "avro")
        if latest is not None:
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
