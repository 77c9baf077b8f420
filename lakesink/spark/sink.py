"""Driver side of the sink: the `foreachBatch` function that runs one batch's commit protocol."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from lakesink.config import LakesinkConfig
from lakesink.engine.async_commit import AsyncCommitter
from lakesink.engine.coordinator import BatchOutcome, Coordinator
from lakesink.engine.schema import TableSchema
from lakesink.errors import CommitConflictError, ConfigError, InternalError, LakesinkError
from lakesink.formats import FormatPlugin, plugin_of
from lakesink.formats.task import KeyedTaskTarget
from lakesink.metrics import IngestionMetrics
from lakesink.protocol.mutation import CHANGE_COLUMNS
from lakesink.protocol.offsets import OffsetRange
from lakesink.protocol.write_status import WriteStatus
from lakesink.spark.arrow_transform import (
    ArrowTransform,
    plan_arrow_transform,
    session_arrow_options,
)
from lakesink.spark.batch import DEAD_LETTERS, ROWS, BatchTable, BatchTables, Instants
from lakesink.spark.direct import write_direct_batch
from lakesink.spark.replay_check import lost_spans
from lakesink.spark.source import ERROR_COLUMN, RAW_VALUE_COLUMN, offset_to_ranges
from lakesink.spark.task_writer import (
    DATE_PARTITION_COLUMN,
    STATUS_SCHEMA,
    TaskWriter,
    parse_statuses,
    rows_per_topic,
)

log = logging.getLogger(__name__)


def planned_ranges(checkpoint: Path, batch_id: int) -> list[OffsetRange]:
    """The ranges Spark planned for batch `batch_id`, from its offset log (`offsets/N`):
    a version line, a metadata line, then one offset line per source."""
    path = checkpoint / "offsets" / str(batch_id)
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise LakesinkError(f"cannot read Spark's offset log {path}: {e.strerror}") from e
    sources = [ln for ln in lines[2:] if ln.strip()]
    if len(sources) != 1:
        raise LakesinkError(
            f"{path} lists {len(sources)} sources; "
            "a lakesink query reads exactly one lakesink-kafka source"
        )
    return offset_to_ranges(json.loads(sources[0]))


def offset_log_time(checkpoint: Path, batch_id: int) -> float | None:
    """When Spark planned batch `batch_id`: its offset log's modification time (None if gone)."""
    try:
        return (checkpoint / "offsets" / str(batch_id)).stat().st_mtime
    except OSError:
        return None


class ArrowTransformStep:
    """`transform.arrow` on a DataFrame (the DataFrame path): the function applied with
    `mapInArrow` to the batch's rows. The driver plans it once (`plan`: the function called on
    an empty batch gives the output schema); the direct path's tasks apply the same plan."""

    def __init__(self, cfg: LakesinkConfig) -> None:
        self.cfg = cfg
        self._planned: ArrowTransform | None = None

    def plan(self, spark: SparkSession) -> ArrowTransform:
        if self._planned is None:
            zone, large = session_arrow_options(spark)
            self._planned = plan_arrow_transform(self.cfg, zone, large)
        return self._planned

    def __call__(self, df: DataFrame) -> DataFrame:
        planned = self.plan(df.sparkSession)
        return df.mapInArrow(planned.map_batches, planned.spark_schema())


def load_transform(cfg: LakesinkConfig) -> Callable[[DataFrame], DataFrame] | None:
    """The configured transformation as a function of the batch's DataFrame (None: none)."""
    if cfg["transform.arrow"]:
        return ArrowTransformStep(cfg)
    if cfg["transform.sql"]:
        sql = cfg["transform.sql"]

        def run_sql(df: DataFrame) -> DataFrame:
            df.createOrReplaceTempView("source")
            return df.sparkSession.sql(sql)

        return run_sql
    if cfg["transform.python"]:
        module, _, func = str(cfg["transform.python"]).partition(":")
        try:
            fn = getattr(importlib.import_module(module), func)
        except (ImportError, AttributeError) as e:
            raise ConfigError(
                f"transform.python={cfg['transform.python']!r} cannot be loaded: {e}; "
                "expected 'module:function' importable on the driver and executors"
            ) from e
        return fn  # type: ignore[no-any-return]
    return None


def prepare_rows(
    df: DataFrame,
    cfg: LakesinkConfig,
    transform: Callable[[DataFrame], DataFrame] | None,
    partition_fields: tuple[str, ...],
) -> DataFrame:
    """The rows a batch writes: the user's transformation, then the date partition column."""
    if transform is not None:
        df = transform(df)
    date_from = cfg["table.partition.date.from"]
    if date_from:
        if date_from not in df.columns:
            raise ConfigError(
                f"table.partition.date.from={date_from!r} is not a column; columns are "
                f"{', '.join(df.columns)}"
            )
        df = df.withColumn(DATE_PARTITION_COLUMN, F.date_format(F.col(date_from), "yyyy-MM-dd"))
    missing = [c for c in partition_fields if c not in df.columns]
    if missing:
        raise ConfigError(f"partition column(s) {missing} are not in the rows: {df.columns}")
    return df


@contextlib.contextmanager
def _quiet_query_context_loggers() -> Iterator[None]:
    """PySpark logs every analysis error with its query context (JSON lines, Java frames
    included) on loggers of its own; while lakesink analyzes the transformation, the error it
    raises says what is wrong in one line, so those stay quiet."""
    from pyspark.logger import PySparkLogger

    loggers = [
        PySparkLogger.getLogger(name)
        for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger")
    ]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _first_line(error: BaseException) -> str:
    text = str(error)
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), type(error).__name__)


def analyze_rows(
    cfg: LakesinkConfig, spark: SparkSession, partition_fields: tuple[str, ...]
) -> StructType:
    """The schema of the rows batches will write, found without reading Kafka: the
    transformation and partitioning applied to an empty DataFrame of the declared source schema.
    Spark analyzes the plan, so a syntax error, an unknown column or a type error in
    `transform.sql` (or a `transform.python` that fails on the source columns, or a
    `transform.arrow` that fails on an empty batch of them) is a ConfigError before anything is
    written. Non-nullable columns of the result are the ones the writer keeps non-nullable
    (see `TaskWriter.required`)."""
    from pyspark.errors import PySparkException
    from pyspark.sql.pandas.types import from_arrow_schema

    from lakesink.spark.source import declared_arrow_schema

    transform = load_transform(cfg)
    source = spark.createDataFrame([], from_arrow_schema(declared_arrow_schema(cfg)))
    which = next((k for k in ("transform.sql", "transform.arrow") if cfg[k]), "transform.python")
    try:
        with _quiet_query_context_loggers():
            return prepare_rows(source, cfg, transform, partition_fields).schema
    except LakesinkError:
        raise
    except PySparkException as e:
        raise ConfigError(
            f"{which} does not apply to the source columns "
            f"({', '.join(source.columns)}): {_first_line(e)}"
        ) from None
    except Exception as e:  # a transform.python function failing on the source columns
        raise ConfigError(
            f"{which}={cfg[which]!r} fails on the source columns: "
            f"{type(e).__name__}: {_first_line(e)}"
        ) from None


class BatchFailedError(LakesinkError):
    """What Spark sees of a failed batch; the pipeline raises the batch's own exception."""


@dataclass(frozen=True, slots=True)
class BatchSteps:
    """Wall-clock times (`time.time()`) of one batch's steps on the driver, for the progress
    line and the freshness benchmark's breakdown of a record's wait."""

    planned: float | None  # Spark wrote the batch's offset log (None: its time unknown)
    started: float  # the sink got the batch
    begun: float  # every table's instant began
    written: float  # the tasks' files are written
    published: float  # the main table's commit is published (async: handed to the committer)
    finished: float  # the sink is done: the post-commit hooks (inline table services) ran
    publish_s: float = 0.0  # of `commit`, the main table's publish: the lock, its checks, the write

    def durations(self) -> dict[str, float]:
        """Seconds per step: `spark` (offset log → the sink got the batch: Spark's own work
        between planning and running it), `begin`, `write`, `commit` (reconcile, lock,
        publish; `publish`: its lock, checks and write), `after` (the post-commit hooks: the
        inline table services)."""
        spark = {} if self.planned is None else {"spark": max(0.0, self.started - self.planned)}
        return {
            **spark,
            "begin": self.begun - self.started,
            "write": self.written - self.begun,
            "commit": self.published - self.written,
            "publish": self.publish_s,  # a part of `commit`, not a step of its own
            "after": self.finished - self.published,
        }


@dataclass
class BatchStats:
    batches: int = 0
    records: int = 0
    dead_letters: int = 0  # rows committed to the dead-letter table
    last_outcome: BatchOutcome | None = None
    last_batch_s: float = 0.0
    last_steps: BatchSteps | None = None


class CommittingSink:
    """`writeStream.foreachBatch(sink)`: begin instant → tasks write → reconcile → publish."""

    def __init__(
        self,
        cfg: LakesinkConfig,
        coordinator: Coordinator,
        committer: AsyncCommitter | None = None,
        dead_letters: Coordinator | None = None,
        *,
        output_schema: StructType | None = None,
        direct: bool = False,
    ) -> None:
        self.cfg = cfg
        # The direct task path (spark/direct.py): tasks read, decode and write the batch's
        # ranges themselves; the DataFrame Spark hands foreachBatch is not used.
        self.direct = direct
        self.output_schema = output_schema  # the rows' schema as declared (`analyze_rows`)
        self.coordinator = coordinator
        self.committer = committer
        self.dead_letters = dead_letters
        # The tables every batch writes, in commit order: dead letters first (spark/batch.py)
        self.tables = BatchTables(
            [
                *([BatchTable(DEAD_LETTERS, dead_letters)] if dead_letters is not None else []),
                BatchTable(ROWS, coordinator, committer),
            ],
            parallelism=cfg["commit.tables.parallelism"],
        )
        self.transform = load_transform(cfg)
        self.stats = BatchStats()
        self.on_batch: Callable[[BatchOutcome], None] | None = None
        # The exception that failed a batch, kept for the driver to re-raise (see __call__).
        self.failure: BaseException | None = None
        # The batch running now, else the last one that finished: the driver lets it reach
        # Spark's commit log before stopping the query.
        self.current_batch: int | None = None
        self.in_batch = False  # a batch is running now
        self.metrics: IngestionMetrics | None = coordinator.metrics
        self.plugin = plugin_of(cfg.settings)
        # rows and bytes per topic of each table the batch committed, for the metrics
        self._rows_by_table: dict[str, dict[str, tuple[int, int]]] = {}
        self._rows_arrow: Any = None  # the rows' declared Arrow schema (`rows_arrow_schema`)
        # Spans cut off this batch at a restart, the broker's log end having moved back below
        # them (spark/replay_check.py): recorded in the main table's commit
        self.lost: tuple[OffsetRange, ...] = ()
        self._started_at = 0.0  # time.time() when the batch running now reached the sink
        self._steps: BatchSteps | None = None  # the last published batch's steps

    @property
    def partition_fields(self) -> tuple[str, ...]:
        """The columns the rows must have for the table's partitioning."""
        declared = self.plugin.table_partition_fields(self.coordinator)
        if declared is not None:
            return declared
        date = (DATE_PARTITION_COLUMN,) if self.cfg["table.partition.date.from"] else ()
        return (*self.cfg["table.partition.by"], *date)

    def prepare(self, df: DataFrame) -> DataFrame:
        return prepare_rows(df, self.cfg, self.transform, self.partition_fields)

    def arrow_transform(self, spark: SparkSession) -> ArrowTransform | None:
        """`transform.arrow` as planned on the driver, for the direct path's tasks."""
        if isinstance(self.transform, ArrowTransformStep):
            return self.transform.plan(spark)
        return None

    def required_columns(self, spark: SparkSession) -> tuple[str, ...]:
        """Top-level columns the rows keep non-nullable, as declared (analyzed once)."""
        if self.output_schema is None:
            self.output_schema = analyze_rows(self.cfg, spark, self.partition_fields)
        return tuple(f.name for f in self.output_schema.fields if not f.nullable)

    def rows_arrow_schema(self, df: DataFrame) -> Any:
        """The rows' Arrow schema (`rows_arrow`), derived once when the rows' schema is
        declared (`output_schema`), else from each batch's DataFrame."""
        if self._rows_arrow is not None:
            return self._rows_arrow
        arrow = rows_arrow(df, self.output_schema or df.schema)
        if self.output_schema is not None:
            self._rows_arrow = arrow
        return arrow

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        """Runs the batch; a failure is kept in `self.failure` and Spark gets a short stand-in.

        Spark's stream thread matches a Py4J error's text against a regex that recurses once
        per character; a Python traceback quoting a Java one (any failed Spark job inside the
        batch) overflows the thread's stack, the thread dies without recording why and the
        query looks merely stopped. The stand-in carries no such text, and the driver re-raises
        the real exception from `self.failure`."""
        self.current_batch = batch_id
        self.in_batch = True
        try:
            self._run_batch(batch_df, batch_id)
        except BaseException as e:
            self.failure = e
            raise BatchFailedError(
                f"batch {batch_id} failed with {type(e).__name__}; the driver re-raises it"
            ) from None
        finally:
            self.in_batch = False

    def _run_batch(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        self._started_at = time.time()
        self._steps = None
        self._rows_by_table = {}
        ranges = planned_ranges(self.cfg.checkpoint_location, batch_id)
        self.lost = lost_spans(self.cfg.checkpoint_location, batch_id)
        if self.committer is not None:
            # a batch of keys plans its buckets over published snapshots only
            self.committer.wait_before_batch(by_key=self._writes_by_key())
        outcome = self._commit_batch(batch_df, batch_id, ranges)
        if outcome is None:
            if self.metrics is not None:
                self.metrics.record_batch("skipped")
            return
        self.stats.batches += 1
        self.stats.records += outcome.records
        self.stats.last_outcome = outcome
        self.stats.last_batch_s = time.perf_counter() - started
        self.stats.last_steps = self._steps
        if self.metrics is not None:
            self.metrics.record_batch("published", self.stats.last_batch_s)
            for role, per_topic in self._rows_by_table.items():
                table_metrics = self.tables[role].coordinator.metrics or self.metrics
                for topic, (rows, nbytes) in per_topic.items():
                    table_metrics.record_rows(topic, rows, nbytes)
        if self.on_batch:
            self.on_batch(outcome)

    def _commit_batch(
        self, batch_df: DataFrame, batch_id: int, ranges: list[OffsetRange]
    ) -> BatchOutcome | None:
        """The batch over its tables (spark/batch.py): begin, write, commit in order; the main
        table's outcome, or None when it had nothing to publish (a replayed batch)."""
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                return self._commit_batch_once(batch_df, batch_id, ranges)
            except CommitConflictError as e:
                # an upsert batch rewrote a bucket another writer rewrote since it began: its
                # instant is rolled back; written again over that writer's files, it wins. The
                # pause, random and growing, lets a writer that keeps losing to a busy one
                # begin after the other's commit and publish before its next one.
                if not self._writes_by_key() or attempt == CONFLICT_ATTEMPTS:
                    raise
                pause = min(CONFLICT_PAUSE_MAX_S, 0.25 * 2**attempt) * random.uniform(0.2, 1.0)
                log.warning(
                    "batch %s: %s; writing it again in %.1fs (attempt %d of %d)",
                    batch_id,
                    e,
                    pause,
                    attempt + 1,
                    CONFLICT_ATTEMPTS,
                )
                time.sleep(pause)
        raise InternalError("unreachable: the last attempt returns or raises")

    def _writes_by_key(self) -> bool:
        """Whether the batch writes a table by key: only those rewrite buckets that another
        writer may have rewritten since the batch began (a CommitConflictError worth a retry)."""
        return self.coordinator.operation_type == "UPSERT"

    def _commit_batch_once(
        self, batch_df: DataFrame, batch_id: int, ranges: list[OffsetRange]
    ) -> BatchOutcome | None:
        instants = self.tables.begin(batch_id, ranges)
        if not any(instants.values()):
            return None
        begun_at = time.time()
        try:
            statuses = self._write_tables(batch_df, ranges, instants)
        except BaseException:
            self.tables.abort(batch_id, instants)
            raise
        written_at = time.time()
        self._rows_by_table = {
            role: rows_per_topic(written, ranges)
            for role, written in self._row_statuses(statuses).items()
        }
        outcomes = self.tables.commit(
            batch_id,
            ranges,
            instants,
            statuses,
            lambda role, written: self._schema_for(role, written, batch_df),
            lost=self.lost,
        )
        if DEAD_LETTERS in outcomes:
            self._count_dead_letters(statuses[DEAD_LETTERS], ranges)
        outcome = self._batch_outcome(batch_id, outcomes)
        finished = time.time()
        published = outcome.published_at if outcome is not None else 0.0
        self._steps = BatchSteps(
            planned=offset_log_time(self.cfg.checkpoint_location, batch_id),
            started=self._started_at,
            begun=begun_at,
            written=written_at,
            published=published if written_at <= published <= finished else finished,
            finished=finished,
            publish_s=outcome.publish_s if outcome is not None else 0.0,
        )
        return outcome

    # The steps a many-table sink (lakesink.spark.routing) does its own way.

    def _write_tables(
        self, batch_df: DataFrame, ranges: list[OffsetRange], instants: Instants
    ) -> dict[str, list[WriteStatus]]:
        """Every begun table's files written: their tasks' statuses by role."""
        write = self._write_direct if self.direct else self._write_frame
        return write(batch_df, ranges, instants)

    def _row_statuses(
        self, statuses: Mapping[str, list[WriteStatus]]
    ) -> dict[str, list[WriteStatus]]:
        """The statuses of the tables of rows (not dead letters) by role, for the per-table
        and per-topic counts."""
        return {ROWS: statuses[ROWS]} if ROWS in statuses else {}

    def _batch_outcome(
        self, batch_id: int, outcomes: Mapping[str, BatchOutcome]
    ) -> BatchOutcome | None:
        """What the batch did, for the driver: the main table's outcome (None: nothing new)."""
        return outcomes.get(ROWS)

    def _write_direct(
        self, batch_df: DataFrame, ranges: list[OffsetRange], instants: Instants
    ) -> dict[str, list[WriteStatus]]:
        """The direct task path (spark/direct.py): tasks read, decode and write the ranges."""
        spark = batch_df.sparkSession
        required = self.required_columns(spark)
        return write_direct_batch(
            spark,
            self.cfg,
            self.tables,
            instants,
            ranges,
            output_schema=self.output_schema,
            required=required,
            transform=self.arrow_transform(spark),
        )

    def _write_frame(
        self, batch_df: DataFrame, ranges: list[OffsetRange], instants: Instants
    ) -> dict[str, list[WriteStatus]]:
        """The DataFrame path: the rows Spark hands the batch, transformed, written by a
        `mapInArrow` writer per table. With a dead-letter table Kafka is read once for both
        (the rows cached), the failed records split off the good ones."""
        required = self.required_columns(batch_df.sparkSession)
        statuses: dict[str, list[WriteStatus]] = {}
        rows_instant = instants.get(ROWS)
        if DEAD_LETTERS not in self.tables:
            if rows_instant is not None:
                statuses[ROWS] = self._write(
                    self.coordinator, self.prepare(batch_df), rows_instant, required
                )
            return statuses
        cached = batch_df.persist()
        try:
            dead_instant = instants.get(DEAD_LETTERS)
            if dead_instant is not None:
                statuses[DEAD_LETTERS] = self._write(
                    self.tables[DEAD_LETTERS].coordinator, dead_letters_of(cached), dead_instant
                )
            if rows_instant is not None:
                good = cached.where(F.col(ERROR_COLUMN).isNull()).drop(
                    ERROR_COLUMN, RAW_VALUE_COLUMN
                )
                statuses[ROWS] = self._write(
                    self.coordinator, self.prepare(good), rows_instant, required
                )
        finally:
            cached.unpersist()
        return statuses

    def _schema_for(self, role: str, statuses: Sequence[WriteStatus], df: DataFrame) -> TableSchema:
        """The schema a table's commit records: of the dead letters, or of the rows
        (`commit_schema_of`)."""
        from lakesink.kafka.dead_letters import DEAD_LETTER_SCHEMA

        if role == DEAD_LETTERS:
            name = self.tables[DEAD_LETTERS].coordinator.name
            return self.plugin.commit_schema(DEAD_LETTER_SCHEMA, name)
        return commit_schema_of(
            self.plugin, self.coordinator, statuses, lambda: self.rows_arrow_schema(df)
        )

    def _count_dead_letters(
        self, statuses: Sequence[WriteStatus], ranges: list[OffsetRange]
    ) -> None:
        self.stats.dead_letters += sum(s.records_written for s in statuses)
        if self.metrics is not None:
            dead = self.metrics.of_table(self.tables[DEAD_LETTERS].coordinator.name)
            for topic, (rows, _nbytes) in rows_per_topic(list(statuses), ranges).items():
                dead.record_dead_letters(topic, rows)

    def _write(
        self,
        coordinator: Coordinator,
        df: DataFrame,
        instant: Any,
        required: tuple[str, ...] = (),
        *,
        plugin: FormatPlugin | None = None,
        size: int | None = None,
    ) -> list[WriteStatus]:
        """The tasks' write statuses of `df` written into `coordinator`'s table at `instant`
        (`plugin`, `size`: of another table than the main one, lakesink.spark.routing)."""
        if size is None:
            size = self.cfg["table.target.file.size.bytes"]
        target = (plugin or self.plugin).task_target(coordinator, instant.value, size)
        if isinstance(target, KeyedTaskTarget):
            df = grouped_for(df, target)
        writer = TaskWriter(target, required)
        return parse_statuses(df.mapInArrow(writer, STATUS_SCHEMA).collect())


GROUP_COLUMN = "_lakesink_group"
CONFLICT_ATTEMPTS = 12
"""How often an upsert batch that lost a file group to a concurrent writer is written at most
(paused between attempts up to CONFLICT_PAUSE_MAX_S, random): about a minute of losing."""
CONFLICT_PAUSE_MAX_S = 8.0


def rows_arrow(df: DataFrame, schema: StructType) -> pa.Schema:
    """The Arrow schema of rows of `schema` as a table keeps them: declared nullability;
    timestamps as Spark hands them to mapInArrow (the session's zone, UTC in lakesink's
    sessions: a zone is always given, without one pyspark refuses timestamp columns); no
    change-stream columns (the operation and unavailable columns are never table columns)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    zone = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
    arrow = to_arrow_schema(schema, timezone=zone)
    return pa.schema([f for f in arrow if f.name not in CHANGE_COLUMNS])


def commit_schema_of(
    plugin: FormatPlugin,
    coordinator: Coordinator,
    statuses: Sequence[WriteStatus],
    rows: Callable[[], pa.Schema],
) -> TableSchema:
    """The schema the commit of a table of rows records (the plugin's `commit_schema`; `rows`:
    the rows' Arrow schema). An Iceberg table's has no text (the table keeps its own); a Hudi
    table's has the Avro text of the rows as written: its tasks', else the table's latest, else
    the declared rows' (a first batch of gaps only: compacted or aborted records)."""
    if plugin.tasks_write_data_files:  # Iceberg: its tasks write data files (spark/direct.py)
        return plugin.commit_schema(rows(), coordinator.name)
    written = plugin.written_schema([str(s.extra.get("schema") or "") for s in statuses])
    if written:  # the tasks' text, of the declared rows (Hudi has no field ids)
        return TableSchema(str(written), rows())
    latest = coordinator.format.schema()
    if latest:
        return TableSchema.from_text(latest)
    return plugin.commit_schema(rows(), coordinator.name)


def grouped_for(df: DataFrame, target: KeyedTaskTarget) -> DataFrame:
    """`df` shuffled so that every row of one of `target`'s groups (a Hudi bucket) reaches the
    same task: the group of each row computed in the tasks (`target.group_ids`), then hash
    partitioned by it into as many partitions as the cluster has cores."""
    from pyspark.sql.types import IntegerType, StructField

    def with_group(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            yield batch.append_column(GROUP_COLUMN, target.group_ids(batch))

    schema = StructType([*df.schema.fields, StructField(GROUP_COLUMN, IntegerType(), False)])
    tasks = max(1, df.sparkSession.sparkContext.defaultParallelism)
    grouped = df.mapInArrow(with_group, schema).repartition(tasks, GROUP_COLUMN)
    return grouped.drop(GROUP_COLUMN)


def dead_letters_of(rows: DataFrame) -> DataFrame:
    """The records that failed to decode, as rows of the dead-letter table."""
    from lakesink.kafka.dead_letters import DEAD_LETTER_SCHEMA

    return rows.where(F.col(ERROR_COLUMN).isNotNull()).select(
        *[
            F.col(RAW_VALUE_COLUMN).alias(f.name)
            if f.name == "kafka_value"
            else F.col(ERROR_COLUMN).alias(f.name)
            if f.name == "error"
            else F.col(f.name)
            for f in DEAD_LETTER_SCHEMA
        ]
    )
