"""Typed settings: what the layers below spark/ read of lakesink's configuration.

The configuration registry (the `config` package) parses and validates the keys; the edge (spark/,
cli/, lakesink.api) builds one `Settings` from it (`LakesinkConfig.settings`) and hands it, or
one of its parts, down. The formats, the engine, storage and kafka never read a configuration:
they read these frozen values, each field documented once here (its key in brackets).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lakesink.errors import ConfigError, RecordError
from lakesink.protocol.mutation import SOURCE_POSITION_COLUMN, RowOperation
from lakesink.security import Secret, split_settings
from lakesink.storage import (
    ObjectStoreOptions,
    Storage,
    StorageError,
    open_storage,
)
from lakesink.storage.local import TMP_FOLDER

TableFormatName = Literal["hudi", "iceberg"]
HudiTableVersion = Literal[6, 8]
CommitMode = Literal["sync", "async"]
PendingStoreKind = Literal["sqlite", "postgres"]
LockProviderName = Literal["filesystem", "postgres", "none"]
ConflictStrategyName = Literal["file-group", "ingestion-first"]
ServicesRun = Literal["beside", "before"]
WriteOperation = Literal["append", "upsert", "cdc"]
CdcFormat = Literal["debezium", "field"]
SchemaEvolutionMode = Literal["add-and-widen", "off"]

DEFAULT_CLUSTERING_MAX_BYTES = 512 * 1024 * 1024
DEFAULT_CLUSTERING_TIER_RATIO = 8
"""Inline clustering and rewrite take small files a size tier at a time, tiers 8x apart
(`engine.tiers`): a streamed byte is rewritten about twice before it leaves the small files,
not once per run (4.5 times at 90,000 records/s, benchmarks/README.md, session 13)."""
"""One clustering reads at most this many bytes of small files per partition (512 MiB): it
holds a partition's chosen rows in memory at once and sorts them, and Arrow's string columns
overflow past 2 GiB in one array (the files are compressed: their rows take several times their
bytes), so an unbounded plan over a partition that outgrew that failed at every run."""

DEFAULT_OP_VALUES = "I=insert,U=update,D=delete"
"""The default of cdc.op.values: the one-letter operation codes of AWS DMS's `Op` column and
Oracle GoldenGate's `op_type`."""


def parse_kv(text: str | None) -> dict[str, str]:
    """A 'k=v,k=v' setting list (commas inside a value are kept: security.split_settings)."""
    out: dict[str, str] = {}
    for item in split_settings(text):
        k, sep, v = item.partition("=")
        if not sep:
            raise ConfigError(f"{item!r} is not of the form key=value")
        out[k.strip()] = v.strip()
    return out


def parse_op_values(text: str) -> dict[str, RowOperation]:
    """cdc.op.values, 'value=operation,...' (`I=insert,U=update,D=delete`): which value of the
    operation field means which operation. Values are matched exactly (case included), each
    given once; ConfigError names the bad item."""
    out: dict[str, RowOperation] = {}
    for item in (i for i in text.split(",") if i.strip()):  # no operation holds a comma
        value, sep, operation = item.partition("=")
        value = value.strip()
        if not sep or not value:
            raise ConfigError(f"{item!r} is not of the form value=operation")
        if value in out:
            raise ConfigError(f"value {value!r} is mapped twice")
        try:
            out[value] = RowOperation.parse(operation)
        except RecordError as e:
            raise ConfigError(str(e)) from None
    if not out:
        raise ConfigError("no value is mapped to an operation")
    return out


@dataclass(frozen=True, slots=True)
class TableSettings:
    """The table a writer writes (table.*)."""

    path: str
    """Where the table (Hudi) or the warehouse (Iceberg) is: a path or an object-store URI
    [table.path]."""
    format: TableFormatName
    """The table format [table.format]."""
    name: str
    """The table's name: table.name, or the last folder of table.path."""
    version: HudiTableVersion
    """The Hudi table version to create [table.version]."""
    partition_by: tuple[str, ...]
    """Columns to partition by [table.partition.by]."""
    partition_date_from: str | None
    """A timestamp column partitioned by its UTC date [table.partition.date.from]."""
    record_key_fields: tuple[str, ...]
    """Columns forming the Hudi record key [table.record.key.fields]."""
    target_file_size_bytes: int
    """Base files roll over at about this size [table.target.file.size.bytes]."""
    staging_folder: str = TMP_FOLDER
    """Where a local table root stages whole-object writes: a folder its format's readers never
    look into (`.hoodie/...` for Hudi, `.lakesink/tmp` in an Iceberg warehouse)."""
    evolution: SchemaEvolutionMode = "add-and-widen"
    """Whether a batch with a compatible wider schema evolves the table in its commit, or any
    change of the table schema is refused [schema.evolution]."""
    field_mapping: tuple[tuple[str, str], ...] = ()
    """(source field path, column name) pairs renaming the decoded records' fields; the
    Iceberg format lists the source names as aliases in a created table's name mapping
    [schema.field.mapping]."""


@dataclass(frozen=True, slots=True)
class MutationSettings:
    """How the records change the table's rows (write.operation, table.ordering.field, cdc.*,
    table.bucket.count). The default, append, writes every record as a row of its own."""

    operation: WriteOperation = "append"
    """append: every record a new row; upsert: every record the new version of its key; cdc:
    the record says insert, update or delete [write.operation]."""
    ordering_field: str | None = None
    """The value column whose higher value wins between two versions of a key, ties going to
    the later Kafka offset [table.ordering.field]."""
    cdc_format: CdcFormat = "debezium"
    """How a cdc record carries its operation: a Debezium envelope or a field [cdc.format]."""
    op_field: str = "op"
    """The operation field of cdc.format=field [cdc.op.field]."""
    op_values: Mapping[str, RowOperation] = field(
        default_factory=lambda: parse_op_values(DEFAULT_OP_VALUES)
    )
    """Which value of the operation field means which operation [cdc.op.values]."""
    bucket_count: int = 8
    """Buckets (file groups) per partition of a table created for upsert or cdc; fixed when
    the table is created [table.bucket.count]."""
    table_type: str = "COPY_ON_WRITE"
    """COPY_ON_WRITE or MERGE_ON_READ: how a batch lands in a table written by key; fixed when
    the table is created [table.type]."""
    compaction_every_commits: int = 5
    """A MERGE_ON_READ writer compacts its table inline after this many deltacommits (0: never;
    `lakesink table compact` still does) [table.compaction.every.commits]."""

    @property
    def mutates(self) -> bool:
        """Whether rows change by key (upsert or cdc) rather than only being appended."""
        return self.operation != "append"

    @property
    def ordering_column(self) -> str | None:
        """The column that orders two versions of a key: table.ordering.field, else the source
        position that a Debezium stream's rows carry (SOURCE_POSITION_COLUMN), else None (the
        later Kafka offset wins). None for append."""
        if not self.mutates:
            return None
        if self.ordering_field is not None:
            return self.ordering_field
        if self.operation == "cdc" and self.cdc_format == "debezium":
            return SOURCE_POSITION_COLUMN
        return None


@dataclass(frozen=True, slots=True)
class IcebergSettings:
    """The Iceberg catalog and table of table.format=iceberg (iceberg.*)."""

    namespace: str
    """The table's namespace, dots nesting [iceberg.namespace; default lakesink]."""
    catalog_kind: Literal["sql", "rest"]
    """The catalog kind [iceberg.catalog.kind]."""
    catalog_uri: Secret | None
    """The catalog's location, a secret [iceberg.catalog.uri]."""
    catalog_name: str
    """The catalog's name [iceberg.catalog.name; default lakesink]."""
    catalog_properties: Secret | None
    """Further pyiceberg catalog properties 'k=v,k=v', a secret [iceberg.catalog.properties]."""
    partition_spec: tuple[str, ...]
    """Partition fields used when the table is created [iceberg.partition.spec]."""
    write_mode: Literal["copy-on-write", "merge-on-read"] = "copy-on-write"
    """How a batch lands in a table of keys [iceberg.write.mode]."""
    rewrite_delete_files: int = 0
    """Live position-delete files that make the writer apply them inline; 0: off
    [iceberg.services.rewrite.delete.files]."""


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """How the writer reads Kafka (kafka.*)."""

    bootstrap_servers: str
    """The brokers [kafka.bootstrap.servers]."""
    topics: tuple[str, ...]
    """Topics to ingest [kafka.topics]."""
    topic_pattern: str | None
    """A regular expression of topics to ingest [kafka.topic.pattern]."""
    starting_offsets: str
    """Where a writer with no committed offsets starts [kafka.starting.offsets]."""
    isolation_level: Literal["read_committed", "read_uncommitted"]
    """[kafka.isolation.level]."""
    fail_on_data_loss: bool
    """Fail on offsets deleted before ingestion or lost by the broker [kafka.fail.on.data.loss]."""
    client_config: Mapping[str, Any] = field(repr=False)
    """librdkafka settings every client gets (security keys, kafka.client.config); secrets
    stay `Secret` objects until a client is built."""
    consumer_config: Mapping[str, Any] = field(repr=False)
    """librdkafka settings of the consumers: client_config, then kafka.consumer.config."""


@dataclass(frozen=True, slots=True)
class DeadLetterSettings:
    """Where bad records go (errors.*)."""

    tolerance: Literal["none", "all"]
    """none: a bad record fails the batch; all: it goes to a dead-letter target
    [errors.tolerance]."""
    topic: str | None
    """The dead-letter topic [errors.deadletter.topic]."""
    table: str | None
    """The dead-letter table: a path (Hudi) or a name in the namespace (Iceberg)
    [errors.deadletter.table]."""
    writer_id: str
    """The writer that commits the dead-letter table: the main writer's id + `.deadletters`."""
    table_settings: Settings | None = field(default=None, repr=False)
    """A Hudi dead-letter table as a table of its own: these settings with table.path =
    errors.deadletter.table and writer.id = `writer_id` (None without a Hudi dead-letter
    table)."""


@dataclass(frozen=True, slots=True)
class CommitSettings:
    """How a writer commits: its id, the commit mode and pending store, lock and heartbeats."""

    writer_id: str
    """This writer's id in commit metadata [writer.id, or derived from table and topics]."""
    mode: CommitMode
    """[commit.mode]."""
    pending_store: PendingStoreKind
    """The pending-commit store of commit.mode=async [commit.pending.store]."""
    pending_store_path: Path
    """The SQLite file of the pending store [commit.pending.store.path, or beside the table]."""
    max_pending: int
    """Most unpublished epochs before the writer waits [commit.max.pending]."""
    publish_delay_s: float
    """Benchmarks only: seconds to sleep inside each table commit [commit.publish.delay.s]."""
    lock_provider: LockProviderName
    """[lock.provider]."""
    lock_timeout_s: float
    """Seconds to wait for the table lock [lock.timeout.s]."""
    lock_lease_s: float
    """Seconds a filesystem lock lease lasts unrenewed [lock.lease.s]."""
    postgres_dsn: str | None = field(repr=False)
    """PostgreSQL connection string of the lock and the pending store [postgres.dsn]."""
    heartbeat_interval_s: float
    """Seconds between heartbeats of an instant [heartbeat.interval.s]."""
    heartbeat_tolerance_s: float
    """An inflight instant with an older heartbeat is a failed write [heartbeat.tolerance.s]."""


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    """Table services: clean, orphan files, clustering, archival, inline runs
    (table.services.*)."""

    clean_retain_commits: int
    """The cleaner keeps what this many latest commits need [...clean.retain.commits]."""
    clean_retain_hours: float | None
    """The cleaner also keeps what commits of this many hours need [...clean.retain.hours]."""
    orphans_retain_hours: float
    """Iceberg: unreferenced files younger than this survive [...orphans.retain.hours]."""
    orphans_every_hours: float
    """Iceberg: inline orphan removal at most once per this many hours [...orphans.every.hours]."""
    inline_every_commits: int
    """Run the inline services after every N commits; 0: never [...inline.every.commits]."""
    inline: tuple[str, ...]
    """Which services run inline, in order [table.services.inline]."""
    clustering_small_file_bytes: int
    """Clustering rewrites base files smaller than this [...clustering.small.file.bytes]."""
    clustering_min_files: int
    """A partition needs this many small files to be clustered [...clustering.min.files]."""
    clustering_max_bytes: int
    """One clustering reads at most this many bytes per partition [...clustering.max.bytes]."""
    archive_min_instants: int
    """[table.services.archive.min.instants]."""
    archive_max_instants: int
    """[table.services.archive.max.instants]."""
    archive_pack_files: int
    """[table.services.archive.pack.files]."""
    archive_pack_fan_in: int
    """[table.services.archive.pack.fan.in]."""
    conflict_strategy: ConflictStrategyName
    """The conflict rule at commit [table.services.conflict.strategy]."""
    run: ServicesRun = "beside"
    """Due services run beside the next batch or before it [table.services.run]."""
    clustering_tier_ratio: int = DEFAULT_CLUSTERING_TIER_RATIO
    """Inline clustering takes small files a size tier at a time [...clustering.tier.ratio]."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything below spark/ reads of one configuration, built once at the edge."""

    table: TableSettings
    iceberg: IcebergSettings
    kafka: KafkaSettings
    dead_letters: DeadLetterSettings
    commit: CommitSettings
    services: ServiceSettings
    storage: ObjectStoreOptions
    """How to reach an object store (storage.*); secrets revealed, never in repr."""
    mutation: MutationSettings = field(default_factory=MutationSettings)
    """How records change rows: append, upsert or cdc, and their ordering and buckets."""

    @property
    def writer_id(self) -> str:
        return self.commit.writer_id

    def table_storage(self) -> Storage:
        """The storage of table.path (builds no client yet), staging local writes in the
        table's `staging_folder`."""
        return open_storage(self.table.path, self.storage, tmp_folder=self.table.staging_folder)

    def storage_for(self, path: str) -> Storage:
        """The storage of another table (a dead-letter table) with the same storage options."""
        return open_storage(path, self.storage)


@dataclass(frozen=True, slots=True)
class StorageAccess:
    """How a command reaches tables it is given by path (`lakesink table ...`, `backfill`): the
    storage.* options, which the edge reads from the environment when no configuration is
    given (`storage_access_from_env` of the configuration registry)."""

    options: ObjectStoreOptions = field(default_factory=ObjectStoreOptions)

    def open(self, path: str, *, tmp_folder: str = TMP_FOLDER) -> Storage:
        """The storage of a table path or URI; ConfigError for one lakesink cannot open."""
        try:
            return open_storage(path, self.options, tmp_folder=tmp_folder)
        except StorageError as e:
            raise ConfigError(str(e)) from None
