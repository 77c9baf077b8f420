"""Prometheus metrics of one ingestion: what it ingested, how far behind it is, how long its
batches, commits and lock waits take, and what went wrong.

Every metric lakesink defines is listed once in `METRICS` (name, kind, labels, help); the
Prometheus endpoint, `lakesink status --json`, the docs (docs/metrics.md) and the dashboard test
all read that list. Each ingestion records into its own `IngestionMetrics` (its own registry, so
two ingestions in one process never mix their counts); `serve()` exposes it over HTTP when
`metrics.port` is set. This module imports no Spark and no Kafka client, so any layer can record.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import start_http_server
from prometheus_client.metrics_core import Metric

log = logging.getLogger(__name__)

Kind = Literal["counter", "gauge", "histogram", "info"]

UNKNOWN_TOPIC = "unknown"
"""The topic label of rows whose topic is not known (a transformation dropped `kafka_topic`
and the batch read more than one topic)."""


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric: its name as Prometheus shows it (without `_total`/`_bucket` suffixes), its
    kind, its labels and one line of help."""

    name: str
    kind: Kind
    labels: tuple[str, ...]
    help: str
    buckets: tuple[float, ...] = ()

    @property
    def series_names(self) -> tuple[str, ...]:
        """The sample names a PromQL expression can use for this metric."""
        if self.kind == "counter":
            return (f"{self.name}_total",)
        if self.kind == "histogram":
            return tuple(f"{self.name}_{s}" for s in ("bucket", "sum", "count"))
        if self.kind == "info":
            return (f"{self.name}_info",)
        return (self.name,)


_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_WAIT = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "lakesink_ingestion",
        "info",
        ("writer", "table", "topics"),
        "The writer id, table path and topics of this ingestion (value 1).",
    ),
    MetricSpec(
        "lakesink_records_ingested",
        "counter",
        ("table", "topic"),
        "Rows committed, per table and Kafka topic.",
    ),
    MetricSpec(
        "lakesink_bytes_ingested",
        "counter",
        ("table", "topic"),
        "Bytes of the rows committed (Arrow in-memory size as written), per table and topic.",
    ),
    MetricSpec(
        "lakesink_batches",
        "counter",
        ("outcome",),
        "Micro-batches by outcome: published, or skipped (empty, or already committed: a replay).",
    ),
    MetricSpec(
        "lakesink_dead_letters",
        "counter",
        ("table", "topic"),
        "Records that failed to decode (or that no table's route takes), committed to the "
        "dead-letter table (errors.deadletter.table, the table label), per source topic.",
    ),
    MetricSpec(
        "lakesink_offsets_lost",
        "counter",
        ("topic",),
        "Offsets a planned batch was cut short of at a restart because the broker's log end had "
        "moved back below them (records the broker lost; kafka.fail.on.data.loss=false), "
        "per topic.",
    ),
    MetricSpec(
        "lakesink_partition_committed_offset",
        "gauge",
        ("table", "topic", "partition"),
        "The writer's committed next offset per table and Kafka partition.",
    ),
    MetricSpec(
        "lakesink_partition_high_watermark",
        "gauge",
        ("table", "topic", "partition"),
        "The partition's high watermark (last stable offset under read_committed).",
    ),
    MetricSpec(
        "lakesink_partition_lag",
        "gauge",
        ("table", "topic", "partition"),
        "Offsets between the table's committed offset and the high watermark, per partition.",
    ),
    MetricSpec(
        "lakesink_batch_duration_seconds",
        "histogram",
        (),
        "Seconds one micro-batch takes in the sink: begin, write, reconcile, commit.",
        _LATENCY,
    ),
    MetricSpec(
        "lakesink_commit_duration_seconds",
        "histogram",
        ("table",),
        "Seconds one table commit takes: lock, checks, publish of the completed instant.",
        _LATENCY,
    ),
    MetricSpec(
        "lakesink_lock_wait_seconds",
        "histogram",
        ("table",),
        "Seconds spent waiting for the table's lock.",
        _WAIT,
    ),
    MetricSpec(
        "lakesink_pending_epochs",
        "gauge",
        ("table",),
        "Pre-committed epochs not yet published (commit.mode=async; 0 otherwise).",
    ),
    MetricSpec(
        "lakesink_rollbacks",
        "counter",
        ("table", "reason"),
        "Instants rolled back: batch_failed (this writer's batch failed) or recovery "
        "(unfinished instants found at start).",
    ),
    MetricSpec(
        "lakesink_errors",
        "counter",
        ("error",),
        "Errors that failed a batch or the ingestion, by LakesinkError class.",
    ),
    MetricSpec(
        "lakesink_table_service_runs",
        "counter",
        ("table", "outcome"),
        "Table service runs beside the batches (table.services.run=beside), by outcome: ok, "
        "or failed (a service gave up or raised; the batches went on).",
    ),
    MetricSpec(
        "lakesink_last_commit_timestamp_seconds",
        "gauge",
        ("table",),
        "Unix time of the table's last published commit.",
    ),
)

METRICS_BY_NAME: Mapping[str, MetricSpec] = {m.name: m for m in METRICS}


def series_names() -> frozenset[str]:
    """Every sample name lakesink exposes (what PromQL may reference)."""
    return frozenset(n for m in METRICS for n in m.series_names)


Sample = dict[str, Any]
Snapshot = dict[str, list[Sample]]
"""Sample name → its samples (`{"labels": {...}, "value": 1.0}`), as in `status --json`."""


def snapshot_of(families: Iterable[Metric]) -> Snapshot:
    """The samples of lakesink's metric families, keyed by sample name (`_created` left out)."""
    out: Snapshot = {}
    known = series_names()
    for family in families:
        for sample in family.samples:
            if sample.name not in known:
                continue
            out.setdefault(sample.name, []).append(
                {"labels": dict(sample.labels), "value": sample.value}
            )
    return out


def parse_exposition(text: str) -> Snapshot:
    """A snapshot from Prometheus text exposition (a scrape of a lakesink endpoint)."""
    from prometheus_client.parser import text_string_to_metric_families

    return snapshot_of(text_string_to_metric_families(text))


def value_of(snapshot: Snapshot, sample: str, **labels: str) -> float:
    """The sum of the samples named `sample` whose labels include `labels` (0 when none)."""
    return sum(
        float(s["value"])
        for s in snapshot.get(sample, [])
        if all(s["labels"].get(k) == v for k, v in labels.items())
    )


TABLE_SERIES = frozenset(
    n for m in METRICS if "table" in m.labels and m.kind != "info" for n in m.series_names
)
"""The sample names of the metrics about a table (their `table` label names it; the info
metric's `table` label is the table path as configured)."""


def table_samples(snapshot: Snapshot, table: str) -> Snapshot:
    """`snapshot` with the samples about tables other than `table` left out (the ingestion's
    own samples kept); a name left without samples is dropped."""
    out: Snapshot = {}
    for name, samples in snapshot.items():
        kept = (
            [s for s in samples if s["labels"].get("table") == table]
            if name in TABLE_SERIES
            else samples
        )
        if kept:
            out[name] = kept
    return out


BATCH_OUTCOMES = ("published", "skipped")
"""The `outcome` labels of lakesink_batches."""
ROLLBACK_REASONS = ("batch_failed", "recovery")
SERVICE_OUTCOMES = ("ok", "failed")
"""The `reason` labels of lakesink_rollbacks."""


def error_classes() -> tuple[str, ...]:
    """The `error` labels lakesink_errors starts with: the classes of lakesink.errors with an
    exit code of their own (the root's direct subclasses); any other class that fails a batch
    adds its series then."""
    from lakesink.errors import LakesinkError

    return tuple(
        sorted(
            c.__name__ for c in LakesinkError.__subclasses__() if c.__module__ == "lakesink.errors"
        )
    )


class IngestionMetrics:
    """The metrics of one ingestion, in a registry of their own.

    The metrics about a table (rows, bytes, dead letters, partition gauges, commit latency,
    lock wait, pending epochs, rollbacks, last commit) carry a `table` label: each table's
    coordinator records into the view `of_table(name)` gives, which shares this registry and
    labels what it records with that table's name. The ingestion's own metrics (batches,
    errors, lost offsets) have no table label."""

    def __init__(
        self,
        *,
        writer_id: str = "",
        table: str = "",
        topics: str = "",
        topic_names: Iterable[str] = (),
        table_names: Iterable[str] = (),
        dead_letter_table: str | None = None,
    ) -> None:
        """`table`: the table path (or paths) for the info metric; `topics`: what the
        ingestion reads as configured (names or a pattern), for the info metric;
        `topic_names`: the topics known at start, `table_names`: the tables (the first is what
        this object records as, see `of_table`), `dead_letter_table`: the dead-letter table's
        name: their per-table and per-topic series start at 0."""
        self.registry = CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        names = list(table_names)
        self.table_label = names[0] if names else ""
        """The `table` label of what this object records (a view: its table's name)."""
        self._root = self
        self._views: dict[str, IngestionMetrics] = {}
        r = self.registry
        self.info = Info(
            "lakesink_ingestion", METRICS_BY_NAME["lakesink_ingestion"].help, registry=r
        )
        self.info.info({"writer": writer_id, "table": table, "topics": topics})

        def counter(name: str) -> Counter:
            spec = METRICS_BY_NAME[name]
            return Counter(name, spec.help, spec.labels, registry=r)

        def gauge(name: str) -> Gauge:
            spec = METRICS_BY_NAME[name]
            return Gauge(name, spec.help, spec.labels, registry=r)

        def histogram(name: str) -> Histogram:
            spec = METRICS_BY_NAME[name]
            return Histogram(name, spec.help, spec.labels, registry=r, buckets=spec.buckets)

        self.records = counter("lakesink_records_ingested")
        self.bytes = counter("lakesink_bytes_ingested")
        self.batches = counter("lakesink_batches")
        self.dead_letters = counter("lakesink_dead_letters")
        self.offsets_lost = counter("lakesink_offsets_lost")
        self.committed_offset = gauge("lakesink_partition_committed_offset")
        self.high_watermark = gauge("lakesink_partition_high_watermark")
        self.lag = gauge("lakesink_partition_lag")
        self.batch_duration = histogram("lakesink_batch_duration_seconds")
        self.commit_duration = histogram("lakesink_commit_duration_seconds")
        self.lock_wait = histogram("lakesink_lock_wait_seconds")
        self.pending_epochs = gauge("lakesink_pending_epochs")
        self.rollbacks = counter("lakesink_rollbacks")
        self.service_runs = counter("lakesink_table_service_runs")
        self.errors = counter("lakesink_errors")
        self.last_commit = gauge("lakesink_last_commit_timestamp_seconds")
        self._start_at_zero(list(topic_names), names, dead_letter_table)

    def of_table(self, name: str) -> IngestionMetrics:
        """The view of these metrics that records as table `name` (one per name): the same
        registry and series, its `table_label` that name, its rollback series started at 0
        (they give the dashboard its list of tables). Serving and closing stay the
        ingestion's (`serve`, `close` act on the object that made the registry)."""
        root = self._root
        with root._lock:
            view = root._views.get(name)
            if view is None:
                view = copy.copy(root)
                view.table_label = name
                root._views[name] = view
                for reason in ROLLBACK_REASONS:  # a table created later (dynamic) reads 0 too
                    root.rollbacks.labels(table=name, reason=reason)
        return view

    def _start_at_zero(
        self, topic_names: list[str], table_names: list[str], dead_letter_table: str | None
    ) -> None:
        """Create the labelled counters' series a dashboard shows before anything happened at
        0: a panel of rollbacks, dead letters or errors reads 0, not "No data", and `increase`
        counts the first event (a series born at 1 has no increase)."""
        for outcome in BATCH_OUTCOMES:
            self.batches.labels(outcome)
        for error in error_classes():
            self.errors.labels(error)
        for table in table_names:
            for reason in ROLLBACK_REASONS:
                self.rollbacks.labels(table=table, reason=reason)
            for topic in topic_names:
                self.records.labels(table=table, topic=topic)
                self.bytes.labels(table=table, topic=topic)
        for topic in topic_names:
            self.offsets_lost.labels(topic)
        if dead_letter_table is not None:
            self.start_dead_letters(dead_letter_table, topic_names)

    def start_dead_letters(self, table: str, topic_names: Iterable[str]) -> None:
        """Create the dead-letter series of dead-letter table `table` at 0 (`_start_at_zero`),
        once its name is known."""
        for topic in topic_names:
            self.dead_letters.labels(table=table, topic=topic)

    # --- recording (as `table_label`, for the metrics about a table) ----------------------
    def record_rows(self, topic: str, records: int, nbytes: int) -> None:
        labels = {"table": self.table_label, "topic": topic or UNKNOWN_TOPIC}
        self.records.labels(**labels).inc(records)
        self.bytes.labels(**labels).inc(nbytes)

    def record_batch(self, outcome: str, seconds: float | None = None) -> None:
        self.batches.labels(outcome).inc()
        if seconds is not None:
            self.batch_duration.observe(seconds)

    def record_dead_letters(self, topic: str, count: int) -> None:
        """Dead letters committed to this view's table (the dead-letter table's view)."""
        self.dead_letters.labels(table=self.table_label, topic=topic or UNKNOWN_TOPIC).inc(count)

    def record_offsets_lost(self, topic: str, count: int) -> None:
        self.offsets_lost.labels(topic or UNKNOWN_TOPIC).inc(count)

    def record_commit(self, seconds: float, at_unix_s: float) -> None:
        self.commit_duration.labels(self.table_label).observe(seconds)
        self.last_commit.labels(self.table_label).set(at_unix_s)

    def record_lock_wait(self, seconds: float) -> None:
        self.lock_wait.labels(self.table_label).observe(seconds)

    def record_rollback(self, reason: str, count: int = 1) -> None:
        self.rollbacks.labels(table=self.table_label, reason=reason).inc(count)

    def record_service_run(self, *, failed: bool) -> None:
        self.service_runs.labels(table=self.table_label, outcome=SERVICE_OUTCOMES[failed]).inc()

    def record_error(self, error: BaseException) -> None:
        self.errors.labels(type(error).__name__).inc()

    def set_pending_epochs(self, count: int) -> None:
        self.pending_epochs.labels(self.table_label).set(count)

    def set_partition(
        self, topic: str, partition: int, committed: int | None, high_watermark: int | None
    ) -> None:
        labels = (self.table_label, topic, str(partition))
        if committed is not None:
            self.committed_offset.labels(*labels).set(committed)
        if high_watermark is not None:
            self.high_watermark.labels(*labels).set(high_watermark)
            self.lag.labels(*labels).set(max(0, high_watermark - (committed or 0)))

    # --- reading ---------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return snapshot_of(self.registry.collect())

    # --- serving ---------------------------------------------------------------------------
    def serve(self, host: str, port: int) -> str:
        """Start the HTTP endpoint (`/metrics`) on a daemon thread; returns its URL. Port 0
        picks a free port."""
        if self._root is not self:
            return self._root.serve(host, port)
        with self._lock:
            if self._server is None:
                try:
                    self._server, self._thread = start_http_server(
                        port, addr=host, registry=self.registry
                    )
                except OSError as e:
                    from lakesink.errors import ConfigError

                    raise ConfigError(
                        f"metrics.port={port} on metrics.host={host} cannot be served: "
                        f"{e.strerror or e}; choose a free port (0 picks one)"
                    ) from e
                log.info("metrics served at %s", self.url)
            return str(self.url)

    @property
    def url(self) -> str | None:
        if self._root is not self:
            return self._root.url
        if self._server is None:
            return None
        host, port = self._server.server_address[:2]
        return f"http://{_url_host(str(host))}:{port}/metrics"

    def close(self) -> None:
        if self._root is not self:
            return  # a table's view: the ingestion closes its endpoint
        with self._lock:
            if self._server is not None:
                self._server.shutdown()
                self._server.server_close()
                if self._thread is not None:
                    self._thread.join(timeout=5)
                self._server = self._thread = None


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def scrape(url: str, timeout_s: float = 2.0) -> Snapshot:
    """The lakesink samples of a running endpoint (raises OSError when it does not answer)."""
    from urllib.request import urlopen

    with urlopen(url, timeout=timeout_s) as response:
        return parse_exposition(response.read().decode("utf-8"))
