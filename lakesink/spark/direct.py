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

Writes by key into an Iceberg table of keys (write.operation upsert or cdc) need every row of a
bucket in one writer task, which rewrites the bucket. Their job has two stages: the read tasks
(the pieces as above, a small batch's gathered into one task per core) decode their rows and
split them by the writer of their bucket (`group % writers`, one writer per core as on the
DataFrame path), handing each part on as an Arrow IPC stream through Spark's shuffle; each
writer task folds its buckets' rows over their files. The rows never take the JVM's row format,
and the Python data source, the DataFrame's two Python stages and its planning are left out: one
Python worker per task and stage.

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
from lakesink.formats.task import KeyedTaskTarget, TaskTarget
from lakesink.protocol.offsets import OffsetRange
from lakesink.protocol.write_status import WriteStatus

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakesink.spark.arrow_transform import ArrowTransform
    from lakesink.spark.batch import BatchTables, Instants
    from lakesink.spark.task_writer import ReadTally

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
    why_not = routed_direct_obstacle(cfg) if cfg["tables"] else _direct_path_obstacle(cfg)
    if choice == "direct" and why_not:
        raise ConfigError(f"write.path=direct is not possible: {why_not}; set write.path=auto")
    return why_not is None


def routed_direct_obstacle(cfg: LakesinkConfig) -> str | None:
    """Why the batches of a many-table ingestion (`tables.<name>.*`) cannot take the direct
    path (None: they can, lakesink.spark.routing's `RoutedDirectTask`): its tasks give every
    table the same decoded rows, so no table may transform or date-partition its rows, write by
    key or ask for the DataFrame path; dynamic tables are named by the batch's rows, which the
    DataFrame reads before any table begins; and the tasks match the routes' regexes in Arrow
    (RE2 syntax). The rows' types are checked by the sink (`RoutingSink`)."""
    if cfg["route.dynamic.field"]:
        return "route.dynamic.field names its tables from each batch's rows on a Spark DataFrame"
    for spec, table in cfg.table_configs():
        where = f"table {spec.name}"
        if table["write.operation"] != "append":
            return f"{where} has write.operation={table['write.operation']} (appends only)"
        for key in ("transform.sql", "transform.python", "transform.arrow"):
            if table[key]:
                return f"{where} has {key} (the tables share one decoding of the rows)"
        if table["table.partition.date.from"]:
            return f"{where} has table.partition.date.from (the tables share the rows as read)"
        route = spec.route
        for pattern in (route.topic_pattern, route.regex):
            if pattern is not None and not _re2_compiles(pattern):
                return f"{where}'s route regex {pattern!r} is not RE2 syntax (Arrow's regexes)"
    return None


def _re2_compiles(pattern: str) -> bool:
    import pyarrow.compute as pc

    try:
        pc.match_substring_regex(pa.array(["x"], pa.string()), f"^(?:{pattern})$")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


def _direct_path_obstacle(cfg: LakesinkConfig) -> str | None:
    if cfg["transform.sql"] or cfg["transform.python"]:
        return "transform.sql and transform.python run on a Spark DataFrame"
    from lakesink.formats import plugin_of

    operation = cfg["write.operation"]
    if operation != "append" and not plugin_of(cfg.settings).keyed_writes_by_task:
        return (
            f"write.operation={operation} on a {cfg['table.format']} table rewrites each "
            "bucket in one task, so the rows of all Kafka partitions are shuffled by bucket on "
            "a Spark DataFrame"
        )
    if operation != "append" and cfg["errors.deadletter.table"]:
        return (
            f"write.operation={operation} with errors.deadletter.table splits the dead letters "
            "off the rows shuffled by bucket on a Spark DataFrame"
        )
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
    the dead letters into the dead-letter table (each a format's `TaskTarget`, None: no instant
    there), and yields one `TaskStatuses` as JSON.

    With a dead-letter table configured (`dead_letter_table`) but no instant there
    (`dead_letters` None), the dead-letter table has committed these ranges already: a batch
    replayed after a crash between the two tables' commits. Its bad records are in that table
    once; the task writes them nowhere."""

    def __init__(
        self,
        config_json: str,
        secrets_json: str,
        *,
        rows: TaskTarget | None,
        dead_letters: TaskTarget | None,
        dead_letter_table: bool,
        rows_schema: pa.Schema,
        dead_letter_schema: pa.Schema,
        required: tuple[str, ...],
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
        self.transform = transform  # `transform.arrow`, applied before the date column

    def __call__(self, pieces: Iterable[OffsetRange]) -> Iterator[str]:
        from pyspark import TaskContext

        from lakesink.faults import task_fault
        from lakesink.spark.task_writer import TableOutput, task_attempt
        from lakesink.spark.worker_gc import freeze_worker_heap

        freeze_worker_heap()
        ctx = TaskContext.get()
        attempt = task_attempt(ctx)
        rows = None if self.rows is None else TableOutput(self.rows, attempt)
        dead = None if self.dead_letters is None else TableOutput(self.dead_letters, attempt)
        failed: list[Any] = []
        for batch in self.rows_of(pieces, failed, keep=rows is not None):
            assert rows is not None
            rows.write(batch)
        if failed and dead is not None:
            dead.write(dead_letter_batch(failed, self.dead_letter_schema))
        statuses = TaskStatuses(
            None if rows is None else rows.close(), None if dead is None else dead.close()
        )
        if ctx is not None:  # a test fault: this attempt fails after its files are whole
            task_fault(ctx.attemptNumber())
        yield statuses.to_json()

    def rows_of(
        self, pieces: Iterable[OffsetRange], failed: list[Any], *, keep: bool = True
    ) -> Iterator[pa.RecordBatch]:
        """The rows of the pieces' records as the DataFrame path's writer gets them
        (`transform.arrow`, Spark's Arrow form, the date column, the declared non-nullable
        columns); with a dead-letter table the records that failed to decode go to `failed`.
        `keep=False`: the records are read for their dead letters only."""
        from lakesink.kafka.reader import read_range
        from lakesink.spark.source import (
            CONFIG_OPTION,
            SECRETS_OPTION,
            decode_config,
            value_deserializer,
        )
        from lakesink.spark.task_writer import with_required

        cfg = decode_config({CONFIG_OPTION: self.config_json, SECRETS_OPTION: self.secrets_json})
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
                if not keep or not batch.num_rows:
                    continue
                if self.transform is not None:
                    batch = self.transform(batch)
                    if not batch.num_rows:  # the function kept none of these records
                        continue
                shaped = shape_rows(batch, self.rows_schema, date_from)
                yield with_required(shaped, self.required)


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

    from lakesink.formats import plugin_of
    from lakesink.spark.batch import DEAD_LETTERS, ROWS
    from lakesink.spark.source import encode_config, encode_secrets

    plugin = plugin_of(cfg.settings)

    def target(role: str) -> TaskTarget | None:
        instant = instants.get(role)
        if role not in tables or instant is None:
            return None
        size = cfg["table.target.file.size.bytes"]
        return plugin.task_target(tables[role].coordinator, instant.value, size)

    task = DirectTask(
        encode_config(cfg),
        encode_secrets(cfg),
        rows=target(ROWS),
        dead_letters=target(DEAD_LETTERS),
        dead_letter_table=DEAD_LETTERS in tables,
        rows_schema=_relaxed(spark_arrow_schema(spark, output_schema), required),
        dead_letter_schema=spark_arrow_schema(spark, from_arrow_schema(dead_letter_rows(cfg))),
        required=required,
        transform=transform,
    )
    per_task = cfg["kafka.max.records.per.task"]
    pieces = task_pieces(ranges, per_task)
    if isinstance(task.rows, KeyedTaskTarget):  # a table of keys: the rows shuffled by group
        if single_keyed_task(pieces, cfg["write.keyed.single.task.max.records"]):
            # a small batch: one task reads, folds and writes every bucket (no shuffle stage)
            (status,) = _run_tasks(spark, task, pieces, tasks=1)
            return {ROWS: [] if status.rows is None else [status.rows], DEAD_LETTERS: []}
        prefold = cfg["write.keyed.prefold.max.distinct"]
        written = _run_keyed_tasks(spark, task, task.rows, pieces, per_task, prefold)
        return {ROWS: written, DEAD_LETTERS: []}
    statuses = _run_tasks(spark, task, pieces)
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


PREFOLD_MAX_DISTINCT = 0.75
"""`write.keyed.prefold.max.distinct`'s default: a read task pre-folds its rows when its first
key column holds at most this share of distinct values (a count, no sort): below it the fold
hands on at most that share of the rows; above it the fold's sort would cost about what it
saves on the shuffle (a cold key space)."""
TALLY_METADATA = b"lakesink.read_tally"
"""Schema metadata of a pre-folded IPC stream: the `ReadTally` of the records its read task read
(on the task's first stream; a zero tally on the others), which its writer counts instead."""


class KeyedReadTask:
    """Stage one of a batch written by key on the direct path (`RDD.mapPartitions`): reads and
    decodes its pieces as `DirectTask` does, and yields its rows split by the writer task their
    group goes to (`group % tasks`), as (task, Arrow IPC stream) pairs for the shuffle: every row
    of a group reaches one writer, which rewrites the group (a bucket).

    A map-side combine: when the target's writer folds by key (`FoldingTaskTarget`) and the
    task's rows repeat their keys (`PREFOLD_MAX_DISTINCT`), the task hands on only the versions
    the writer's fold can need (`lakesink.engine.fold.prefold_mask`: on a hot key space about
    one row per key instead of every record), plus each Kafka partition's newest record (the
    table's valid-through timestamp is the newest record written), and the streams carry the
    count of the records read (`TALLY_METADATA`): the batch's records, metrics and progress
    line stay the records read, not the rows shuffled."""

    def __init__(
        self,
        task: DirectTask,
        target: KeyedTaskTarget,
        tasks: int,
        max_distinct: float = PREFOLD_MAX_DISTINCT,
    ) -> None:
        self.task = task
        self.target = target
        self.tasks = tasks
        self.max_distinct = max_distinct

    def __call__(self, groups: Iterable[Sequence[OffsetRange]]) -> Iterator[tuple[int, bytes]]:
        from lakesink.spark.task_writer import ReadTally
        from lakesink.spark.worker_gc import freeze_worker_heap

        freeze_worker_heap()
        pieces = [piece for group in groups for piece in group]
        batches = list(self.task.rows_of(pieces, []))
        try:
            rows = pa.Table.from_batches(batches) if batches else None
        except pa.ArrowInvalid:  # batches of different schemas: the writer says why
            rows = None
        keep = None if rows is None else self.prefold(rows)
        if rows is None or keep is None:  # handed on as read
            for batch in batches:
                yield from self._split(batch, None)
            return
        tally: ReadTally | None = ReadTally.of(batches)
        for batch in rows.filter(pa.array(keep)).combine_chunks().to_batches():
            for pair in self._split(batch, tally):
                tally = ReadTally()  # counted once, on the task's first stream
                yield pair

    def prefold(self, rows: pa.Table) -> Any:
        """The rows to hand on (a boolean numpy mask), or None: all of them, as read. Rows the
        writer refuses (a null key, a missing column) are handed on whole, so that its error
        names the same record."""
        import pyarrow.compute as pc

        from lakesink.engine.fold import OFFSET_COLUMN, PARTITION_COLUMN, prefold_mask
        from lakesink.errors import RecordError
        from lakesink.formats.task import FoldingTaskTarget

        if not isinstance(self.target, FoldingTaskTarget) or rows.num_rows < 2:
            return None
        key, ordering = self.target.fold_key
        needed = [*key, PARTITION_COLUMN, OFFSET_COLUMN, *([ordering] if ordering else [])]
        if any(c not in rows.column_names for c in needed):
            return None
        if any(rows.column(k).null_count for k in key):
            return None
        distinct = pc.count_distinct(rows.column(key[0])).as_py()
        if distinct > self.max_distinct * rows.num_rows:
            return None
        try:
            keep = prefold_mask(rows, key, ordering)
        except RecordError:
            return None
        if keep.all():
            return None
        newest = newest_of_each_partition(rows)
        return None if newest is None else keep | newest

    def _split(self, batch: pa.RecordBatch, tally: ReadTally | None) -> Iterator[tuple[int, bytes]]:
        """`batch` split by writer task, each part an IPC stream (`tally`: a pre-folded
        task's, on its first stream; a zero one on the rest)."""
        import numpy as np

        from lakesink.spark.task_writer import ReadTally

        groups = self.target.group_ids(batch).to_numpy(zero_copy_only=False)
        writers = np.asarray(groups, dtype=np.int64) % self.tasks
        for writer in np.unique(writers):
            part = batch.filter(pa.array(writers == writer))
            if tally is not None:
                meta = {**(part.schema.metadata or {}), TALLY_METADATA: tally.to_json()}
                part = part.replace_schema_metadata(meta)
                tally = ReadTally()  # counted once
            yield int(writer), ipc_bytes(part)


def newest_of_each_partition(rows: pa.Table) -> Any:
    """A boolean numpy mask of one row per Kafka topic and partition holding its newest
    `kafka_timestamp` (none where the rows lack a coordinate column or a timestamp); None when
    the timestamps are not of a timestamp or integer type (a transformation's)."""
    import numpy as np
    import pyarrow.compute as pc

    n = rows.num_rows
    newest = np.zeros(n, dtype=bool)
    names = ("kafka_topic", "kafka_partition", "kafka_timestamp")
    if not all(c in rows.column_names for c in names):
        return newest
    topic = pc.fill_null(
        rows.column("kafka_topic").combine_chunks().dictionary_encode().indices, -1
    )
    partition = pc.fill_null(rows.column("kafka_partition"), -1)
    stamp = rows.column("kafka_timestamp")
    if not (pa.types.is_timestamp(stamp.type) or pa.types.is_integer(stamp.type)):
        return None
    valid = pc.is_valid(stamp).to_numpy(zero_copy_only=False)
    if not valid.any():
        return newest
    ms = pc.fill_null(pc.cast(stamp, pa.int64()), 0)  # in the column's own unit
    t, p, m = (
        np.asarray(x.to_numpy(zero_copy_only=False), dtype=np.int64) for x in (topic, partition, ms)
    )
    order = np.lexsort((m, valid, p, t))  # last of each (topic, partition): its newest
    last = np.append((t[order][1:] != t[order][:-1]) | (p[order][1:] != p[order][:-1]), True)
    ends = order[last]
    newest[ends[valid[ends]]] = True
    return newest


class KeyedWriteTask:
    """Stage two of a batch written by key on the direct path: the rows of its groups (Arrow
    IPC streams from `KeyedReadTask`) into the format's keyed writer; yields one
    `TaskStatuses` as JSON, as `DirectTask` does. A stream a read task pre-folded counts as the
    records it stands for (`TALLY_METADATA`)."""

    def __init__(self, target: KeyedTaskTarget) -> None:
        self.target = target

    def __call__(self, shuffled: Iterable[tuple[int, bytes]]) -> Iterator[str]:
        from pyspark import TaskContext

        from lakesink.faults import task_fault
        from lakesink.spark.task_writer import ReadTally, TableOutput, task_attempt
        from lakesink.spark.worker_gc import freeze_worker_heap

        freeze_worker_heap()
        ctx = TaskContext.get()
        out = TableOutput(self.target, task_attempt(ctx))
        for _, data in shuffled:
            stream = pa.ipc.open_stream(data)
            meta = dict(stream.schema.metadata or {})
            tally = meta.pop(TALLY_METADATA, None)
            for batch in stream:
                if tally is None:
                    out.write(batch)
                    continue
                out.write(batch.replace_schema_metadata(meta or None), ReadTally.from_json(tally))
                tally = ReadTally().to_json()  # one stream's tally, counted once
        status = out.close()
        if ctx is not None:  # a test fault: this attempt fails after its files are whole
            task_fault(ctx.attemptNumber())
        yield TaskStatuses(status, None).to_json()


def ipc_bytes(batch: pa.RecordBatch) -> bytes:
    """`batch` as one Arrow IPC stream (what the shuffle carries between the two stages)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def _writer_of(task: int) -> int:
    """The shuffle's partition function: `KeyedReadTask` keys each piece by its writer task."""
    return task


def read_groups(
    pieces: Sequence[OffsetRange], per_task: int, slots: int
) -> list[list[OffsetRange]]:
    """The read tasks of a batch written by key: its pieces in as few tasks as keep every core
    busy (`slots`) and each task near `per_task` offsets (kafka.max.records.per.task), the
    largest pieces placed first, each on the task with the fewest offsets. Unlike an append's
    tasks these write nothing, so they need not be one per piece: a small batch over many
    Kafka partitions takes `slots` tasks, not one per partition, each task a fixed cost."""
    if not pieces:
        return []
    total = sum(p.end - p.start for p in pieces)
    count = min(len(pieces), max(slots, -(-total // per_task)))
    groups: list[list[OffsetRange]] = [[] for _ in range(count)]
    sizes = [0] * count
    for piece in sorted(pieces, key=lambda p: p.end - p.start, reverse=True):
        at = sizes.index(min(sizes))
        groups[at].append(piece)
        sizes[at] += piece.end - piece.start
    order = {id(p): i for i, p in enumerate(pieces)}
    return [sorted(g, key=lambda p: order[id(p)]) for g in groups]


def _run_keyed_tasks(
    spark: SparkSession,
    task: DirectTask,
    target: KeyedTaskTarget,
    pieces: list[OffsetRange],
    per_task: int,
    max_distinct: float = PREFOLD_MAX_DISTINCT,
) -> list[WriteStatus]:
    """One job of two stages: the pieces read, pre-folded where their keys repeat
    (`max_distinct`) and split by group (`read_groups`), then one writer task per core
    rewriting whole groups (as the DataFrame path's shuffle hands them out)."""
    if not pieces:
        return []
    sc = spark.sparkContext
    tasks = max(1, sc.defaultParallelism)
    groups = read_groups(pieces, per_task, tasks)
    sc.setJobDescription(
        f"lakesink: read {len(pieces)} Kafka range(s) in {len(groups)} task(s), write by key "
        f"in {tasks}"
    )
    try:
        rows = (
            sc.parallelize(groups, len(groups))
            .mapPartitions(KeyedReadTask(task, target, tasks, max_distinct))
            .partitionBy(tasks, _writer_of)
            .mapPartitions(KeyedWriteTask(target))
            .collect()
        )
    finally:
        sc.setJobDescription(None)  # type: ignore[arg-type]  # None clears it
    return [s.rows for s in map(TaskStatuses.from_json, rows) if s.rows is not None]


def single_keyed_task(pieces: Sequence[OffsetRange], max_records: int) -> bool:
    """Whether a batch written by key takes one task (`write.keyed.single.task.max.records`):
    it has pieces and at most `max_records` offsets. Its task is the only writer, so every
    bucket still has one writer; what it saves is the second stage and three of the four
    tasks of the two-stage job on two cores, each a fixed cost a small batch cannot pay off."""
    return bool(pieces) and sum(p.end - p.start for p in pieces) <= max_records


def _run_tasks(
    spark: SparkSession, task: DirectTask, pieces: list[OffsetRange], tasks: int = 0
) -> list[TaskStatuses]:
    """One job of `tasks` tasks over the pieces (0: one task per piece)."""
    if not pieces:
        return []
    sc = spark.sparkContext
    tasks = tasks or len(pieces)
    sc.setJobDescription(
        f"lakesink: read, decode and write {len(pieces)} Kafka range(s) in {tasks} task(s)"
    )
    try:
        rows = sc.parallelize(pieces, tasks).mapPartitions(task).collect()
    finally:
        sc.setJobDescription(None)  # type: ignore[arg-type]  # None clears it
    return [TaskStatuses.from_json(r) for r in rows]
