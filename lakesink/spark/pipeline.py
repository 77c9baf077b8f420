"""One ingestion: a streaming query from the lakesink-kafka source into a table (Hudi or Iceberg)
and, with `errors.deadletter.table`, its dead-letter table."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import StructType

from lakesink.config import LakesinkConfig
from lakesink.config.tables import TableSpec
from lakesink.engine.async_commit import AsyncCommitter, ranges_of
from lakesink.engine.coordinator import BatchOutcome, Coordinator
from lakesink.engine.format import CommitControl
from lakesink.engine.liveness import WriterLiveness
from lakesink.errors import FencedError, LakesinkError, SchemaEvolutionError
from lakesink.formats import plugin_of
from lakesink.formats.status import pending_store_for
from lakesink.kafka.client import TopicIds
from lakesink.metrics import IngestionMetrics
from lakesink.protocol.offsets import TopicPartition, WriterOffsets
from lakesink.spark.direct import spark_arrow_schema, uses_direct_path
from lakesink.spark.liveness_file import writer_liveness
from lakesink.spark.monitoring import LagMonitor
from lakesink.spark.registry_columns import (
    note_writer_schema,
    pin_registry_columns,
    uses_registry_columns,
)
from lakesink.spark.replay_check import rewind_to
from lakesink.spark.routing import RoutedTable, RoutingSink, check_routes_cover
from lakesink.spark.session import check_workers_import_lakesink
from lakesink.spark.sink import BatchSteps, CommittingSink, analyze_rows, load_transform
from lakesink.spark.source import (
    CONFIG_OPTION,
    SECRETS_OPTION,
    SOURCE_NAME,
    encode_config,
    encode_secrets,
)
from lakesink.spark.table_offsets import (
    all_table_configs,
    committed_offsets_of,
    lowest_committed,
)
from lakesink.spark.task_writer import DATE_PARTITION_COLUMN
from lakesink.spark.worker_warmup import WorkerWarmup

log = logging.getLogger(__name__)

FINISH_BATCH_TIMEOUT_S = 60.0
SPARK_POLLING_DELAY = "spark.sql.streaming.pollingDelay"  # Spark's wait after an empty trigger
# The end of an ingestion waits this long for the table services running beside its batches
# (table.services.run=beside); one still running then is abandoned as a crash would leave it
SERVICES_AT_END_S = 120.0
RECHECK_IDLE_S = 5.0  # `--once`: how often an idle wait asks the broker what is left to read


@dataclass(frozen=True, slots=True)
class Progress:
    """One line of progress after a batch."""

    outcome: BatchOutcome
    total_records: int
    elapsed_s: float
    lag: int | None  # records behind the high watermarks, when known
    steps: BatchSteps | None = None  # when the batch's steps ended

    @property
    def records_per_s(self) -> float:
        return self.total_records / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass
class IngestionResult:
    batches: int = 0
    records: int = 0
    dead_letters: int = 0  # rows committed to the dead-letter table (errors.deadletter.table)
    elapsed_s: float = 0.0
    first_commit_s: float | None = None
    committed: dict[str, int] = field(default_factory=dict)
    # `run(once=True)` found no record to read (nothing after the committed offsets or the
    # starting offsets; empty, expired or only aborted records) and started no query.
    nothing_new: bool = False
    # Batches ran but held no records and no dead letters (aborted transactions, markers).
    only_empty_ranges: bool = False


def partition_columns(cfg: LakesinkConfig) -> tuple[str, ...]:
    """The columns the writer partitions its rows by: table.partition.by, then the date column
    of table.partition.date.from."""
    date = (DATE_PARTITION_COLUMN,) if cfg["table.partition.date.from"] else ()
    return (*cfg["table.partition.by"], *date)


def check_kafka(cfg: LakesinkConfig) -> list[TopicPartition]:
    """The partitions to ingest, checking before anything is written that the brokers answer
    and the listed topics exist (KafkaError naming them otherwise), and that the value schema
    is valid (ConfigError)."""
    from lakesink.kafka.client import list_partitions
    from lakesink.spark.source import declared_arrow_schema

    from_registry = uses_registry_columns(cfg)  # the columns follow the topics' subjects
    if not from_registry:
        declared_arrow_schema(cfg)
    partitions = list_partitions(
        cfg["kafka.bootstrap.servers"],
        topics=list(cfg["kafka.topics"]) or None,
        pattern=cfg["kafka.topic.pattern"],
        extra=cfg.kafka_client_config,
    )
    if from_registry:
        declared_arrow_schema(pin_registry_columns(cfg, {tp.topic for tp in partitions}))
    return partitions


def high_watermarks(cfg: LakesinkConfig) -> dict[TopicPartition, int]:
    from lakesink.kafka.client import OffsetClient

    parts = check_kafka(cfg)
    with OffsetClient(
        cfg["kafka.bootstrap.servers"],
        isolation_level=cfg["kafka.isolation.level"],
        extra=cfg.consumer_config,
    ) as client:
        return {tp: hi for tp, (_lo, hi) in client.watermarks(parts).items()}


def offsets_to_read(
    cfg: LakesinkConfig, committed: WriterOffsets, partitions: list[TopicPartition]
) -> dict[TopicPartition, int]:
    """The high watermark (last stable offset under read_committed) of every partition with
    offsets to read now from where the source starts it: the writer's committed offset, else
    kafka.starting.offsets, resolved as the source resolves them. An empty partition, one at
    its high watermark or one whose records all expired has none. Offsets holding only aborted
    transactional records and markers do count: the source reads them as a range without rows
    and commits it."""
    from lakesink.kafka.client import OffsetClient
    from lakesink.kafka.planning import resolve_start

    with OffsetClient(
        cfg["kafka.bootstrap.servers"],
        isolation_level=cfg["kafka.isolation.level"],
        extra=cfg.consumer_config,
    ) as client:
        marks = client.watermarks(partitions)
        starts = resolve_start(
            committed,
            partitions,
            cfg["kafka.starting.offsets"],
            _KnownWatermarks(client, marks),
            fail_on_data_loss=cfg["kafka.fail.on.data.loss"],
        )
    return {tp: marks[tp][1] for tp, start in starts.items() if marks[tp][1] > start}


class _KnownWatermarks:
    """An OffsetLookup answering watermarks from one reading, so that starts and ends agree."""

    def __init__(self, client: Any, marks: dict[TopicPartition, tuple[int, int]]) -> None:
        self.client, self.marks = client, marks

    def watermarks(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, int]]:
        return {tp: self.marks[tp] for tp in partitions}

    def offsets_for_times(
        self, timestamps_ms: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int | None]:
        return dict(self.client.offsets_for_times(timestamps_ms))


class Ingestion:
    """Runs the streaming query; `run(once=True)` stops when the writer has caught up with the
    high watermarks seen at start."""

    def __init__(
        self,
        cfg: LakesinkConfig,
        spark: SparkSession,
        *,
        control: CommitControl | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        partitions: list[TopicPartition] | None = None,
    ) -> None:
        self.spark = spark
        # Everything that can be checked is checked before anything is written: the brokers
        # and topics, the value schema, the transformation against the source columns (Spark
        # analyzes it over an empty DataFrame); only then is the table created. `partitions`:
        # what check_kafka(cfg) returned just before (the caller checked already).
        self.partitions = check_kafka(cfg) if partitions is None else partitions
        self._given = cfg  # before pinning: a new writer schema pins again (_take_new_schema)
        # values framed by a registry: this run's columns, fixed once from its subjects
        cfg = pin_registry_columns(cfg, {tp.topic for tp in self.partitions})
        self.cfg = cfg
        partition_fields = partition_columns(cfg)
        self.output_schema = analyze_rows(cfg, spark, partition_fields)
        check_workers_import_lakesink(spark)  # a cluster's workers: before the table exists
        self.direct = uses_direct_path(cfg)  # the direct task path, or Spark's DataFrame
        self.control = control or make_control(cfg)
        self.on_progress = on_progress
        self._stop = threading.Event()
        # set when run() failed on a writer schema id its columns lack, noted for the next run
        self.new_writer_schema: int | None = None
        self.plugin = plugin_of(cfg.settings)
        # the metrics about a table carry its name: the tables section's names, else the table's
        table_names = [spec.name for spec in cfg.table_specs] or [cfg.table_name]
        self.metrics = IngestionMetrics(
            writer_id=cfg.writer_id,
            table=str(cfg["table.path"]),
            topics=",".join(cfg["kafka.topics"]) or str(cfg["kafka.topic.pattern"]),
            topic_names=cfg["kafka.topics"],
            table_names=table_names,
        )
        topic_ids = TopicIds(cfg["kafka.bootstrap.servers"], cfg.kafka_client_config)
        query_id = str(uuid.uuid4())
        # many tables (tables.<name>.*): each its own, the first one standing for the writer
        # where one coordinator is asked (lag readings)
        self.routed = self._open_routed_tables(query_id, topic_ids) if cfg["tables"] else []
        self.dynamic: list[RoutedTable] = []  # dynamic tables this run created
        self._services_of: list[Coordinator] = []  # whose services the end waits for
        self.monitor: LagMonitor | None = None  # lag readings while metrics are served
        self.liveness: WriterLiveness | None = None  # renewed while run() runs
        if self.routed:
            self.coordinator: Coordinator = self.routed[0].coordinator
            check_routes_cover(self.routed, [tp.topic for tp in self.partitions])
            return
        self.plugin.check_options(cfg.settings)
        table = self.plugin.open_table(
            cfg.settings,
            partition_fields=partition_fields,
            rows=lambda: spark_arrow_schema(spark, self.output_schema),
        )
        if not cfg.table_storage.is_local:
            log.info(
                "table %s is on an object store; Spark's checkpoint stays local at %s (the "
                "table holds the committed offsets, a lost checkpoint loses nothing)",
                cfg["table.path"],
                cfg.checkpoint_location,
            )
        self.coordinator = self.plugin.open_coordinator(
            cfg.settings,
            table,
            self.control,
            query_id=query_id,
            publish_delay_s=cfg["commit.publish.delay.s"],
            topic_ids=topic_ids,
            metrics=self.metrics.of_table(cfg.table_name),
        )

    def _arrow_rows(self, schema: StructType) -> Callable[[], pa.Schema]:
        return lambda: spark_arrow_schema(self.spark, schema)

    def _open_routed_tables(self, query_id: str, topic_ids: TopicIds) -> list[RoutedTable]:
        """Each table of `tables.<name>.*` and each dynamic table created so far, checked and
        opened (created if missing) with its own coordinator and concurrency control."""
        self._query_id, self._topic_ids = query_id, topic_ids
        return [self._open_routed(spec, cfg) for spec, cfg in all_table_configs(self.cfg)]

    def open_dynamic_table(self, name: str) -> RoutedTable:
        """Dynamic table `name` (`route.dynamic.*`), created on its first record."""
        routed = self._open_routed(*self.cfg.dynamic_table_config(name))
        routed.coordinator.start()
        self.dynamic.append(routed)  # for the lag readings
        log.info("created dynamic table %s at %s", name, routed.cfg["table.path"])
        return routed

    def _open_routed(self, spec: TableSpec, cfg: LakesinkConfig) -> RoutedTable:
        fields = partition_columns(cfg)
        schema = analyze_rows(cfg, self.spark, fields)
        plugin = plugin_of(cfg.settings)
        plugin.check_options(cfg.settings)
        table = plugin.open_table(
            cfg.settings, partition_fields=fields, rows=self._arrow_rows(schema)
        )
        coordinator = plugin.open_coordinator(
            cfg.settings,
            table,
            make_control(cfg),
            query_id=self._query_id,
            publish_delay_s=cfg["commit.publish.delay.s"],
            topic_ids=self._topic_ids,
            metrics=self.metrics.of_table(spec.name),
        )
        return RoutedTable(spec, cfg, plugin, coordinator, schema, fields, load_transform(cfg))

    def serve_metrics(self) -> str | None:
        """Start the Prometheus endpoint and the lag readings when `metrics.port` is set
        (idempotent); the endpoint's URL, or None. `close()` stops them."""
        if self.cfg["metrics.port"] is None:
            return None
        url = self.metrics.serve(self.cfg["metrics.host"], self.cfg["metrics.port"])
        if self.monitor is None:
            self.monitor = LagMonitor(
                self.cfg, self._table_coordinators, self.metrics, self.partitions
            )
            self.monitor.start()
        return url

    def close(self) -> None:
        """Stop the metrics endpoint and the lag readings."""
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None
        self.metrics.close()

    def run(
        self,
        *,
        once: bool = False,
        timeout_s: float | None = None,
        liveness: WriterLiveness | None = None,
    ) -> IngestionResult:
        """`liveness`: the writer's liveness file this process owns already (a standby that
        took over); by default it is taken now. It is renewed while this runs and marked
        stopped at the end, so a standby takes over at once."""
        while True:
            try:
                return self._run_query(once=once, timeout_s=timeout_s, liveness=liveness)
            except SchemaEvolutionError:
                if self.new_writer_schema is None or self._stop.is_set():
                    raise
                self._take_new_schema()
                liveness = None  # the failed run let it go; the next one takes it again

    def _take_new_schema(self) -> None:
        """After a batch failed on a writer schema id the run's columns lack (noted in the
        checkpoint): this ingestion opened again over columns evolved by it, so that the next
        query reads the failed batch again and its commit evolves the table. Spark fixes a
        streaming query's columns when it starts, hence a new query rather than new columns."""
        log.warning(
            "%s: writer schema id %d is new to this run's columns; starting the query again "
            "with the table evolved by it",
            self.cfg.table_name,
            self.new_writer_schema,
        )
        stop = self._stop  # a stop() asked meanwhile still counts
        self.close()
        self.__init__(  # type: ignore[misc]
            self._given,
            self.spark,
            control=self.control,
            on_progress=self.on_progress,
            partitions=self.partitions,
        )
        self._stop = stop

    def _run_query(
        self, *, once: bool, timeout_s: float | None, liveness: WriterLiveness | None
    ) -> IngestionResult:
        started = time.monotonic()
        self.serve_metrics()
        if liveness is not None or self.cfg["standby.liveness.enabled"]:
            self.liveness = (liveness or writer_liveness(self.cfg)).start()
        committer = make_committer(self.cfg, self.coordinator)
        try:
            return self._run(started, committer, once=once, timeout_s=timeout_s)
        except Exception as e:
            self.metrics.record_error(translate_query_error(e))
            # a writer schema this run's columns lack: the next run's columns take it in
            self.new_writer_schema = note_writer_schema(self.cfg, e)
            raise
        finally:
            if committer is not None:
                committer.close()
                committer.store.close()
            self._wait_for_services()
            if self.liveness is not None:
                self.liveness.stop(handover=True)

    def _wait_for_services(self) -> None:
        """The ingestion ends: let the services running beside the batches finish (dynamic
        tables created since `make_sink` included), before a standby may take over."""
        for coordinator in {
            id(c): c for c in (*self._services_of, *self._table_coordinators())
        }.values():
            if not coordinator.wait_for_services(SERVICES_AT_END_S):
                log.warning(
                    "table %s: services still running %.0f s after the ingestion ended; left "
                    "to finish on their own (a process exit abandons them: rolled back later)",
                    coordinator.name,
                    SERVICES_AT_END_S,
                )

    def start_commits(self, committer: AsyncCommitter | None) -> None:
        """Claim the writer id and recover before the first new batch: roll back unfinished
        instants; with an async committer, publish Pending epochs in order first. Temporary
        files that killed writers left in the table's root go too."""
        if self.routed:
            for t in self.routed:
                _remove_stale_temporaries(t.cfg)
                t.coordinator.start()
            return
        _remove_stale_temporaries(self.cfg)
        if committer is None:
            self.coordinator.start()
        else:
            # Recovery before the first new batch: keep and publish Pending epochs in order,
            # roll back dirty instants (written but never pre-committed).
            self.coordinator.start(keep=committer.pending_instants())
            committer.recover()
            committer.start()

    def check_replay(self) -> None:
        """Before Spark runs again the batch a crash left unfinished: its ranges against the
        broker's log ends (spark/replay_check.py). A log end that moved back below them is one
        DataLossError, or with kafka.fail.on.data.loss=false the batch is cut at the log end
        and the lost offsets are counted."""
        from lakesink.kafka.client import OffsetClient
        from lakesink.spark.replay_check import check_replay_against_log_end

        def watermarks(partitions: list[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
            with OffsetClient(
                self.cfg["kafka.bootstrap.servers"],
                isolation_level=self.cfg["kafka.isolation.level"],
                extra=self.cfg.consumer_config,
            ) as client:
                return client.watermarks(partitions)

        lost = check_replay_against_log_end(
            self.cfg.checkpoint_location,
            watermarks,
            fail_on_data_loss=self.cfg["kafka.fail.on.data.loss"],
        )
        for span in lost:
            self.metrics.record_offsets_lost(span.partition.topic, span.end - span.start)

    def make_sink(
        self, committer: AsyncCommitter | None, *, direct: bool = False
    ) -> CommittingSink:
        """The `foreachBatch` function of this ingestion (after `start_commits`); `direct`:
        over lakesink's own source stream, tasks write without the DataFrame (spark/direct.py)."""
        dead_letters = self._dead_letter_coordinator()
        self._services_of = [*self._table_coordinators(), *([dead_letters] if dead_letters else [])]
        if self.routed:
            return RoutingSink(
                self.cfg,
                self.routed,
                dead_letters,
                open_dynamic=self.open_dynamic_table,
                direct=direct,
            )
        return CommittingSink(
            self.cfg,
            self.coordinator,
            committer,
            dead_letters,
            output_schema=self.output_schema,
            direct=direct,
        )

    def source_stream(self) -> DataFrame:
        return source_stream(self.spark, self.cfg)

    def _run(
        self,
        started: float,
        committer: AsyncCommitter | None,
        *,
        once: bool,
        timeout_s: float | None,
    ) -> IngestionResult:
        self.start_commits(committer)
        self.check_replay()
        target = None
        if once:
            target = offsets_to_read(self.cfg, self._committed(), self.partitions)
            if not target:
                return self._result(IngestionResult(nothing_new=True), started)
        sink = self.make_sink(committer, direct=self.direct)
        result = IngestionResult()
        warmup = (
            WorkerWarmup.start(self.spark, self.plugin.task_modules)
            if self.cfg["spark.python.workers.warmup"]
            else None
        )

        def on_batch(outcome: BatchOutcome) -> None:
            elapsed = time.monotonic() - started
            if result.first_commit_s is None:
                result.first_commit_s = elapsed
            if self.monitor is not None:
                self.monitor.committed_changed()
            if self.on_progress:
                self.on_progress(
                    Progress(
                        outcome,
                        sink.stats.records,
                        elapsed,
                        self._lag(target),
                        sink.stats.last_steps,
                    )
                )

        sink.on_batch = on_batch
        interval = "0 seconds" if once else f"{self.cfg['trigger.interval.s']} seconds"
        try:
            with idle_polling_delay(self.spark.conf, self.cfg, once=once):
                query = (
                    self.source_stream()
                    .writeStream.foreachBatch(sink)
                    .option("checkpointLocation", str(self.cfg.checkpoint_location))
                    .trigger(processingTime=interval)
                    .start()
                )
        except BaseException:
            if warmup is not None:
                warmup.stop()
            raise
        caught_up = False
        failure: BaseException | None = None
        recheck_at = time.monotonic() + RECHECK_IDLE_S
        try:
            while query.isActive:
                if query.exception() is not None or sink.failure is not None:
                    break
                if self.liveness is not None and self.liveness.lost.is_set():
                    # A standby took over (this process was paused or cut off for longer
                    # than standby.takeover.after.s); the claim fences its publishes anyway.
                    raise FencedError(
                        f"writer {self.cfg.writer_id}: a standby took over its liveness file "
                        f"{self.liveness.key}; this process stops and publishes nothing more"
                    )
                if self._stop.is_set():  # stop(): a continuous ingestion ends here
                    caught_up = True
                    self._let_batch_finish(query, sink)
                    break
                if once and target is not None and self._caught_up(target):
                    caught_up = True
                    self._let_batch_finish(query, sink)
                    break
                if once and target is not None and time.monotonic() > recheck_at:
                    recheck_at = time.monotonic() + RECHECK_IDLE_S
                    if not sink.in_batch:
                        target = self._still_to_read(target)
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    raise LakesinkError(f"ingestion did not catch up within {timeout_s:.0f}s")
                try:
                    query.awaitTermination(0.2)  # type: ignore[arg-type]  # takes float seconds
                except Exception as e:  # StreamingQueryException: the batch failed
                    raise translate_query_error(sink.failure or e) from None
            # Taken before stop(): stopping interrupts a batch in flight, and what that batch
            # raises then is the stop's doing, not a failure (Spark replays it on the next run).
            failure = sink.failure
            if not caught_up and failure is None:
                failure = query.exception()
            if committer is not None and failure is None:
                committer.drain()
        finally:
            if query.isActive:
                query.stop()
            if warmup is not None:
                warmup.stop()
        if failure is not None:
            raise translate_query_error(failure)
        if not caught_up:
            # Neither stopped by us nor failed: Spark's stream thread died of a JVM error it
            # did not record (its message is only in the Spark log). Never report success.
            raise LakesinkError(
                "the streaming query stopped without an error before ingestion caught up; "
                "the Spark driver log says why (lakesink --debug shows it)"
            )
        result.batches = sink.stats.batches
        result.records = sink.stats.records
        result.dead_letters = sink.stats.dead_letters
        return self._result(result, started)

    def stop(self) -> None:
        """Ends a running ingestion after the batch in flight (from another thread)."""
        self._stop.set()

    def _result(self, result: IngestionResult, started: float) -> IngestionResult:
        result.elapsed_s = time.monotonic() - started
        result.committed = (
            lowest_committed([t.coordinator.table_offsets() for t in self.routed]).to_json()
            if self.routed
            else self.coordinator.format.committed_offsets(self.cfg.writer_id).to_json()
        )
        # Dead letters sent to a topic are not counted here: only a table's are.
        result.only_empty_ranges = (
            result.batches > 0
            and result.records == 0
            and result.dead_letters == 0
            and not self.cfg["errors.deadletter.topic"]
        )
        if result.nothing_new or result.only_empty_ranges:
            log.info(
                "table %s writer %s: nothing new to ingest%s; committed offsets %s",
                self.coordinator.name,
                self.cfg.writer_id,
                "" if result.nothing_new else " (only offsets without records)",
                result.committed,
            )
        return result

    def _dead_letter_coordinator(self) -> Coordinator | None:
        """errors.deadletter.table: a second table, committed by its own coordinator with the
        same offset ranges as the main table (so each is exactly once on its own)."""
        if not self.cfg["errors.deadletter.table"]:
            return None
        from pyspark.sql.pandas.types import from_arrow_schema

        from lakesink.spark.direct import dead_letter_rows

        coordinator = self.plugin.open_dead_letter_coordinator(
            self.cfg.settings,
            rows=lambda: spark_arrow_schema(
                self.spark, from_arrow_schema(dead_letter_rows(self.cfg))
            ),
            query_id=self.coordinator.query_id,
        )
        coordinator.start()
        self.metrics.start_dead_letters(coordinator.name, self.cfg["kafka.topics"])
        return coordinator

    def _table_coordinators(self) -> list[Coordinator]:
        """The coordinators of the tables of rows: the table, or each routed table (dynamic
        ones included), whose committed offsets the lag readings show per table."""
        if not self.routed:
            return [self.coordinator]
        return [t.coordinator for t in (*self.routed, *self.dynamic)]

    def _let_batch_finish(self, query: StreamingQuery, sink: CommittingSink) -> None:
        """Waits (bounded) until the batch that caught up is in Spark's commit log, so the next
        run starts after it rather than replaying it (a replay would publish nothing, but
        stopping mid-batch interrupts the batch's tail work)."""
        batch = sink.current_batch
        if batch is None:
            return
        done = self.cfg.checkpoint_location / "commits" / str(batch)
        deadline = time.monotonic() + FINISH_BATCH_TIMEOUT_S
        while not done.exists() and query.isActive and sink.failure is None:
            if time.monotonic() > deadline:
                log.warning(
                    "batch %s not in Spark's commit log after %ss; stopping",
                    batch,
                    FINISH_BATCH_TIMEOUT_S,
                )
                return
            time.sleep(0.05)

    def _still_to_read(self, target: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """`target` less the partitions with nothing left to read up to their target now: the
        records between their start and the target expired (retention) after the start-up
        check, so the source plans no batch that could reach the target."""
        pending = offsets_to_read(
            self.cfg, self._committed(), sorted(target, key=lambda tp: tp.key())
        )
        gone = [tp for tp in target if tp not in pending]
        if gone:
            log.info(
                "writer %s: nothing left to read of %s (records expired); not waiting for them",
                self.cfg.writer_id,
                ", ".join(tp.key() for tp in gone),
            )
        return {tp: hi for tp, hi in target.items() if tp in pending}

    def _committed(self) -> WriterOffsets:
        """Where the writer stands: its table's committed offsets, with many tables the
        lowest over them."""
        if self.routed:
            return lowest_committed([t.coordinator.committed for t in self.routed])
        return self.coordinator.committed

    def _caught_up(self, target: dict[TopicPartition, int]) -> bool:
        committed = self._committed()
        return all((committed.get(tp) or 0) >= hi for tp, hi in target.items())

    def _lag(self, target: dict[TopicPartition, int] | None) -> int | None:
        if target is None:
            return None
        committed = self._committed()
        return sum(max(0, hi - (committed.get(tp) or 0)) for tp, hi in target.items())


@contextlib.contextmanager
def idle_polling_delay(conf: Any, cfg: LakesinkConfig, *, once: bool) -> Iterator[None]:
    """With trigger.interval.s=0, Spark asks the source for new offsets again after its
    polling delay (10 ms by default) whenever a trigger finds nothing: every ask is a Kafka
    round trip in the driver's Python source, so a caught-up ingestion would keep a core busy.
    The query takes trigger.idle.poll.ms when it starts (`conf`: the session's RuntimeConfig);
    the session's own value comes back after, so other queries of a shared session keep it."""
    if once or cfg["trigger.interval.s"] > 0:
        yield
        return
    before = conf.get(SPARK_POLLING_DELAY, None)
    conf.set(SPARK_POLLING_DELAY, f"{cfg['trigger.idle.poll.ms']}ms")
    try:
        yield
    finally:
        if before is None:
            conf.unset(SPARK_POLLING_DELAY)
        else:
            conf.set(SPARK_POLLING_DELAY, before)


_LAKESINK_ERROR_RE = re.compile(r"lakesink\.errors\.(\w+): (.+)")


def translate_query_error(error: BaseException | object) -> LakesinkError:
    """A failed streaming query as the lakesink error its worker or driver raised, so the CLI
    prints one clear line and exit code: the batch's own exception (kept by the sink) as it
    was raised, else the error named in the Python traceback Spark forwards."""
    import lakesink.errors as errors

    if isinstance(error, LakesinkError):
        return error
    text = str(error)
    found = _LAKESINK_ERROR_RE.findall(text)
    if found:
        name, message = found[-1]
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, LakesinkError):
            return cls(message.strip())
    first = next((ln for ln in text.splitlines() if ln.strip()), text)
    return LakesinkError(f"the streaming query failed: {first}")


def source_stream(spark: SparkSession, cfg: LakesinkConfig) -> DataFrame:
    """The streaming DataFrame of the lakesink-kafka source for this configuration."""
    return (
        spark.readStream.format(SOURCE_NAME)
        .option(CONFIG_OPTION, encode_config(cfg))
        .option(SECRETS_OPTION, encode_secrets(cfg))
        .load()
    )


def _remove_stale_temporaries(cfg: LakesinkConfig) -> None:
    removed = cfg.table_storage.remove_stale_temporaries()
    if removed:
        log.info("%s: deleted %d temporary files of killed writers", cfg.table_name, removed)


def make_committer(cfg: LakesinkConfig, coordinator: Coordinator) -> AsyncCommitter | None:
    if cfg["commit.mode"] != "async":
        return None
    checkpoint = cfg.checkpoint_location
    return AsyncCommitter(
        coordinator,
        pending_store_for(cfg.settings.commit),
        max_pending=cfg["commit.max.pending"],
        # a Pending batch of keys refused for good is dropped and read again from Kafka
        rewind=lambda prepared: rewind_to(checkpoint, prepared.batch_id, ranges_of(prepared)),
    )


def make_control(cfg: LakesinkConfig) -> CommitControl:
    """The writer's concurrency control as configured (Hudi: lock, heartbeats and fencing)."""
    return plugin_of(cfg.settings).writer_control(cfg.settings)


def committed_offsets(cfg: LakesinkConfig) -> dict[str, int]:
    return committed_offsets_of(cfg).to_json()
