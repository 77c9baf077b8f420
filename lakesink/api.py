"""lakesink's Python API: exactly-once ingestion from your own PySpark job, notebook or
`spark-submit` application.

- `ingest(spark, config)` runs the whole pipeline and returns an `IngestionHandle`
  (start, await_termination, stop, status, last_progress), continuously or once (`once=True`).
- `read_stream(spark, config)` and `sink(spark, config)` are the two halves of it for a query
  of your own: `read_stream(...).writeStream.foreachBatch(sink)`.
- `read(spark, path)` reads a lakesink table (the same as `spark.read.format("lakesink")`).

The API never prints; it logs on the `lakesink` loggers. Its errors are the `LakesinkError`
classes of `lakesink.errors`, the ones the command line maps to exit codes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakesink.config import LakesinkConfig, build_config, flatten_keys, read_config_file
from lakesink.errors import ConfigError, LakesinkError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from lakesink.engine.async_commit import AsyncCommitter
    from lakesink.metrics import Snapshot
    from lakesink.spark.pipeline import Ingestion, IngestionResult, Progress
    from lakesink.spark.sink import BatchStats, CommittingSink

log = logging.getLogger(__name__)

ConfigSource = LakesinkConfig | Mapping[str, Any] | str | os.PathLike[str]
"""A configuration: a loaded `LakesinkConfig`, a mapping of lakesink keys (dotted, or nested
tables as in a TOML file), or the path of a TOML or YAML file."""


def load_config(config: ConfigSource) -> LakesinkConfig:
    """A validated configuration from any `ConfigSource` (ConfigError names a bad key). Unlike
    the command line, no `LAKESINK_*` environment variable is read."""
    if isinstance(config, LakesinkConfig):
        return config
    if isinstance(config, str | os.PathLike):
        return build_config(read_config_file(os.fspath(config)))
    if isinstance(config, Mapping):
        return build_config(flatten_keys(config))
    raise ConfigError(
        f"config must be a mapping of lakesink keys, a LakesinkConfig or a file path, "
        f"not {type(config).__name__}"
    )


@dataclass(frozen=True, slots=True)
class IngestionStatus:
    """Where an ingestion stands (`IngestionHandle.status()`)."""

    writer_id: str
    table_path: str
    active: bool
    """The ingestion is running (started, not terminated)."""
    batches: int
    """Batches published since start."""
    records: int
    """Rows committed since start."""
    dead_letters: int
    """Rows committed to the dead-letter table since start."""
    committed: dict[str, int]
    """The writer's committed next offset per `topic:partition`."""
    metrics: Snapshot = field(default_factory=dict)
    """The ingestion's metrics (the samples its Prometheus endpoint serves)."""
    metrics_url: str | None = None
    """The endpoint's URL while served (`metrics.port`), else None."""
    error: str | None = None
    """What ended the ingestion, when it failed."""


def register(spark: SparkSession) -> None:
    """Register lakesink's data sources on `spark`: `spark.read.format("lakesink")` (a table,
    option `as.of.instant`) and `spark.readStream.format("lakesink-kafka")` then work without
    any other lakesink call first. Every function of this API does it for you."""
    from lakesink.spark.session import register_sources

    register_sources(spark)


_prepare = register


class IngestionHandle:
    """One ingestion of Kafka topics into a table, run on a thread of the driver; made by
    `ingest()`. Use it as a context manager to stop it (and its metrics endpoint) on exit."""

    def __init__(
        self,
        ingestion: Ingestion,
        *,
        once: bool,
        on_progress: Callable[[Progress], None] | None = None,
        standby: bool = False,
    ) -> None:
        self._ingestion = ingestion
        self._once = once
        self._standby = standby
        self._stop_standby = threading.Event()
        self._user_progress = on_progress
        self._last_progress: Progress | None = None
        self._result: IngestionResult | None = None
        self._error: LakesinkError | None = None
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._batches = 0
        ingestion.on_progress = self._progress

    @property
    def config(self) -> LakesinkConfig:
        return self._ingestion.cfg

    @property
    def writer_id(self) -> str:
        return self._ingestion.cfg.writer_id

    @property
    def table_path(self) -> str:
        return str(self._ingestion.cfg["table.path"])

    @property
    def metrics_url(self) -> str | None:
        """The Prometheus endpoint's URL while it is served (`metrics.port`), else None."""
        return self._ingestion.metrics.url

    @property
    def is_active(self) -> bool:
        return self._thread is not None and not self._done.is_set()

    @property
    def last_progress(self) -> Progress | None:
        """The progress after the latest published batch (None before the first)."""
        return self._last_progress

    @property
    def result(self) -> IngestionResult | None:
        """What the ingestion did, once it ended without an error."""
        return self._result

    def exception(self) -> LakesinkError | None:
        """The error that ended the ingestion, if it failed."""
        return self._error

    def start(self) -> IngestionHandle:
        """Start the ingestion (and its metrics endpoint when `metrics.port` is set) on a
        thread; returns at once. Starting twice is an error."""
        if self._thread is not None:
            raise LakesinkError(f"ingestion of writer {self.writer_id} is already started")
        self._ingestion.serve_metrics()
        self._thread = threading.Thread(
            target=self._run, name=f"lakesink-ingestion-{self.writer_id}", daemon=True
        )
        self._thread.start()
        log.info("writer %s: ingestion into %s started", self.writer_id, self.table_path)
        return self

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait for the ingestion to end: True when it ended, False when `timeout` seconds
        passed first. Raises the ingestion's `LakesinkError` when it failed. A continuous
        ingestion ends only by `stop()`; `once=True` ends when caught up."""
        if self._thread is None:
            raise LakesinkError(f"ingestion of writer {self.writer_id} was never started")
        if not self._done.wait(timeout):
            return False
        if self._error is not None:
            raise self._error
        return True

    def stop(self, timeout: float | None = 120.0) -> None:
        """End the ingestion after the batch in flight, then stop its metrics endpoint. Does
        not raise the ingestion's error (see `exception()`)."""
        self._stop_standby.set()
        self._ingestion.stop()
        if self._thread is not None and not self._done.wait(timeout):
            log.warning("writer %s: ingestion did not end within %ss", self.writer_id, timeout)
        self._ingestion.close()

    def status(self) -> IngestionStatus:
        from lakesink.spark.table_offsets import committed_offsets_of

        stats = self._result
        progress = self._last_progress
        committed = committed_offsets_of(self.config).to_json()  # many tables: the lowest
        return IngestionStatus(
            writer_id=self.writer_id,
            table_path=self.table_path,
            active=self.is_active,
            batches=stats.batches if stats else self._batches,
            records=stats.records if stats else (progress.total_records if progress else 0),
            dead_letters=stats.dead_letters if stats else 0,
            committed=committed,
            metrics=self._ingestion.metrics.snapshot(),
            metrics_url=self.metrics_url,
            error=None if self._error is None else str(self._error),
        )

    def __enter__(self) -> IngestionHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the ingestion thread -----------------------------------------------------------------
    def _progress(self, progress: Progress) -> None:
        self._last_progress = progress
        self._batches += 1
        if self._user_progress is not None:
            try:
                self._user_progress(progress)
            except Exception:  # the user's callback must not fail the batch
                log.exception("writer %s: on_progress callback failed", self.writer_id)

    def _run(self) -> None:
        from lakesink.spark.pipeline import translate_query_error

        try:
            liveness = None
            if self._standby:
                from lakesink.spark.standby import Standby

                standby = Standby(self.config, self._ingestion.spark)
                standby.warm()
                takeover = standby.wait(self._stop_standby)
                if takeover is None:
                    log.info("writer %s: standby stopped before taking over", self.writer_id)
                    return
                log.warning(
                    "writer %s: standby taking over on %s: %s",
                    self.writer_id,
                    self.table_path,
                    takeover.reason,
                )
                liveness = takeover.liveness
            self._result = self._ingestion.run(once=self._once, liveness=liveness)
            log.info(
                "writer %s: ingestion ended: %d records in %d batches",
                self.writer_id,
                self._result.records,
                self._result.batches,
            )
        except Exception as e:
            self._error = translate_query_error(e)
            if self._error is not e:
                self._error.__cause__ = e
            log.error("writer %s: ingestion failed: %s", self.writer_id, self._error)
        finally:
            self._done.set()


def ingest(
    spark: SparkSession,
    config: ConfigSource,
    *,
    once: bool = False,
    start: bool = True,
    on_progress: Callable[[Progress], None] | None = None,
    standby: bool = False,
) -> IngestionHandle:
    """Ingest the configured Kafka topics into the configured table, exactly once, with
    `spark` (your own session; lakesink's data sources are registered on it).

    Everything that can be checked is checked here, before anything is written: the
    configuration, that the brokers answer and the topics exist, the value schema and the
    transformation; only then is the table created. With `start=True` (the default) the
    ingestion is started on a thread and the handle returned at once, like
    `DataStreamWriter.start()`; `once=True` ends it when it has caught up with the high
    watermarks seen at start. `on_progress` is called after every published batch.

    `standby=True` makes this a warm standby of the writer id (the command line's
    `ingest --standby`): the thread warms Spark's Python workers, then waits until the
    active writer stops or its liveness lapses (`standby.takeover.after.s`), and only then
    claims the writer id, recovers and ingests; `stop()` ends the wait.
    """
    from lakesink.spark.pipeline import Ingestion

    cfg = load_config(config)
    _prepare(spark)
    handle = IngestionHandle(
        Ingestion(cfg, spark), once=once, on_progress=on_progress, standby=standby
    )
    return handle.start() if start else handle


def read_stream(spark: SparkSession, config: ConfigSource) -> DataFrame:
    """The streaming DataFrame of lakesink's Kafka source: Kafka coordinates and the decoded
    value columns (the `kafka.*` and `value.*` keys), to write with `sink()`."""
    from lakesink.spark.pipeline import source_stream

    cfg = load_config(config)
    _prepare(spark)
    return source_stream(spark, cfg)


class LakesinkSink:
    """The committing sink for `df.writeStream.foreachBatch(sink)` over `read_stream()`; made
    by `sink()`. The query must write its checkpoint to `sink.checkpoint_location`: each batch
    commits the offset ranges Spark logged there, exactly once. Call `close()` after the query
    ends (or use the sink as a context manager)."""

    def __init__(self, ingestion: Ingestion, committer: AsyncCommitter | None) -> None:
        self._ingestion = ingestion
        self._committer = committer
        self._inner: CommittingSink = ingestion.make_sink(committer)
        self._inner.on_batch = self._batch_done
        self._error: LakesinkError | None = None
        self._closed = False

    @property
    def checkpoint_location(self) -> str:
        """Where the query's checkpoint must be (`checkpoint.location`)."""
        return str(self._ingestion.cfg.checkpoint_location)

    @property
    def metrics_url(self) -> str | None:
        return self._ingestion.metrics.url

    @property
    def stats(self) -> BatchStats:
        """Batches, records and dead letters committed through this sink."""
        return self._inner.stats

    @property
    def committed(self) -> dict[str, int]:
        """The writer's committed next offset per `topic:partition`."""
        return self._ingestion.coordinator.committed.to_json()

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        offsets = self._ingestion.cfg.checkpoint_location / "offsets" / str(batch_id)
        if not offsets.exists():
            self._fail(
                ConfigError(
                    f"batch {batch_id} is not in {offsets.parent}: the query's "
                    f"checkpointLocation must be sink.checkpoint_location "
                    f"({self.checkpoint_location}), and its source read_stream(spark, config)"
                )
            )
        try:
            self._inner(batch_df, batch_id)
        except LakesinkError:
            self._fail(self._inner.failure)

    def _batch_done(self, _outcome: Any) -> None:
        if self._ingestion.monitor is not None:
            self._ingestion.monitor.committed_changed()

    def _fail(self, error: BaseException | None) -> None:
        from lakesink.spark.pipeline import translate_query_error
        from lakesink.spark.sink import BatchFailedError

        self._error = translate_query_error(error)
        self._ingestion.metrics.record_error(self._error)
        raise BatchFailedError(
            f"lakesink sink failed with {type(self._error).__name__}; "
            "sink.await_termination(query) raises it"
        ) from None

    def exception(self) -> LakesinkError | None:
        """The error that failed a batch, if one did."""
        return self._error

    def check(self) -> None:
        """Raise the error that failed a batch, if one did."""
        if self._error is not None:
            raise self._error

    def await_termination(self, query: StreamingQuery, timeout: float | None = None) -> bool:
        """`query.awaitTermination(timeout)`, raising the sink's own `LakesinkError` rather than
        the stand-in Spark reports when a batch failed."""
        try:
            # awaitTermination takes float seconds (typed int)
            ended = query.awaitTermination(timeout)  # type: ignore[arg-type]
        except Exception as e:
            self.check()
            from lakesink.spark.pipeline import translate_query_error

            raise translate_query_error(e) from e
        if timeout is None:
            return True
        self.check()
        return bool(ended)

    def await_caught_up(self, query: StreamingQuery, timeout: float | None = None) -> bool:
        """Wait until the writer has committed everything up to the high watermarks of now
        (True), the timeout passed (False) or the query ended (its error raised)."""
        from lakesink.spark.pipeline import offsets_to_read

        cfg = self._ingestion.cfg
        coordinator = self._ingestion.coordinator
        target = offsets_to_read(cfg, coordinator.committed, self._ingestion.partitions)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            committed = coordinator.committed
            if all((committed.get(tp) or 0) >= hi for tp, hi in target.items()):
                return True
            if not query.isActive:
                self.await_termination(query, 0)
                raise LakesinkError("the streaming query stopped before the writer caught up")
            self.check()
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.2)

    def close(self) -> None:
        """Publish what an async committer still holds, then release the committer, the
        pending-commit store and the metrics endpoint."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._committer is not None and self._error is None:
                self._committer.drain()
        finally:
            if self._committer is not None:
                self._committer.close()
                self._committer.store.close()
            self._ingestion.close()

    def __enter__(self) -> LakesinkSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sink(spark: SparkSession, config: ConfigSource) -> LakesinkSink:
    """A committing sink for your own query over `read_stream(spark, config)`:

        sink = lakesink.sink(spark, config)
        query = (lakesink.read_stream(spark, config).writeStream.foreachBatch(sink)
                 .option("checkpointLocation", sink.checkpoint_location).start())

    The same checks as `ingest()` run first; the writer id is claimed and unfinished instants
    of an earlier run are recovered before this returns. Stateless per-row transformations
    of the stream (select, withColumn, filter) may come between; the sink applies
    `transform.sql` / `transform.python` itself, and each batch commits all of its offset
    ranges, whatever rows reach it."""
    from lakesink.spark.pipeline import Ingestion, make_committer

    cfg = load_config(config)
    _prepare(spark)
    ingestion = Ingestion(cfg, spark)
    committer = make_committer(cfg, ingestion.coordinator)
    try:
        ingestion.start_commits(committer)
        ingestion.serve_metrics()
        return LakesinkSink(ingestion, committer)
    except BaseException:
        if committer is not None:
            committer.close()
            committer.store.close()
        ingestion.close()
        raise


def read(
    spark: SparkSession, path: str | os.PathLike[str], *, as_of_instant: str | None = None
) -> DataFrame:
    """The rows of the lakesink table at `path` as a DataFrame: its latest snapshot, or the
    snapshot as of an instant time. The same as `spark.read.format("lakesink").load(path)`;
    only files of completed instants are read."""

    _prepare(spark)
    reader = spark.read.format("lakesink")
    if as_of_instant is not None:
        reader = reader.option("as.of.instant", as_of_instant)
    df: DataFrame = reader.load(os.fspath(path))
    return df
