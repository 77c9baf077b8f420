"""The writer and commit keys: writer id, write path, commit mode and pending store, lock,
heartbeats."""

from __future__ import annotations

from lakesink.config.parsers import (
    Key,
    choice,
    fraction,
    non_negative_int,
    optional_str,
    positive_float,
    positive_int,
    writer_id,
)

COMMIT_KEYS: tuple[Key, ...] = (
    Key(
        "writer.id",
        writer_id,
        None,
        "This writer's id in commit metadata (default: derived from table name and topics).",
    ),
    Key(
        "write.path",
        choice("auto", "direct", "dataframe"),
        "auto",
        "How tasks write: direct (each task reads its Kafka range, decodes and writes its base "
        "files in one Python worker, no rows through the JVM; writes by key into an Iceberg "
        "table: one job whose read tasks hand each bucket's rows to one writer task through "
        "Spark's shuffle, still no rows through the JVM's row format), dataframe (through a "
        "Spark DataFrame, needed by transform.sql and transform.python), or auto (direct unless "
        "transform.sql or transform.python is set, table.partition.date.from names a column "
        "that is not a timestamp or date, or write.operation upsert or cdc writes a Hudi table "
        "or has errors.deadletter.table; transform.arrow runs on either path). Many tables "
        "(tables.<name>.*) take the direct path when every table appends without a "
        "transformation or date partition of its own and no table is dynamic: one job's tasks "
        "read each Kafka range once and write every table's rows; else their batches go "
        "through the DataFrame, the reason logged.",
    ),
    Key(
        "write.keyed.single.task.max.records",
        non_negative_int,
        20_000,
        "Writes by key on the direct path: a batch of at most this many records is read, "
        "folded and written by one Spark task (one stage, no shuffle), a larger one by the "
        "two-stage job over every core. Each task and stage is a fixed cost (the JVM's "
        "scheduling, a Python worker's task start) that outweighs a small batch's own work; "
        "0: always two stages.",
    ),
    Key(
        "write.keyed.prefold.max.distinct",
        fraction,
        0.75,
        "Writes by key on the direct path, two-stage job: a read task folds its records by key "
        "before the shuffle (a map-side combine: of each key it hands on the versions from its "
        "last delete or complete version up, and each Kafka partition's newest record) when "
        "its records' first key column has at most this share of distinct values. A hot key "
        "space then shuffles about one row per key instead of every record; a cold one is "
        "handed on as read, unsorted. 0: never; 1: always.",
    ),
    Key(
        "commit.mode",
        choice("sync", "async"),
        "sync",
        "sync: publish before Spark records the batch; async: pre-commit to the pending store.",
    ),
    Key(
        "commit.pending.store",
        choice("sqlite", "postgres"),
        "sqlite",
        "Pending-commit store for commit.mode=async.",
    ),
    Key(
        "commit.pending.store.path",
        optional_str,
        None,
        "SQLite file of the pending store (default: <table.path>/.hoodie/.lakesink/"
        "pending-commits.sqlite; with table.format=iceberg <warehouse>/.lakesink/pending/"
        "<iceberg.namespace>.<table.name>.sqlite).",
    ),
    Key("commit.max.pending", positive_int, 4, "Most unpublished epochs before the writer waits."),
    Key(
        "commit.tables.parallelism",
        positive_int,
        8,
        "Most tables of one batch committing at once, on driver threads (a dead-letter table, "
        "or many tables: tables.<name>.*). The first table (the dead letters, else the first by "
        "name) commits alone, then the others concurrently; 1: one after another.",
    ),
    Key(
        "commit.publish.delay.s",
        float,
        0.0,
        "Benchmarks only: seconds to sleep inside each table commit, to model slow commits.",
    ),
    Key(
        "lock.provider",
        choice("filesystem", "postgres", "none"),
        "filesystem",
        "Lock taken around each commit: filesystem lease, PostgreSQL, or none (single writer).",
    ),
    Key("lock.timeout.s", positive_float, 60.0, "Seconds to wait for the table lock."),
    Key("lock.lease.s", positive_float, 30.0, "Seconds a filesystem lock lease lasts unrenewed."),
    Key("postgres.dsn", optional_str, None, "PostgreSQL connection string for lock and store."),
    Key("heartbeat.interval.s", positive_float, 5.0, "Seconds between heartbeats of an instant."),
    Key(
        "heartbeat.tolerance.s",
        positive_float,
        60.0,
        "An inflight instant whose heartbeat is older than this is a failed write.",
    ),
)
