"""The registry: every key in one tuple (`KEYS`, in the order of the reference), the validated
configuration object (`LakesinkConfig`) and how it is loaded from a file, the environment and
overrides. The keys themselves live in one module per domain beside this one."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lakesink import security
from lakesink.config.commit import COMMIT_KEYS
from lakesink.config.dead_letters import DEAD_LETTER_KEYS
from lakesink.config.iceberg import ICEBERG_KEYS
from lakesink.config.kafka import KAFKA_KEYS
from lakesink.config.metrics import METRICS_KEYS
from lakesink.config.mutation import MUTATION_KEYS, check_mutation
from lakesink.config.parsers import Key
from lakesink.config.records import RECORD_KEYS
from lakesink.config.services import SERVICE_KEYS, small_file_bytes
from lakesink.config.spark import SPARK_KEYS
from lakesink.config.standby import STANDBY_KEYS
from lakesink.config.storage import STORAGE_KEYS
from lakesink.config.table import TABLE_KEYS, field_mapping_of
from lakesink.config.tables import (
    TABLES_KEYS,
    Route,
    TableSpec,
    check_dynamic_template,
    dynamic_parent,
    dynamic_spec,
    gather_table_keys,
    parse_tables,
)
from lakesink.config.transform import TRANSFORM_KEYS
from lakesink.errors import ConfigError
from lakesink.security import MASK
from lakesink.settings import (
    CommitSettings,
    DeadLetterSettings,
    IcebergSettings,
    KafkaSettings,
    MutationSettings,
    ServiceSettings,
    Settings,
    StorageAccess,
    TableSettings,
    parse_kv,
    parse_op_values,
)
from lakesink.storage import (
    LAKESINK_TMP_FOLDER,
    LocalStorage,
    Storage,
    StorageError,
    is_remote_uri,
    open_storage,
    options_from_config,
)
from lakesink.storage.local import TMP_FOLDER

KEYS: tuple[Key, ...] = (
    *KAFKA_KEYS,
    *RECORD_KEYS,
    *DEAD_LETTER_KEYS,
    *TABLE_KEYS,
    *TABLES_KEYS,
    *MUTATION_KEYS,
    *ICEBERG_KEYS,
    *TRANSFORM_KEYS,
    *COMMIT_KEYS,
    *STANDBY_KEYS,
    *SPARK_KEYS,
    *STORAGE_KEYS,
    *METRICS_KEYS,
    *SERVICE_KEYS,
)

KEYS_BY_NAME: Mapping[str, Key] = {k.name: k for k in KEYS}


def _check_security(cfg: LakesinkConfig) -> None:
    try:
        security.check_security(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def kafka_security_config(cfg: LakesinkConfig) -> dict[str, Any]:
    """The librdkafka settings every client gets (see lakesink.security.client_settings)."""
    return security.client_settings(cfg)


# --- end of Kafka security --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LakesinkConfig:
    """Validated configuration. Read values with `cfg["kafka.topics"]`; all keys exist."""

    values: Mapping[str, Any] = field(default_factory=dict)
    _built: dict[str, Settings] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __getitem__(self, key: str) -> Any:
        if key not in KEYS_BY_NAME:
            raise ConfigError(f"unknown configuration key {key!r}")
        return self.values[key]

    @property
    def table_name(self) -> str:
        if self["table.name"]:
            return str(self["table.name"])
        table = str(self["table.path"])
        if is_remote_uri(table):
            parts = urlsplit(table)
            return (parts.path.strip("/").rsplit("/", 1)[-1]) or parts.netloc
        return Path(open_storage(table).uri).resolve().name

    @property
    def writer_id(self) -> str:
        if self["writer.id"]:
            return str(self["writer.id"])
        topics = "-".join(self["kafka.topics"]) or "pattern"
        return re.sub(r"[^A-Za-z0-9._-]", "_", f"{self.table_name}.{topics}")[:128]

    @property
    def dead_letter_writer_id(self) -> str:
        """The writer that commits the dead-letter table (errors.deadletter.table), with the
        main table's ranges: its own offsets keep each table exactly once on its own."""
        return f"{self.writer_id}.deadletters"

    @property
    def checkpoint_location(self) -> Path:
        if self["checkpoint.location"]:
            return Path(self["checkpoint.location"])
        if self["tables"]:  # many tables: where the first table's would be
            return self.table_configs()[0][1].checkpoint_location
        table = str(self["table.path"])
        if is_remote_uri(table):  # Spark's checkpoint stays local; the table holds the truth
            parts = urlsplit(table)
            folder = Path.home() / ".lakesink" / "checkpoints" / parts.scheme / parts.netloc
            return folder / parts.path.strip("/") / self.writer_id
        local = open_storage(table)
        assert isinstance(local, LocalStorage)
        if self["table.format"] == "iceberg":  # table.path is the warehouse
            return local.root / ".lakesink" / "checkpoints" / self.table_name / self.writer_id
        return local.root / ".hoodie" / ".lakesink" / "checkpoints" / self.writer_id

    @property
    def pending_store_path(self) -> Path:
        """The SQLite file of the pending-commit store (`commit.pending.store=sqlite`): beside
        the Hudi table's timeline, or under an Iceberg warehouse's `.lakesink/` (where its
        checkpoints go), one file per table."""
        if self["commit.pending.store.path"]:
            return Path(self["commit.pending.store.path"])
        table = str(self["table.path"])
        if self["table.format"] == "iceberg" and not is_remote_uri(table):
            local = open_storage(table)
            assert isinstance(local, LocalStorage)
            namespace = str(self["iceberg.namespace"] or "lakesink")
            return local.root / ".lakesink" / "pending" / f"{namespace}.{self.table_name}.sqlite"
        return Path(table) / ".hoodie" / ".lakesink" / "pending-commits.sqlite"

    @property
    def table_storage(self) -> Storage:
        """The storage of table.path, with the storage.* settings (builds no client yet). An
        Iceberg warehouse stages local writes in `.lakesink/tmp/`: nothing Hudi-shaped in it."""
        if self["table.format"] == "iceberg":
            return open_storage(
                str(self["table.path"]), self.values, tmp_folder=LAKESINK_TMP_FOLDER
            )
        return open_storage(str(self["table.path"]), self.values)

    def storage_for(self, path: str) -> Storage:
        """The storage of another table (a dead-letter table) with the storage.* settings."""
        return open_storage(path, self.values)

    @property
    def kafka_client_config(self) -> dict[str, Any]:
        """librdkafka settings every client gets (consumers, producers, admin clients):
        the security keys and kafka.client.config. Secrets stay `Secret` objects here; the
        client builders in lakesink.kafka reveal them when they create a client."""
        return kafka_security_config(self)

    @property
    def consumer_config(self) -> dict[str, Any]:
        """librdkafka settings of lakesink's consumers: kafka_client_config, then
        kafka.consumer.config."""
        return {**self.kafka_client_config, **parse_kv(self["kafka.consumer.config"])}

    @property
    def spark_conf(self) -> dict[str, str]:
        return parse_kv(self["spark.conf"])

    @property
    def spark_start(self) -> SparkStart:
        """How lakesink starts Spark's driver JVM and Python workers (spark.start.*)."""
        return SparkStart.from_values(self.values)

    def with_overrides(self, overrides: Mapping[str, Any]) -> LakesinkConfig:
        return build_config({**self.values, **overrides})

    @property
    def table_specs(self) -> tuple[TableSpec, ...]:
        """The tables of a many-table ingestion (`tables.<name>.*`), by name; () for one."""
        return parse_tables(self["tables"], frozenset(KEYS_BY_NAME))

    def dynamic_table_config(self, name: str) -> tuple[TableSpec, LakesinkConfig]:
        """Dynamic table `name` (`route.dynamic.*`) with its configuration, as a table of the
        tables section: the top-level keys, its path from the template."""
        spec = dynamic_spec(
            self["route.dynamic.field"], name, self["route.dynamic.path"], self["table.format"]
        )
        return spec, self._table_config(spec)

    def dynamic_location_config(self) -> LakesinkConfig:
        """Where the dynamic tables are, as a configuration whose table.path is the folder
        before the template's /{table} (the Hudi tables' parent folder, or the Iceberg
        warehouse) with the top-level keys: what the format plugin lists them from
        (`FormatPlugin.table_names`)."""
        spec = TableSpec(
            "dynamic", {"table.path": dynamic_parent(self["route.dynamic.path"])}, Route()
        )
        return self._table_config(spec)

    def _table_config(self, spec: TableSpec) -> LakesinkConfig:
        values = {
            **{
                k: v for k, v in self.values.items() if k != "tables" and not k.startswith("route.")
            },
            **spec.overrides,
            "writer.id": self.writer_id,
        }
        try:
            return build_config(values)
        except ConfigError as e:
            raise ConfigError(f"tables.{spec.name}: {e}") from None

    def table_configs(self) -> list[tuple[TableSpec, LakesinkConfig]]:
        """Each table of a many-table ingestion with its own configuration: the top-level
        keys, the table's over them, the ingestion's writer id (each table keeps that
        writer's offsets of its own) and no `tables` section."""
        return [(spec, self._table_config(spec)) for spec in self.table_specs]

    @property
    def settings(self) -> Settings:
        """The typed settings the layers below spark/ take, built once per configuration."""
        built = self._built.get("settings")
        if built is None:
            built = self._built["settings"] = settings_of(self)
        return built


def settings_of(cfg: LakesinkConfig, *, with_dead_letter_table: bool = True) -> Settings:
    """The typed settings of a validated configuration (lakesink.settings)."""
    dead_table: Settings | None = None
    if with_dead_letter_table and cfg["errors.deadletter.table"] and cfg["table.format"] == "hudi":
        # a Hudi dead-letter table is a table of its own, with the main table's settings
        dead = cfg.with_overrides(
            {"table.path": cfg["errors.deadletter.table"], "writer.id": cfg.dead_letter_writer_id}
        )
        dead_table = settings_of(dead, with_dead_letter_table=False)
    return Settings(
        table=TableSettings(
            path=str(cfg["table.path"]),
            format=cfg["table.format"],
            name=cfg.table_name,
            version=cfg["table.version"],
            partition_by=tuple(cfg["table.partition.by"]),
            partition_date_from=cfg["table.partition.date.from"],
            record_key_fields=tuple(cfg["table.record.key.fields"]),
            target_file_size_bytes=cfg["table.target.file.size.bytes"],
            # an Iceberg warehouse stages local writes in .lakesink/tmp/: nothing Hudi-shaped
            staging_folder=LAKESINK_TMP_FOLDER if cfg["table.format"] == "iceberg" else TMP_FOLDER,
            evolution=cfg["schema.evolution"],
            field_mapping=field_mapping_of(cfg.values).items,
        ),
        iceberg=IcebergSettings(
            namespace=str(cfg["iceberg.namespace"] or "lakesink"),
            catalog_kind=cfg["iceberg.catalog.kind"],
            catalog_uri=cfg["iceberg.catalog.uri"],
            catalog_name=str(cfg["iceberg.catalog.name"] or "lakesink"),
            catalog_properties=cfg["iceberg.catalog.properties"],
            partition_spec=tuple(cfg["iceberg.partition.spec"]),
            write_mode=cfg["iceberg.write.mode"],
            rewrite_delete_files=cfg["iceberg.services.rewrite.delete.files"],
        ),
        kafka=KafkaSettings(
            bootstrap_servers=cfg["kafka.bootstrap.servers"],
            topics=tuple(cfg["kafka.topics"]),
            topic_pattern=cfg["kafka.topic.pattern"],
            starting_offsets=cfg["kafka.starting.offsets"],
            isolation_level=cfg["kafka.isolation.level"],
            fail_on_data_loss=cfg["kafka.fail.on.data.loss"],
            client_config=cfg.kafka_client_config,
            consumer_config=cfg.consumer_config,
        ),
        dead_letters=DeadLetterSettings(
            tolerance=cfg["errors.tolerance"],
            topic=cfg["errors.deadletter.topic"],
            table=cfg["errors.deadletter.table"],
            writer_id=cfg.dead_letter_writer_id,
            table_settings=dead_table,
        ),
        commit=CommitSettings(
            writer_id=cfg.writer_id,
            mode=cfg["commit.mode"],
            pending_store=cfg["commit.pending.store"],
            pending_store_path=cfg.pending_store_path,
            max_pending=cfg["commit.max.pending"],
            publish_delay_s=cfg["commit.publish.delay.s"],
            lock_provider=cfg["lock.provider"],
            lock_timeout_s=cfg["lock.timeout.s"],
            lock_lease_s=cfg["lock.lease.s"],
            postgres_dsn=cfg["postgres.dsn"],
            heartbeat_interval_s=cfg["heartbeat.interval.s"],
            heartbeat_tolerance_s=cfg["heartbeat.tolerance.s"],
        ),
        services=ServiceSettings(
            clean_retain_commits=cfg["table.services.clean.retain.commits"],
            clean_retain_hours=cfg["table.services.clean.retain.hours"],
            orphans_retain_hours=float(cfg["table.services.orphans.retain.hours"]),
            orphans_every_hours=float(cfg["table.services.orphans.every.hours"]),
            inline_every_commits=cfg["table.services.inline.every.commits"],
            inline=tuple(cfg["table.services.inline"]),
            clustering_small_file_bytes=small_file_bytes(
                cfg["table.services.clustering.small.file.bytes"],
                cfg["table.target.file.size.bytes"],
            ),
            clustering_min_files=cfg["table.services.clustering.min.files"],
            clustering_max_bytes=cfg["table.services.clustering.max.bytes"],
            archive_min_instants=cfg["table.services.archive.min.instants"],
            archive_max_instants=cfg["table.services.archive.max.instants"],
            archive_pack_files=cfg["table.services.archive.pack.files"],
            archive_pack_fan_in=cfg["table.services.archive.pack.fan.in"],
            conflict_strategy=cfg["table.services.conflict.strategy"],
            run=cfg["table.services.run"],
            clustering_tier_ratio=cfg["table.services.clustering.tier.ratio"],
        ),
        storage=options_from_config(cfg.values),
        mutation=MutationSettings(
            operation=cfg["write.operation"],
            ordering_field=cfg["table.ordering.field"],
            cdc_format=cfg["cdc.format"],
            op_field=cfg["cdc.op.field"],
            op_values=parse_op_values(cfg["cdc.op.values"]),
            bucket_count=cfg["table.bucket.count"],
            table_type=cfg["table.type"],
            compaction_every_commits=cfg["table.compaction.every.commits"],
        ),
    )


def closest_key(unknown: str) -> str | None:
    """The configuration key a mistyped `unknown` most likely means, or None: the most similar
    key whose name is close as a whole (a letter left out or added: `kafka.bootstrap.server`,
    `kafka.topic`), else one with the same last part (`table.version` for `hudi.version`)."""
    import difflib

    names = list(KEYS_BY_NAME)
    close = difflib.get_close_matches(unknown, names, n=1, cutoff=0.85)
    if close:
        return close[0]
    last = unknown.rsplit(".", 1)[-1]
    same_last = [k for k in names if k.rsplit(".", 1)[-1] == last]
    if same_last:
        return difflib.get_close_matches(unknown, same_last, n=1, cutoff=0.0)[0]
    return None


def build_config(raw: Mapping[str, Any]) -> LakesinkConfig:
    """Validate raw values (any source) into a config; errors name the key and what is valid."""
    try:
        raw = gather_table_keys(raw)
        parse_tables(raw.get("tables"), frozenset(KEYS_BY_NAME))  # named errors first
    except ValueError as e:
        raise ConfigError(str(e)) from None
    tables = raw.get("tables")
    if tables and isinstance(tables, Mapping) and raw.get("table.path") is None:
        # many tables: the ingestion's own paths (checkpoint, writer id) follow the first's
        first = tables[sorted(tables)[0]]
        if isinstance(first, Mapping) and first.get("table.path") is not None:
            raw = {**raw, "table.path": first["table.path"]}
    unknown = sorted(set(raw) - set(KEYS_BY_NAME))
    if unknown:
        hints = "; ".join(
            f"{u!r}" + (f" (did you mean {close!r}?)" if (close := closest_key(u)) else "")
            for u in unknown
        )
        raise ConfigError(
            f"unknown configuration key(s): {hints}; `lakesink config docs` lists every key"
        )
    values: dict[str, Any] = {}
    for key in KEYS:
        if key.name in raw and raw[key.name] is not None:
            try:
                values[key.name] = key.parse(raw[key.name])
            except (ValueError, TypeError, OverflowError) as e:  # inf -> int overflows
                shown = MASK if key.secret else repr(raw[key.name])
                raise ConfigError(f"{key.name}={shown} is not valid: {e}") from None
        elif key.required:
            raise ConfigError(f"{key.name} is required: {key.doc}")
        else:
            values[key.name] = key.default
    cfg = LakesinkConfig(values)
    _check_combinations(cfg)
    _check_security(cfg)
    return cfg


def _check_combinations(cfg: LakesinkConfig) -> None:
    if (
        cfg["commit.mode"] == "async"
        and cfg["commit.pending.store"] == "sqlite"
        and is_remote_uri(str(cfg["table.path"]))
    ):
        raise ConfigError(
            f"commit.mode=async with commit.pending.store=sqlite cannot keep its pending store "
            f"beside the table {cfg['table.path']} on an object store (SQLite needs a local "
            "file system): set commit.pending.store=postgres (and postgres.dsn), or "
            "commit.mode=sync"
        )
    if (
        cfg["table.format"] == "iceberg"
        and cfg["iceberg.catalog.kind"] == "sql"
        and not cfg["iceberg.catalog.uri"]
        and is_remote_uri(str(cfg["table.path"]))
    ):
        raise ConfigError(
            f"table.format=iceberg with the warehouse {cfg['table.path']} on an object store "
            "needs iceberg.catalog.uri (postgresql://user:password@host:port/db, or a SQLite "
            "file on local disk: sqlite:////abs/catalog.db)"
        )
    if cfg["standby.takeover.after.s"] < 2 * cfg["standby.liveness.interval.s"]:
        raise ConfigError(
            f"standby.takeover.after.s={cfg['standby.takeover.after.s']:g} must be at least "
            f"twice standby.liveness.interval.s={cfg['standby.liveness.interval.s']:g}: a late "
            "renewal must not look like a dead writer"
        )
    if not cfg["kafka.topics"] and not cfg["kafka.topic.pattern"]:
        raise ConfigError("set kafka.topics (comma-separated) or kafka.topic.pattern")
    if cfg["kafka.topics"] and cfg["kafka.topic.pattern"]:
        raise ConfigError("set only one of kafka.topics and kafka.topic.pattern")
    if cfg["value.format"] == "json" and not (cfg["value.schema"] or cfg["value.schema.file"]):
        raise ConfigError(
            "value.format=json needs value.schema (a DDL string) or value.schema.file"
        )
    _check_registry(cfg)
    _check_tables(cfg)
    if (
        cfg["value.format"] == "avro"
        and not cfg["value.schema.file"]
        and not cfg["schema.registry.url"]  # with one: declared, or the registered schema
    ):
        raise ConfigError("value.format=avro needs value.schema.file (an .avsc file)")
    if (
        cfg["value.format"] == "avro"
        and cfg["value.avro.wire.format"] == "confluent"
        and not cfg["value.avro.schema.ids"]
        and not cfg["schema.registry.url"]
    ):
        raise ConfigError(
            "value.avro.wire.format=confluent needs value.avro.schema.ids: the schema registry "
            "ids under which the value schema is registered (values framed with another id are "
            "bad records); or set value.avro.wire.format=plain for bare Avro values"
        )
    dead_letter_targets = [
        k for k in ("errors.deadletter.topic", "errors.deadletter.table") if cfg[k]
    ]
    if cfg["errors.tolerance"] == "all" and len(dead_letter_targets) != 1:
        raise ConfigError(
            "errors.tolerance=all needs exactly one of errors.deadletter.topic and "
            "errors.deadletter.table: bad records are never dropped"
        )
    transforms = [k for k in ("transform.sql", "transform.python", "transform.arrow") if cfg[k]]
    if len(transforms) > 1:
        raise ConfigError(
            f"set only one of transform.sql, transform.python and transform.arrow "
            f"(set: {', '.join(transforms)})"
        )
    if cfg["write.path"] == "direct" and (cfg["transform.sql"] or cfg["transform.python"]):
        raise ConfigError(
            "write.path=direct cannot apply transform.sql or transform.python (they run on a "
            "Spark DataFrame): set write.path=auto or write.path=dataframe"
        )
    needs_pg = cfg["lock.provider"] == "postgres" or (
        cfg["commit.mode"] == "async" and cfg["commit.pending.store"] == "postgres"
    )
    if needs_pg and not cfg["postgres.dsn"]:
        raise ConfigError(
            "lock.provider=postgres or commit.pending.store=postgres needs postgres.dsn"
        )
    check_mutation(cfg.values)


def _check_registry(cfg: LakesinkConfig) -> None:
    """The schema.registry.* keys against value.format and key.format (docs/schemas.md)."""
    from lakesink.config.records import check_key_format

    check_key_format(cfg.values)
    fmt = cfg["value.format"]
    if not cfg["schema.registry.url"]:
        if fmt in ("jsonschema", "protobuf"):
            raise ConfigError(
                f"value.format={fmt} needs schema.registry.url: its values are framed by the "
                "registry's schema ids"
            )
        return
    if fmt not in ("avro", "jsonschema", "protobuf"):
        raise ConfigError(
            f"schema.registry.url applies to value.format avro, jsonschema or protobuf, not {fmt}"
        )
    if "@" in urlsplit(cfg["schema.registry.url"]).netloc:
        # the URL is no secret (it is printed in errors and `config show`): credentials in it
        # would be
        raise ConfigError(
            "schema.registry.url must not carry credentials (user:password@): put them in "
            "schema.registry.basic.auth.user.info (env:NAME or file:/path)"
        )
    from lakesink.config.records import check_registry_use

    check_registry_use(cfg.values)  # subject naming; cdc reads Debezium's Avro envelopes
    if fmt == "avro" and (
        cfg["value.avro.wire.format"] != "confluent" or cfg["value.avro.schema.ids"]
    ):
        raise ConfigError(
            "with schema.registry.url every Avro value's writer schema comes from the registry: "
            "leave value.avro.wire.format at confluent and value.avro.schema.ids unset"
        )


def flatten_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    """Nested tables as dotted keys (`{"kafka": {"topics": "t"}}` → `{"kafka.topics": "t"}`),
    as a configuration file's are read."""
    return _flatten(data)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping) and name not in KEYS_BY_NAME:
            out.update(_flatten(v, name + "."))
        else:
            out[name] = v
    return out


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML (.toml) or YAML (.yaml/.yml) file; nested tables become dotted keys."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read configuration file {p}: {e.strerror}") from e
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        elif p.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            raise ConfigError(f"{p}: configuration files must end in .toml, .yaml or .yml")
    except (tomllib.TOMLDecodeError, ValueError) as e:
        raise ConfigError(f"{p} is not valid {p.suffix[1:].upper()}: {e}") from e
    except Exception as e:  # yaml.YAMLError without importing yaml types at module level
        if type(e).__module__.startswith("yaml"):
            raise ConfigError(f"{p} is not valid YAML: {e}") from e
        raise
    if not isinstance(data, Mapping):
        raise ConfigError(f"{p} must hold a table of keys, not {type(data).__name__}")
    return _flatten(data)


def env_overrides(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    out = {}
    for key in KEYS:
        var = "LAKESINK_" + key.name.upper().replace(".", "_")
        if var in env:
            out[key.name] = env[var]
    return out


_SPARK_START_KEYS = (
    "spark.start.cache.dir",
    "spark.class.archive",
    "spark.python.workers.compiled",
    "spark.driver.jit",
)


@dataclass(frozen=True)
class SparkStart:
    """What makes a Spark start and its first batches lighter (spark/class_archive.py,
    spark/worker_python.py, the driver's JIT in spark/session.py)."""

    cache_dir: str
    class_archive: bool = True
    compiled_workers: bool = True
    jit: str = "auto"

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> SparkStart:
        return cls(
            values["spark.start.cache.dir"],
            values["spark.class.archive"],
            values["spark.python.workers.compiled"],
            values["spark.driver.jit"],
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SparkStart:
        """For a command run without a configuration: the defaults, or LAKESINK_SPARK_START_
        CACHE_DIR, LAKESINK_SPARK_CLASS_ARCHIVE, ... from the environment."""
        raw = env_overrides(environ)
        return cls.from_values(
            {
                name: KEYS_BY_NAME[name].parse(raw[name])
                if name in raw
                else KEYS_BY_NAME[name].default
                for name in _SPARK_START_KEYS
            }
        )


def storage_settings(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The storage.* settings from the environment (LAKESINK_STORAGE_S3_ENDPOINT, ...), parsed:
    for commands that take a table path but no configuration file (`lakesink table ...`)."""
    out: dict[str, Any] = {}
    for name, raw in env_overrides(environ).items():
        if not name.startswith("storage."):
            continue
        key = KEYS_BY_NAME[name]
        try:
            out[name] = security.resolve_secret(raw, environ) if key.secret else key.parse(raw)
        except (ValueError, TypeError) as e:
            shown = MASK if key.secret else repr(raw)
            raise ConfigError(f"{name}={shown} is not valid: {e}") from None
    return out


def storage_access_from_env(environ: Mapping[str, str] | None = None) -> StorageAccess:
    """How a command run without a configuration reaches tables: the storage.* settings of
    the environment (`storage_settings`), for the formats below the edge."""
    return StorageAccess(options_from_config(storage_settings(environ), environ))


def table_storage_at(path: str, environ: Mapping[str, str] | None = None) -> Storage:
    """The storage of a table path or URI with the storage.* settings of the environment."""
    try:
        return open_storage(path, storage_settings(environ))
    except StorageError as e:
        raise ConfigError(str(e)) from None


def load_config(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> LakesinkConfig:
    raw: dict[str, Any] = read_config_file(path) if path else {}
    raw.update(env_overrides(environ))
    raw.update(overrides or {})
    return build_config(raw)


def _check_tables(cfg: LakesinkConfig) -> None:
    """A many-table ingestion: each table's keys and route, and what it cannot combine with."""
    try:
        specs = cfg.table_specs
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not specs:
        for key in ("route.default", "route.dynamic.field", "route.dynamic.path"):
            if cfg[key]:
                raise ConfigError(
                    f"{key} routes records among the tables of the tables section: set tables "
                    "(dynamic tables need at least one, where the checkpoint is kept)"
                )
        return
    names = [s.name for s in specs]
    if cfg["route.default"] and cfg["route.default"] not in names:
        raise ConfigError(
            f"route.default={cfg['route.default']!r} is not a table; expected one of "
            f"{', '.join(names)}"
        )
    if cfg["commit.mode"] == "async":
        raise ConfigError(
            "commit.mode=async commits one table; with tables set commit.mode=sync (each "
            "table commits its batch in turn)"
        )
    if cfg["write.path"] == "direct" and cfg["route.dynamic.field"]:
        raise ConfigError(
            "write.path=direct cannot route to dynamic tables (route.dynamic.field: their "
            "names come from each batch's rows on a Spark DataFrame); set write.path=auto or "
            "dataframe"
        )
    if cfg["route.dynamic.field"]:
        try:
            check_dynamic_template(cfg["route.dynamic.path"])
        except ValueError as e:
            raise ConfigError(str(e)) from None
    elif cfg["route.dynamic.path"]:
        raise ConfigError("route.dynamic.path needs route.dynamic.field (the names' column)")
    seen: dict[tuple[str, str, str], str] = {}
    for spec, table in cfg.table_configs():
        if "table.path" not in spec.overrides:
            raise ConfigError(f"tables.{spec.name}.table.path is required: where the table is")
        where = (str(table["table.path"]), table["table.format"], table.table_name)
        if where in seen:
            raise ConfigError(
                f"tables.{spec.name} and tables.{seen[where]} are the same table "
                f"({where[0]}, {where[2]}): give each its own table.path or table.name"
            )
        seen[where] = spec.name
        if (table["write.operation"] == "cdc") != (cfg["write.operation"] == "cdc"):
            raise ConfigError(
                f"tables.{spec.name}.write.operation: a change stream is decoded for the "
                "whole ingestion: set write.operation=cdc at the top level (then every "
                "table is cdc), or append/upsert per table"
            )
