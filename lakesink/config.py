"""lakesink's configuration: one registry of keys (name, type, default, doc), one frozen object.

Values come, later overriding earlier, from defaults, a TOML or YAML file, environment
variables (`LAKESINK_` + the key upper-cased with `.` → `_`, e.g. LAKESINK_KAFKA_BOOTSTRAP_SERVERS)
and `--set key=value` overrides. Every key is documented in docs/configuration.md, generated
from this registry by `lakesink config docs`.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lakesink import security
from lakesink.errors import ConfigError
from lakesink.security import MASK
from lakesink.storage import (
    LAKESINK_TMP_FOLDER,
    LocalStorage,
    Storage,
    StorageError,
    is_remote_uri,
    open_storage,
)


@dataclass(frozen=True, slots=True)
class Key:
    """One configuration key: its name, how to parse it, its default and one line of doc."""

    name: str
    parse: Callable[[Any], Any]
    default: Any
    doc: str
    choices: tuple[str, ...] = ()
    required: bool = False
    secret: bool = False
    """A secret (password, key): parsed into a lakesink.secrets.Secret, never printed."""


def _choice(*valid: str) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        text = str(v).strip().lower()
        if text not in valid:
            raise ValueError(f"expected one of {', '.join(valid)}")
        return text

    return parse


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _whole_number(v: Any, expected: str) -> int:
    """An integer from an int, an integral float (8.0) or a string of digits; anything else,
    2.5 or "2.5" or true included, is refused with `expected` (never truncated)."""
    if isinstance(v, bool):
        raise ValueError(expected)
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if not v.is_integer():
            raise ValueError(expected)
        return int(v)
    text = str(v).strip().replace("_", "")
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise ValueError(expected)
    return int(text)


def _positive_int(v: Any) -> int:
    n = _whole_number(v, "expected a positive whole number")
    if n <= 0:
        raise ValueError("expected a positive whole number")
    return n


def _optional_positive_int(v: Any) -> int | None:
    if v is None or str(v).strip() == "":
        return None
    return _positive_int(v)


def _positive_float(v: Any) -> float:
    x = float(v)
    if not 0 < x < float("inf"):  # also refuses nan
        raise ValueError("expected a positive number")
    return x


def _non_negative_int(v: Any) -> int:
    n = _whole_number(v, "expected 0 or a positive whole number")
    if n < 0:
        raise ValueError("expected 0 or a positive whole number")
    return n


def _non_negative_float(v: Any) -> float:
    x = float(v)
    if not 0 <= x < float("inf"):  # also refuses nan
        raise ValueError("expected 0 or a positive number")
    return x


def _optional_port(v: Any) -> int | None:
    if v is None or str(v).strip() == "":
        return None
    n = _whole_number(v, "expected a TCP port from 0 to 65535")
    if not 0 <= n <= 65535:
        raise ValueError("expected a TCP port from 0 to 65535")
    return n


def _optional_positive_float(v: Any) -> float | None:
    if v is None or str(v).strip() == "":
        return None
    return _positive_float(v)


def _optional_secret(v: Any) -> security.Secret | None:
    if v is None or (isinstance(v, str) and not v.strip()):
        return None
    return security.resolve_secret(v)


def _table_uri(v: Any) -> str:
    text = str(v).strip()
    if not text:
        raise ValueError("expected a path or a URI such as s3://bucket/prefix")
    try:
        open_storage(text)
    except StorageError as e:
        raise ValueError(str(e)) from None
    return text


def _str_list(v: Any) -> tuple[str, ...]:
    if isinstance(v, list | tuple):
        return tuple(str(x).strip() for x in v if str(x).strip())
    return tuple(p.strip() for p in str(v).split(",") if p.strip())


def _optional_str(v: Any) -> str | None:
    return None if v is None or str(v).strip() == "" else str(v)


def _settings_list(v: Any) -> str | None:
    """A 'k=v,k=v' list, checked at load so a malformed item is named with its key."""
    text = _optional_str(v)
    try:
        parse_kv(text)
    except ConfigError as e:
        raise ValueError(str(e)) from None
    return text


def _schema_ids(v: Any) -> tuple[int, ...]:
    ids = []
    for item in _str_list(v):
        if not item.isdigit() or int(item) >= 2**32:
            raise ValueError(
                f"{item!r} is not a schema id; expected whole numbers from 0 to 4294967295, "
                "separated by commas"
            )
        ids.append(int(item))
    return tuple(ids)


def _starting_offsets(v: Any) -> str:
    text = str(v).strip().lower()
    if text in ("earliest", "latest") or text.isdigit():
        return text
    raise ValueError("expected earliest, latest or a timestamp in epoch milliseconds")


def _table_version(v: Any) -> int:
    n = _whole_number(v, "expected 6 or 8")
    if n not in (6, 8):
        raise ValueError("expected 6 or 8")
    return n


_WRITER_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _writer_id(v: Any) -> str | None:
    text = _optional_str(v)
    if text is not None and not _WRITER_ID_RE.match(text):
        raise ValueError("expected letters, digits, '.', '_' or '-' (at most 128)")
    return text


# --- Kafka security: keys defined in lakesink.security; every client lakesink creates gets them
SECURITY_KEYS: tuple[Key, ...] = tuple(
    Key(k.name, k.parse, k.default, k.doc, secret=k.secret) for k in security.KEY_SPECS
)


def _check_security(cfg: LakesinkConfig) -> None:
    try:
        security.check_security(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def kafka_security_config(cfg: LakesinkConfig) -> dict[str, Any]:
    """The librdkafka settings every client gets (see lakesink.security.client_settings)."""
    return security.client_settings(cfg)


# --- end of Kafka security --------------------------------------------------------------------


KEYS: tuple[Key, ...] = (
    # Kafka
    Key(
        "kafka.bootstrap.servers", str, None, "Kafka brokers, host:port[,host:port].", required=True
    ),
    Key(
        "kafka.topics", _str_list, (), "Topics to ingest, comma-separated (or kafka.topic.pattern)."
    ),
    Key("kafka.topic.pattern", _optional_str, None, "Regular expression of topics to ingest."),
    Key(
        "kafka.starting.offsets",
        _starting_offsets,
        "earliest",
        "Where a writer with no committed offsets starts: earliest, latest or epoch ms "
        "(resolved at every start until the writer's first commit).",
    ),
    Key(
        "kafka.isolation.level",
        _choice("read_committed", "read_uncommitted"),
        "read_committed",
        "Read only committed transactional records (read_committed) or all.",
    ),
    Key(
        "kafka.fail.on.data.loss",
        _bool,
        True,
        "Fail when committed offsets lie below the log start (records deleted before ingestion), "
        "or when a batch a restart runs again was planned beyond the log end (the broker lost "
        "acknowledged records since); false passes over the deleted offsets, or ends the batch "
        "at the log end, recorded in the commit and listed by `lakesink status`.",
    ),
    Key(
        "kafka.max.records.per.batch",
        _optional_positive_int,
        500_000,
        "Most offsets one micro-batch reads across all partitions (empty: no cap).",
    ),
    Key(
        "kafka.max.records.per.task",
        _positive_int,
        250_000,
        "A partition's range is split into Spark tasks of at most this many offsets.",
    ),
    Key(
        "kafka.consumer.config",
        _optional_str,
        None,
        "Extra librdkafka settings of the consumers only, 'k=v,k=v' (e.g. "
        "fetch.max.bytes=1000000); settings every client needs go in kafka.client.config or "
        "the kafka.security keys.",
    ),
    *SECURITY_KEYS,
    # Records
    Key("value.format", _choice("json", "avro", "raw"), "json", "How record values are decoded."),
    Key(
        "value.schema",
        _optional_str,
        None,
        "Schema of the value as a Spark DDL string, e.g. 'id BIGINT, name STRING'.",
    ),
    Key(
        "value.schema.file",
        _optional_str,
        None,
        "File with the value schema (Avro .avsc for avro; a DDL text file for json).",
    ),
    Key(
        "value.avro.wire.format",
        _choice("confluent", "plain"),
        "confluent",
        "Avro values: confluent (magic byte 0 + 4-byte schema id + Avro) or plain (bare Avro).",
    ),
    Key(
        "value.avro.schema.ids",
        _schema_ids,
        (),
        "Confluent-framed Avro: the schema registry ids (comma list) under which the value schema "
        "is registered; required with value.avro.wire.format=confluent. A value framed with "
        "another id is a bad record (its writer schema is unknown).",
    ),
    Key(
        "errors.tolerance",
        _choice("none", "all"),
        "none",
        "none: a bad record fails the batch; all: it goes to the dead-letter topic or table.",
    ),
    Key(
        "errors.deadletter.topic",
        _optional_str,
        None,
        "Kafka topic for records that fail to decode (errors.tolerance=all; at least once: "
        "deduplicate on the lakesink.source.* headers).",
    ),
    Key(
        "errors.deadletter.table",
        _optional_str,
        None,
        "Path of a Hudi dead-letter table for records that fail to decode "
        "(errors.tolerance=all; exactly once, committed with the main table's offsets); with "
        "table.format=iceberg the name of an Iceberg table in iceberg.namespace of the same "
        "catalog.",
    ),
    # Table
    Key(
        "table.path",
        _table_uri,
        None,
        "Where the Hudi table is (created if missing): a local path, file:///path, "
        "s3://bucket/prefix, gs://bucket/prefix or abfss://container@account/prefix.",
        required=True,
    ),
    Key(
        "table.format",
        _choice("hudi", "iceberg"),
        "hudi",
        "The table format lakesink writes: hudi (table.path is the table) or iceberg "
        "(table.path is the warehouse; the table is iceberg.namespace.table.name in the "
        "iceberg.catalog.* catalog).",
    ),
    Key("table.name", _optional_str, None, "Table name (default: the last folder of table.path)."),
    Key("table.version", _table_version, 8, "Hudi table version to create: 6 or 8."),
    Key("table.partition.by", _str_list, (), "Columns to partition by, comma-separated."),
    Key(
        "table.partition.date.from",
        _optional_str,
        None,
        "A timestamp column; rows are partitioned by its UTC date in column 'dt'.",
    ),
    Key(
        "table.record.key.fields",
        _str_list,
        ("kafka_topic", "kafka_partition", "kafka_offset"),
        "Columns forming the Hudi record key.",
    ),
    Key(
        "table.target.file.size.bytes",
        _positive_int,
        128 * 1024 * 1024,
        "Base files roll over at about this size.",
    ),
    # Iceberg (table.format=iceberg)
    Key(
        "iceberg.namespace",
        _optional_str,
        "lakesink",
        "Iceberg: the namespace of the table (dots nest namespaces); created on first use.",
    ),
    Key(
        "iceberg.catalog.kind",
        _choice("sql", "rest"),
        "sql",
        "Iceberg catalog: sql (a SQLite file or PostgreSQL database) or rest (a REST catalog "
        "server).",
    ),
    Key(
        "iceberg.catalog.uri",
        _optional_secret,
        None,
        "Iceberg catalog location: sqlite:////abs/catalog.db or "
        "postgresql://user:password@host:port/db for kind sql (default: catalog.db in a local "
        "warehouse), the server's http(s) URL for kind rest; env:NAME and file:/path work.",
        secret=True,
    ),
    Key(
        "iceberg.catalog.name",
        _optional_str,
        "lakesink",
        "Iceberg catalog name (the SQL catalog keeps it in every row; readers must use it).",
    ),
    Key(
        "iceberg.catalog.properties",
        _optional_secret,
        None,
        "Further pyiceberg catalog properties, key=value comma-separated (e.g. a REST "
        "catalog's token=...); env:NAME and file:/path work.",
        secret=True,
    ),
    Key(
        "iceberg.partition.spec",
        _str_list,
        (),
        "Iceberg partition fields, comma-separated: col or identity(col), day(ts), hour(ts), "
        "`bucket[N](col)`. Used when the table is created; default: identity fields of "
        "table.partition.by.",
    ),
    # Transformation
    Key(
        "transform.sql",
        _optional_str,
        None,
        "Spark SQL over the view 'source', e.g. 'SELECT *, amount * 100 AS cents FROM source'.",
    ),
    Key(
        "transform.python",
        _optional_str,
        None,
        "A function 'module:function' taking and returning a DataFrame.",
    ),
    Key(
        "transform.arrow",
        _optional_str,
        None,
        "A function 'module:function' taking a pyarrow.RecordBatch of decoded records and "
        "returning a RecordBatch or Table, applied in the Spark tasks (keeps the direct path); "
        "pure per record, it must take an empty batch and keep kafka_topic, kafka_partition "
        "and kafka_offset.",
    ),
    # Writer and commit
    Key(
        "writer.id",
        _writer_id,
        None,
        "This writer's id in commit metadata (default: derived from table name and topics).",
    ),
    Key(
        "write.path",
        _choice("auto", "direct", "dataframe"),
        "auto",
        "How tasks write: direct (each task reads its Kafka range, decodes and writes its base "
        "files in one Python worker, no rows through the JVM), dataframe (through a Spark "
        "DataFrame, needed by transform.sql and transform.python), or auto (direct unless "
        "transform.sql or transform.python is set or table.partition.date.from names a column "
        "that is not a timestamp or date; transform.arrow runs on either path).",
    ),
    Key(
        "commit.mode",
        _choice("sync", "async"),
        "sync",
        "sync: publish before Spark records the batch; async: pre-commit to the pending store.",
    ),
    Key(
        "commit.pending.store",
        _choice("sqlite", "postgres"),
        "sqlite",
        "Pending-commit store for commit.mode=async.",
    ),
    Key(
        "commit.pending.store.path",
        _optional_str,
        None,
        "SQLite file of the pending store (default: <table.path>/.hoodie/.lakesink/"
        "pending-commits.sqlite; with table.format=iceberg <warehouse>/.lakesink/pending/"
        "<iceberg.namespace>.<table.name>.sqlite).",
    ),
    Key("commit.max.pending", _positive_int, 4, "Most unpublished epochs before the writer waits."),
    Key(
        "commit.publish.delay.s",
        float,
        0.0,
        "Benchmarks only: seconds to sleep inside each table commit, to model slow commits.",
    ),
    Key(
        "lock.provider",
        _choice("filesystem", "postgres", "none"),
        "filesystem",
        "Lock taken around each commit: filesystem lease, PostgreSQL, or none (single writer).",
    ),
    Key("lock.timeout.s", _positive_float, 60.0, "Seconds to wait for the table lock."),
    Key("lock.lease.s", _positive_float, 30.0, "Seconds a filesystem lock lease lasts unrenewed."),
    Key("postgres.dsn", _optional_str, None, "PostgreSQL connection string for lock and store."),
    Key("heartbeat.interval.s", _positive_float, 5.0, "Seconds between heartbeats of an instant."),
    Key(
        "heartbeat.tolerance.s",
        _positive_float,
        60.0,
        "An inflight instant whose heartbeat is older than this is a failed write.",
    ),
    Key(
        "standby.liveness.enabled",
        _bool,
        True,
        "The active `lakesink ingest` keeps a liveness file for a warm standby to watch (on an "
        "object store: one PUT per standby.liveness.interval.s); false: none, and no standby "
        "can take this writer over.",
    ),
    Key(
        "standby.liveness.interval.s",
        _positive_float,
        1.0,
        "Seconds between renewals of the writer's liveness file, by a background thread of "
        "the active `lakesink ingest` (a warm standby, `ingest --standby`, watches it).",
    ),
    Key(
        "standby.takeover.after.s",
        _positive_float,
        4.0,
        "A standby (`ingest --standby`) takes over when the active writer's liveness file has "
        "not been renewed for this many seconds (at least twice standby.liveness.interval.s); "
        "at once when the active writer stopped cleanly.",
    ),
    Key(
        "standby.warmup.query",
        _bool,
        True,
        "A standby runs the ingestion's own query once, one small batch into a scratch table "
        "it then deletes, so the JVM has loaded what the query needs before a takeover; "
        "false: only a tiny job that starts the Python workers.",
    ),
    # Spark
    Key("spark.master", str, "local[2]", "Spark master URL."),
    Key(
        "spark.conf",
        _settings_list,
        None,
        "Extra Spark settings, 'k=v,k=v'; a value may hold commas "
        "(spark.jars=a.jar,b.jar): a new setting starts only at ',name='.",
    ),
    Key(
        "spark.class.archive",
        _bool,
        True,
        "Start Spark's driver JVM from a class-data archive of its classes (Java's AppCDS): "
        "a start takes about half the time and CPU. The first run on a machine writes the "
        "archive (~150 MB) as its JVM exits; false: never write or use one.",
    ),
    Key(
        "spark.python.workers.compiled",
        _bool,
        True,
        "Spark's Python workers import pyspark compiled once from this interpreter's "
        "site-packages, not from Spark's pyspark.zip (compiled again by every worker); local "
        "masters with Spark from pip only; false: Spark's own worker path.",
    ),
    Key(
        "spark.python.workers.warmup",
        _bool,
        True,
        "While an ingestion starts its streaming query, a background Spark job (once per Spark "
        "application) starts a Python worker per task slot and imports what the tasks need, "
        "so the first batch does not wait for them; false: the first batch starts them.",
    ),
    Key(
        "spark.driver.jit",
        _choice("auto", "quick", "full"),
        "auto",
        "How the driver JVM that lakesink starts compiles Spark's code: quick (the client "
        "compiler only, -XX:TieredStopAtLevel=1), full (Java's default tiered compilation), or "
        "auto: quick, except for an ingestion whose batches go through a Spark DataFrame "
        "(write.path, transform.sql, transform.python), where the JVM works per row and the "
        "full compiler's code wins over a long run. On the direct path quick halved the "
        "JVM's CPU over the first 40 micro-batches and stayed below full after "
        "(benchmarks/README.md). In local mode the driver also runs the tasks. Your own -XX "
        "flags in spark.driver.extraJavaOptions come after and win; a SparkSession you start "
        "yourself is not changed.",
    ),
    Key(
        "spark.start.cache.dir",
        str,
        "~/.cache/lakesink/spark",
        "Folder of what makes Spark start faster: the class-data archives (one per Java, Spark "
        "and class path) and the Python workers' interpreter script.",
    ),
    Key("trigger.interval.s", _positive_float, 5.0, "Seconds between micro-batches."),
    Key(
        "checkpoint.location",
        _optional_str,
        None,
        "Spark checkpoint, always on a local (or Hadoop) file system (default: "
        "<table.path>/.hoodie/.lakesink/checkpoints/<writer.id> for a local table, "
        "~/.lakesink/checkpoints/<bucket>/<prefix>/<writer.id> for a table on an object store: "
        "the table is the source of truth, a lost checkpoint loses nothing).",
    ),
    # Object storage
    Key(
        "storage.s3.endpoint",
        _optional_str,
        None,
        "S3 endpoint override for S3-compatible stores (MinIO, Ceph, R2), e.g. "
        "http://127.0.0.1:9000 (default: AWS from the region).",
    ),
    Key(
        "storage.s3.region",
        _optional_str,
        None,
        "S3 region (default: AWS_REGION / AWS_DEFAULT_REGION from the environment).",
    ),
    Key("storage.s3.allow.http", _bool, False, "Allow plain http:// endpoints (tests, MinIO)."),
    Key(
        "storage.s3.path.style",
        _bool,
        False,
        "Path-style requests (endpoint/bucket/key) instead of virtual-hosted buckets; an "
        "endpoint override implies them.",
    ),
    Key(
        "storage.s3.access.key.id",
        _optional_secret,
        None,
        "S3 access key id (default: the standard AWS chain: AWS_ACCESS_KEY_ID, web identity, "
        "container and instance credentials); env:NAME and file:/path references work.",
        secret=True,
    ),
    Key(
        "storage.s3.secret.access.key",
        _optional_secret,
        None,
        "S3 secret access key (default: the standard AWS chain); env:NAME or file:/path.",
        secret=True,
    ),
    Key(
        "storage.s3.session.token",
        _optional_secret,
        None,
        "S3 session token of temporary credentials; env:NAME or file:/path.",
        secret=True,
    ),
    Key(
        "storage.retry.max",
        _non_negative_int,
        10,
        "Retries of a failed object-store request (5xx, throttling, timeouts), with backoff.",
    ),
    Key(
        "storage.retry.timeout.s",
        _positive_float,
        180.0,
        "Give up retrying an object-store request after this many seconds.",
    ),
    Key(
        "storage.retry.backoff.initial.s",
        _positive_float,
        0.1,
        "First backoff between object-store retries (doubles each time).",
    ),
    Key(
        "storage.retry.backoff.max.s",
        _positive_float,
        15.0,
        "Longest backoff between object-store retries.",
    ),
    Key(
        "storage.connect.timeout.s",
        _positive_float,
        5.0,
        "Seconds to connect to the object store.",
    ),
    Key(
        "storage.request.timeout.s",
        _positive_float,
        30.0,
        "Seconds one object-store request may take.",
    ),
    # Metrics
    Key(
        "metrics.port",
        _optional_port,
        None,
        "Serve Prometheus metrics on this port while ingesting (`/metrics`; 0 picks a free "
        "port); unset: no endpoint. Metric names: docs/metrics.md.",
    ),
    Key(
        "metrics.host",
        str,
        "127.0.0.1",
        "Address the metrics endpoint listens on (0.0.0.0 for every interface).",
    ),
    Key(
        "metrics.lag.interval.s",
        _positive_float,
        10.0,
        "Seconds between readings of the high watermarks for the lag metrics.",
    ),
    Key(
        "table.services.clean.retain.commits",
        _positive_int,
        30,
        "The cleaner keeps file versions needed by this many latest commits.",
    ),
    Key(
        "table.services.clean.retain.hours",
        _optional_positive_float,
        None,
        "The cleaner also keeps file versions needed by commits of this many last hours.",
    ),
    Key(
        "table.services.orphans.retain.hours",
        _non_negative_float,
        72.0,
        "Iceberg tables: remove-orphan-files (inline, in `clean`) keeps unreferenced files "
        "younger than this many hours, so files of batches other writers are still writing "
        "or committing survive: keep it longer than any writer's batch takes.",
    ),
    Key(
        "table.services.inline.every.commits",
        _non_negative_int,
        0,
        "Run table services (clean, cluster, archive) after every N commits; 0: never inline. "
        "Iceberg tables run their maintenance (table.services.inline) the same way.",
    ),
    Key(
        "table.services.inline",
        _str_list,
        ("clean", "cluster", "archive"),
        "Which services run inline, in this order: clean, cluster, archive. Iceberg tables: "
        "clean = expire-snapshots then remove-orphan-files, cluster = rewrite-data-files "
        "(archive is skipped), or Iceberg's own action names.",
    ),
    Key(
        "table.services.clustering.small.file.bytes",
        _positive_int,
        100 * 1024 * 1024,
        "Clustering rewrites base files smaller than this (into table.target.file.size.bytes).",
    ),
    Key(
        "table.services.clustering.min.files",
        _positive_int,
        2,
        "Clustering rewrites a partition only if it has at least this many small files.",
    ),
    Key(
        "table.services.archive.min.instants",
        _positive_int,
        20,
        "Archival keeps at least this many completed instants in the active timeline. Time "
        "travel and incremental reads reach back to the oldest active instant; older instants "
        "are kept under .hoodie/.lakesink/archive/ (the audit still reads them).",
    ),
    Key(
        "table.services.archive.max.instants",
        _positive_int,
        30,
        "Archival runs when the active timeline holds more completed instants than this. It "
        "waits for pending instants and for the cleaner to delete files hudi-rs would "
        "otherwise read (failed writes, replaced file groups).",
    ),
    Key(
        "table.services.archive.pack.files",
        _positive_int,
        600,
        "Archival gathers the archived timeline files (3 per instant) into one Parquet pack "
        "under .hoodie/.lakesink/archive/timeline/ once this many are loose, so an old table's "
        "archive stays a few dozen files.",
    ),
    Key(
        "table.services.archive.pack.fan.in",
        _positive_int,
        10,
        "Archival merges this many packs of one level into one pack of the next level "
        "(size-tiered); at least 2.",
    ),
    Key(
        "table.services.conflict.strategy",
        _choice("file-group", "ingestion-first"),
        "file-group",
        "Conflict rule at commit: file-group overlap fails the later commit; ingestion-first "
        "lets ingestion win over clustering.",
    ),
)

KEYS_BY_NAME: Mapping[str, Key] = {k.name: k for k in KEYS}


def parse_kv(text: str | None) -> dict[str, str]:
    """A 'k=v,k=v' setting list (commas inside a value are kept: security.split_settings)."""
    out: dict[str, str] = {}
    for item in security.split_settings(text):
        k, sep, v = item.partition("=")
        if not sep:
            raise ConfigError(f"{item!r} is not of the form key=value")
        out[k.strip()] = v.strip()
    return out


@dataclass(frozen=True, slots=True)
class LakesinkConfig:
    """Validated configuration. Read values with `cfg["kafka.topics"]`; all keys exist."""

    values: Mapping[str, Any] = field(default_factory=dict)

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
    unknown = sorted(set(raw) - set(KEYS_BY_NAME))
    if unknown:
        hints = "; ".join(
            f"{u!r}" + (f" (did you mean {close!r}?)" if (close := closest_key(u)) else "")
            for u in unknown
        )
        raise ConfigError(f"unknown configuration key(s): {hints}. See docs/configuration.md")
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
    if cfg["value.format"] == "avro" and not cfg["value.schema.file"]:
        raise ConfigError("value.format=avro needs value.schema.file (an .avsc file)")
    if (
        cfg["value.format"] == "avro"
        and cfg["value.avro.wire.format"] == "confluent"
        and not cfg["value.avro.schema.ids"]
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


def render_reference() -> str:
    """The Markdown reference of every key (docs/configuration.md)."""
    lines = [
        "# lakesink configuration reference",
        "",
        "Generated by `lakesink config docs` from `lakesink/config.py`; do not edit by hand.",
        "Keys can be set in a TOML or YAML file (nested tables become dotted keys), as",
        "environment variables (`LAKESINK_` + key upper-cased, dots as underscores), or with",
        "`--set key=value` on the command line, later sources overriding earlier ones.",
        "",
        "| key | default | description |",
        "| --- | --- | --- |",
    ]
    for k in KEYS:
        lines.append(f"| `{k.name}` | {_default_text(k)} | {_placeholders_as_code(k.doc)} |")
    return "\n".join(lines) + "\n"


def _default_text(key: Key) -> str:
    """A key's default as a configuration file writes it (`true`, `earliest`, `a,b`), in
    code; none: a dash."""
    if key.required:
        return "(required)"
    value = key.default
    if value is None or value == "" or value == ():
        return "—"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return f"`{','.join(map(str, value))}`"
    return f"`{value}`"


# A path or word holding `<placeholder>`s: outside code, Markdown would read them as HTML tags
# and drop them ("<table.path>/.hoodie/..." rendered as "/.hoodie/...")
_PLACEHOLDER_RUN = re.compile(r"(?<![`\w])(?:[\w.~/:-]*<[^<>\s`]+>)+[\w.~/-]*")


def _placeholders_as_code(text: str) -> str:
    def code(m: re.Match[str]) -> str:
        run = m.group(0)
        trail = len(run) - len(run.rstrip("."))
        return f"`{run[: len(run) - trail]}`" + run[len(run) - trail :]

    return _PLACEHOLDER_RUN.sub(code, text)
