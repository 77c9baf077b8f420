"""The direct task path: each Spark task reads its Kafka offset range, decodes it into Arrow and
writes its base files in the same Python worker; only its write status goes back to the driver.

Spark still plans the batch (the lakesink-kafka source writes its ranges to the offset log),
schedules and retries the tasks and checkpoints the batch; what the direct path leaves out is
the JVM round trip of the rows (Kafka -> Python source -> JVM rows -> Python writer), which
is most of the CPU per record when there is nothing for Spark SQL to do. Inside `foreachBatch`
the driver begins the batch's instants (spark/batch.py: main table, and dead-letter table when
configured), then `write_direct_batch` runs one job whose tasks are the batch's ranges, split
as the source splits them (`kafka.max.records.per.task`), so the task partition ids, write
tokens and commit sequence numbers are those of the DataFrame path; the driver then commits
the tables in order. A failed or retried attempt leaves files that are in no returned status;
the coordinator's marker reconciliation deletes them before it publishes, as on the
DataFrame path.

The rows come out as Spark would hand them to the writer: `transform.arrow` (if set) is
applied to each decoded batch first, as the DataFrame path applies it before the date column
(spark/arrow_transform.py), every batch is cast to the Arrow schema Spark derives from the
analyzed rows (session time zone, Spark's list and map field names), `table.partition.date.from`
adds the same `dt` column, and declared non-nullable columns are restored (`with_required`), so
the table is the same whichever path wrote it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakesink.config import LakesinkConfig
from lakesink.errors import ConfigError
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.iceberg.datafiles import WriteContext
from lakesink.protocol.offsets import OffsetRange
from lakesink.protocol.write_status import WriteStatus
from lakesink.storage import Storage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakesink.spark.arrow_transform import ArrowTransform
    from lakesink.spark.batch import BatchTables, Instants

log = logging.getLogger(__name__)

WRITE_PATHS = ("auto", "direct", "dataframe")
DATE_FORMAT = "%Y-%m-%d"


def uses_direct_path(cfg: LakesinkConfig) -> bool:
    """Whether batches take the direct task path: `write.path=direct`, or `auto` without a
    DataFrame transformation (`transform.arrow` runs in the tasks) and with
    `table.partition.date.from` (if set) naming a timestamp or date column of the rows. A forced
    direct path that cannot give the DataFrame path's rows is a ConfigError."""
    choice = cfg["write.path"]
    if choice == "dataframe":
        return False
    why_not = _direct_path_obstacle(cfg)
    if choice == "direct" and why_not:
        raise ConfigError(f"write.path=direct is not possible: {why_not}; set write.path=auto")
    return why_not is None


def _direct_path_obstacle(cfg: LakesinkConfig) -> str | None:
    if cfg["transform.sql"] or cfg["transform.python"]:
        return "transform.sql and transform.python run on a Spark DataFrame"
    date_from = cfg["table.partition.date.from"]
    if date_from:
        from lakesink.spark.arrow_transform import plan_arrow_transform
        from lakesink.spark.source import declared_arrow_schema

        declared = (
            plan_arrow_transform(cfg).output_schema  # the dates come from the function's rows
            if cfg["transform.arrow"]
            else declared_arrow_schema(cfg)
        )
        if date_from not in declared.names or date_from == "dt":
            return f"table.partition.date.from={date_from!r} is not a value column other than dt"
        kind = declared.field(date_from).type
        if not (pa.types.is_timestamp(kind) or pa.types.is_date(kind)):
            return (
                f"table.partition.date.from={date_from!r} is a {kind} column; the direct path "
                "takes dates from timestamp and date columns only"
            )
    return None


@dataclass(frozen=True, slots=True)
class TableTarget:
    """Where a task writes: a table and the instant its files belong to."""

    storage: Storage
    config: TableConfig
    instant_time: str


@dataclass(frozen=True, slots=True)
class IcebergTarget:
    """Where a task writes on an Iceberg table: the table's write context (schema, spec,
    location, file IO) and the transaction its data files belong to."""

    context: WriteContext
    instant_time: str


@dataclass(frozen=True, slots=True)
class TaskStatuses:
    """What one direct task returns: its write status per table (None: no instant there)."""

    rows: WriteStatus | None
    dead_letters: WriteStatus | None

    def to_json(self) -> str:
        return json.dumps(
            {
                "rows": None if self.rows is None else self.rows.to_json(),
                "dead_letters": None if self.dead_letters is None else self.dead_letters.to_json(),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> TaskStatuses:
        raw = json.loads(text)
        return cls(
            rows=None if raw["rows"] is None else WriteStatus.from_json(raw["rows"]),
            dead_letters=(
                None if raw["dead_letters"] is None else WriteStatus.from_json(raw["dead_letters"])
            ),
        )


class DirectTask:
    """A picklable function for `RDD.mapPartitions`: reads the offset ranges of its Spark
    partition (one piece of a planned range), writes the good rows into the main table and
    the dead letters into the dead-letter table, and yields one `TaskStatuses` as JSON.

    With a dead-letter table configured (`dead_letter_table`) but no instant there
    (`dead_letters` None), the dead-letter table has committed these ranges already: a batch
    replayed after a crash between the two tables' commits. Its bad records are in that table
    once; the task writes them nowhere."""

    def __init__(
        self,
        config_json: str,
        secrets_json: str,
        *,
        rows: TableTarget | IcebergTarget | None,
        dead_letters: TableTarget | IcebergTarget | None,
        dead_letter_table: bool,
        rows_schema: pa.Schema,
        dead_letter_schema: pa.Schema,
        required: tuple[str, ...],
        target_file_size: int,
        transform: ArrowTransform | None = None,
    ) -> None:
        self.config_json = config_json
        self.secrets_json = secrets_json
        self.rows = rows
        self.dead_letters = dead_letters
        self.dead_letter_table = dead_letter_table  # errors.deadletter.table is set
        # The rows as Spark hands them to the DataFrame path's writer (top level nullable
        # except the Kafka coordinates; `required` restores the declared non-nullable ones).
        self.rows_schema = rows_schema
        self.dead_letter_schema = dead_letter_schema
        self.required = required
        self.target_file_size = target_file_size
        self.transform = transform  # `transform.arrow`, applied before the date column

    def __call__(self, pieces: Iterable[OffsetRange]) -> Iterator[str]:
        from pyspark import TaskContext

        from lakesink.faults import task_fault
        from lakesink.formats.hudi.table.files import write_token
        from lakesink.kafka.reader import read_range
        from lakesink.spark.source import (
            CONFIG_OPTION,
            SECRETS_OPTION,
            decode_config,
            value_deserializer,
        )
        from lakesink.spark.task_writer import topic_counts, with_required
        from lakesink.spark.worker_gc import freeze_worker_heap

        freeze_worker_heap()
        cfg = decode_config({CONFIG_OPTION: self.config_json, SECRETS_OPTION: self.secrets_json})
        ctx = TaskContext.get()
        ids = (ctx.partitionId(), ctx.stageId(), ctx.attemptNumber()) if ctx else (0, 0, 0)
        token = write_token(*ids)
        attempt = f"{ids[1]}.{ids[0]}.{ids[2]}"
        rows = _output(self.rows, token, self.target_file_size)
        dead = _output(self.dead_letters, token, self.target_file_size)
        failed: list[Any] = []
        date_from = cfg["table.partition.date.from"]
        for piece in pieces:
            batches = read_range(
                cfg["kafka.bootstrap.servers"],
                piece,
                isolation_level=cfg["kafka.isolation.level"],
                deserializer=value_deserializer(cfg),
                consumer_config=cfg.consumer_config,
                producer_config=cfg.kafka_client_config,
                errors_tolerance=cfg["errors.tolerance"],
                dead_letter_topic=cfg["errors.deadletter.topic"],
                on_dead_letter=failed.append if self.dead_letter_table else None,
            )
            for batch in batches:
                if rows.writer is None or not batch.num_rows:
                    continue
                if self.transform is not None:
                    batch = self.transform(batch)
                    if not batch.num_rows:  # the function kept none of these records
                        continue
                shaped = shape_rows(batch, self.rows_schema, date_from)
                rows.write(with_required(shaped, self.required), topic_counts(shaped))
        if failed and dead.writer is not None:
            letters = dead_letter_batch(failed, self.dead_letter_schema)
            dead.write(letters, topic_counts(letters))
        statuses = TaskStatuses(rows.close(attempt), dead.close(attempt))
        if ctx is not None:  # a test fault: this attempt fails after its files are whole
            task_fault(ctx.attemptNumber())
        yield statuses.to_json()


def _output(
    target: TableTarget | IcebergTarget | None, token: str, target_file_size: int
) -> _Output | _IcebergOutput:
    if isinstance(target, IcebergTarget):
        return _IcebergOutput(target)
    return _Output(target, token, target_file_size)


class _Output:
    """One table's writer inside a direct task (None: no instant for that table)."""

    def __init__(self, target: TableTarget | None, token: str, target_file_size: int) -> None:
        from lakesink.formats.hudi.table.writer import PartitionedWriter
        from lakesink.protocol.instant import InstantTime

        self.target = target
        self.writer = (
            None
            if target is None
            else PartitionedWriter(
                target.storage,
                InstantTime(target.instant_time),
                token,
                target_file_size_bytes=target_file_size,
                config=target.config,
            )
        )
        self.records = 0
        self.topics: dict[str, list[int]] = {}

    def write(self, batch: pa.RecordBatch, counts: dict[str, tuple[int, int]]) -> None:
        assert self.writer is not None
        self.writer.write(batch)
        self.records += batch.num_rows
        for topic, (n, nbytes) in counts.items():
            had = self.topics.setdefault(topic, [0, 0])
            had[0] += n
            had[1] += nbytes

    def close(self, attempt: str) -> WriteStatus | None:
        from lakesink.spark.task_writer import TOPICS_EXTRA

        if self.writer is None or self.target is None:
            return None
        schema = self.writer.avro_schema
        files = self.writer.close()
        return WriteStatus(
            instant_time=self.target.instant_time,
            task_attempt=attempt,
            files=tuple(files),
            records_read=self.records,
            records_written=sum(f.num_writes for f in files),
            extra={**({"schema": schema} if schema else {}), TOPICS_EXTRA: self.topics},
        )


class _IcebergOutput:
    """The Iceberg table's writer inside a direct task: the task's rows become Parquet data
    files with the table's field ids (split by partition, cut at the target size) when it
    closes; its status carries their descriptions and the newest record time per partition
    (for the snapshot's valid-through time)."""

    def __init__(self, target: IcebergTarget) -> None:
        self.target = target
        self.writer = target  # not None: the task writes rows
        self.batches: list[pa.RecordBatch] = []
        self.records = 0
        self.topics: dict[str, list[int]] = {}
        self.newest_ms: dict[str, int] = {}

    def write(self, batch: pa.RecordBatch, counts: dict[str, tuple[int, int]]) -> None:
        self.batches.append(batch)
        self.records += batch.num_rows
        for topic, (n, nbytes) in counts.items():
            had = self.topics.setdefault(topic, [0, 0])
            had[0] += n
            had[1] += nbytes
        for key, ms in newest_record_ms(batch).items():
            self.newest_ms[key] = max(ms, self.newest_ms.get(key, ms))

    def close(self, attempt: str) -> WriteStatus:
        from lakesink.formats.iceberg.coordinator import FILES_KEY, MAX_TS_KEY
        from lakesink.formats.iceberg.datafiles import write_data_files
        from lakesink.protocol.write_status import FileWrite
        from lakesink.spark.task_writer import TOPICS_EXTRA

        t = self.target.instant_time
        described = (
            write_data_files(
                self.target.context,
                pa.Table.from_batches(self.batches),
                attempt_id=f"{t}-{attempt}",
            )
            if self.batches
            else []
        )
        return WriteStatus(
            instant_time=t,
            task_attempt=attempt,
            files=tuple(
                FileWrite("", d.path, d.path, d.record_count, d.size_bytes) for d in described
            ),
            records_read=self.records,
            records_written=sum(d.record_count for d in described),
            extra={
                FILES_KEY: [d.to_json() for d in described],
                MAX_TS_KEY: self.newest_ms,
                TOPICS_EXTRA: self.topics,
            },
        )


class IcebergArrowWriter:
    """A picklable function for `DataFrame.mapInArrow` (the DataFrame path, e.g. after a
    transformation): writes the rows it is given as data files of the Iceberg table and yields
    one row holding this attempt's WriteStatus as JSON, shaped as a direct task's (data file
    descriptions, newest record time per partition), so the coordinator commits either alike.
    A failed or retried attempt's files carry its own attempt id and stay unreferenced."""

    def __init__(self, target: IcebergTarget, required: tuple[str, ...] = ()) -> None:
        self.target = target
        self.required = required  # declared non-nullable columns (see `with_required`)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        from lakesink.faults import task_fault
        from lakesink.spark.task_writer import topic_counts, with_required
        from lakesink.spark.worker_gc import freeze_worker_heap

        freeze_worker_heap()
        ctx = TaskContext.get()
        ids = (ctx.partitionId(), ctx.stageId(), ctx.attemptNumber()) if ctx else (0, 0, 0)
        out = _IcebergOutput(self.target)
        for batch in batches:
            if batch.num_rows:
                rows = with_required(batch, self.required)
                out.write(rows, topic_counts(rows))
        status = out.close(f"{ids[1]}.{ids[0]}.{ids[2]}")
        if ctx is not None:  # a test fault: this attempt fails after its files are whole
            task_fault(ctx.attemptNumber())
        yield pa.RecordBatch.from_pylist(
            [{"status": json.dumps(status.to_json())}], pa.schema([("status", pa.string())])
        )


def newest_record_ms(batch: pa.RecordBatch) -> dict[str, int]:
    """The newest `kafka_timestamp` (epoch ms) per topic partition (`TopicPartition.key()`);
    none when the rows lack a Kafka coordinate column (a transformation dropped it)."""
    import pyarrow.compute as pc

    from lakesink.protocol.offsets import TopicPartition

    names = batch.schema.names
    needed = ("kafka_timestamp", "kafka_topic", "kafka_partition")
    if not batch.num_rows or not all(n in names for n in needed):
        return {}
    stamps = pc.cast(pc.cast(batch.column("kafka_timestamp"), pa.timestamp("ms")), pa.int64())
    grouped = (
        pa.table(
            {
                "t": batch.column("kafka_topic"),
                "p": batch.column("kafka_partition"),
                "ms": stamps,
            }
        )
        .group_by(["t", "p"])
        .aggregate([("ms", "max")])
    )
    return {
        TopicPartition(str(t), int(p)).key(): int(ms)
        for t, p, ms in zip(
            grouped.column("t").to_pylist(),
            grouped.column("p").to_pylist(),
            grouped.column("ms_max").to_pylist(),
            strict=True,
        )
        if ms is not None
    }


def shape_rows(batch: pa.RecordBatch, schema: pa.Schema, date_from: str | None) -> pa.RecordBatch:
    """`batch` as the DataFrame path's writer gets it: cast to Spark's Arrow form of the rows
    (`schema`, without `dt`), then the `dt` column of `table.partition.date.from` (Spark's
    `date_format(col, 'yyyy-MM-dd')` in UTC; replacing a `dt` column in place, else appended)."""
    import pyarrow.compute as pc

    from lakesink.spark.task_writer import DATE_PARTITION_COLUMN

    if date_from and DATE_PARTITION_COLUMN in batch.schema.names:
        batch = batch.drop_columns([DATE_PARTITION_COLUMN])  # Spark replaces it: recomputed
    base = pa.schema([f for f in schema if not (date_from and f.name == DATE_PARTITION_COLUMN)])
    out = batch.cast(base) if batch.schema != base else batch
    if not date_from:
        return out
    column = out.column(date_from)
    if pa.types.is_timestamp(column.type):
        day = pc.strftime(column, format=DATE_FORMAT)
    else:
        day = pc.cast(column, pa.string())
    dt = schema.field(DATE_PARTITION_COLUMN)
    columns = [*out.columns, day.cast(dt.type)]
    fields = [*out.schema, dt]
    at = schema.get_field_index(DATE_PARTITION_COLUMN)
    if at != len(fields) - 1:  # `dt` was a column of the rows: it keeps its place
        columns.insert(at, columns.pop())
        fields.insert(at, fields.pop())
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))


def dead_letter_batch(failed: Sequence[Any], schema: pa.Schema) -> pa.RecordBatch:
    """Records that failed to decode as rows of the dead-letter table (`schema`: Spark's Arrow
    form of DEAD_LETTER_SCHEMA), in the order the reader met them."""
    from lakesink.kafka.dead_letters import headers_array, timestamps_array

    given = {
        "kafka_topic": pa.array([f.partition.topic for f in failed], pa.string()),
        "kafka_partition": pa.array([f.partition.partition for f in failed], pa.int32()),
        "kafka_offset": pa.array([f.offset for f in failed], pa.int64()),
        "kafka_timestamp": timestamps_array([f.timestamp_ms for f in failed]),
        "kafka_key": pa.array([f.key for f in failed], pa.binary()),
        "kafka_value": pa.array([f.value for f in failed], pa.binary()),
        "kafka_headers": headers_array([list(f.headers) or None for f in failed]),
        "error": pa.array([f.error for f in failed], pa.string()),
    }
    return pa.RecordBatch.from_arrays([given[f.name].cast(f.type) for f in schema], schema=schema)


def spark_arrow_schema(spark: SparkSession, schema: Any) -> pa.Schema:
    """The Arrow schema Spark hands a `mapInArrow` function for rows of `schema` (a StructType):
    the session's time zone, large string types when the session asks for them."""
    from pyspark.sql.pandas.types import to_arrow_schema

    zone = spark.conf.get("spark.sql.session.timeZone") or "UTC"
    large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
    result: pa.Schema = to_arrow_schema(schema, timezone=zone, prefers_large_types=large)
    return result


def task_pieces(ranges: Sequence[OffsetRange], per_task: int) -> list[OffsetRange]:
    """The batch's tasks in the source's order (`KafkaStreamReader.partitions`)."""
    return [piece for r in ranges if not r.is_empty for piece in r.split(per_task)]


def write_direct_batch(
    spark: SparkSession,
    cfg: LakesinkConfig,
    tables: BatchTables,
    instants: Instants,
    ranges: Sequence[OffsetRange],
    *,
    output_schema: Any,
    required: tuple[str, ...],
    transform: ArrowTransform | None,
) -> dict[str, list[WriteStatus]]:
    """One batch's files on the direct path: one Spark job whose tasks read, decode and write
    the batch's ranges into every table with a begun instant (`output_schema`: the rows'
    declared StructType); the write statuses by table role. The caller commits them."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from lakesink.spark.batch import DEAD_LETTERS, ROWS
    from lakesink.spark.source import encode_config, encode_secrets

    dead = tables[DEAD_LETTERS].coordinator if DEAD_LETTERS in tables else None
    task = DirectTask(
        encode_config(cfg),
        encode_secrets(cfg),
        rows=_target(tables[ROWS].coordinator, instants.get(ROWS)),
        dead_letters=_target(dead, instants.get(DEAD_LETTERS)),
        dead_letter_table=dead is not None,
        rows_schema=_relaxed(spark_arrow_schema(spark, output_schema), required),
        dead_letter_schema=spark_arrow_schema(spark, from_arrow_schema(dead_letter_rows(cfg))),
        required=required,
        target_file_size=cfg["table.target.file.size.bytes"],
        transform=transform,
    )
    statuses = _run_tasks(spark, task, task_pieces(ranges, cfg["kafka.max.records.per.task"]))
    return {
        ROWS: [s.rows for s in statuses if s.rows is not None],
        DEAD_LETTERS: [s.dead_letters for s in statuses if s.dead_letters is not None],
    }


def dead_letter_rows(cfg: LakesinkConfig) -> pa.Schema:
    """DEAD_LETTER_SCHEMA as the DataFrame path selects it from the source's rows: each column
    as nullable as the source column it comes from (`kafka_value` and `error` from the
    dead-letter columns, which are null on good rows)."""
    from lakesink.kafka.dead_letters import DEAD_LETTER_SCHEMA
    from lakesink.spark.source import ERROR_COLUMN, RAW_VALUE_COLUMN, source_arrow_schema

    source = source_arrow_schema(cfg)
    if ERROR_COLUMN not in source.names:  # no dead-letter table
        return DEAD_LETTER_SCHEMA
    origin = {"kafka_value": RAW_VALUE_COLUMN, "error": ERROR_COLUMN}
    return pa.schema(
        [
            f.with_nullable(source.field(origin.get(f.name, f.name)).nullable)
            for f in DEAD_LETTER_SCHEMA
        ]
    )


def _relaxed(schema: pa.Schema, required: Sequence[str]) -> pa.Schema:
    """`schema` with the top-level columns outside `required` nullable, as the source hands
    them to Spark (`with_required` restores the rest)."""
    return pa.schema([f if f.name in required else f.with_nullable(True) for f in schema])


def iceberg_target(coordinator: Any, instant: Any) -> IcebergTarget | None:
    """Where an Iceberg coordinator's tasks write for `instant` (None: not an Iceberg table)."""
    from lakesink.formats.iceberg.coordinator import IcebergCoordinator

    if not isinstance(coordinator, IcebergCoordinator):
        return None
    return IcebergTarget(coordinator.format.table.write_context(), instant.value)


def _target(coordinator: Any, instant: Any) -> TableTarget | IcebergTarget | None:
    if coordinator is None or instant is None:
        return None
    iceberg = iceberg_target(coordinator, instant)
    if iceberg is not None:
        return iceberg
    table = coordinator.table
    return TableTarget(table.storage, table.config, instant.value)


def _run_tasks(
    spark: SparkSession, task: DirectTask, pieces: list[OffsetRange]
) -> list[TaskStatuses]:
    if not pieces:
        return []
    sc = spark.sparkContext
    sc.setJobDescription(f"lakesink: read, decode and write {len(pieces)} Kafka range(s)")
    try:
        rows = sc.parallelize(pieces, len(pieces)).mapPartitions(task).collect()
    finally:
        sc.setJobDescription(None)  # type: ignore[arg-type]  # None clears it
    return [TaskStatuses.from_json(r) for r in rows]
