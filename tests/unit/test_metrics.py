"""Metrics: what IngestionMetrics records reads back the same from the registry and from
Prometheus text; the Grafana dashboard and docs/metrics.md name only (and every) metric lakesink
defines; rows and bytes are counted per topic as the tasks write them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pytest
from prometheus_client.exposition import generate_latest

from lakesink.metrics import (
    METRICS,
    UNKNOWN_TOPIC,
    IngestionMetrics,
    parse_exposition,
    series_names,
    value_of,
)
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import WriteStatus
from lakesink.spark.task_writer import TOPICS_EXTRA, topic_counts

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "lakesink.json"

# PromQL functions and aggregation operators the dashboard may use
PROMQL_FUNCTIONS = {
    "sum",
    "max",
    "min",
    "avg",
    "count",
    "rate",
    "irate",
    "increase",
    "delta",
    "histogram_quantile",
    "time",
    "label_values",
    "clamp_min",
    "topk",
}
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "and", "or", "unless", "offset", "bool"}


def _recorded() -> IngestionMetrics:
    m = IngestionMetrics(writer_id="w", table="/t", topics="a,b")
    m.record_rows("a", 10, 1000)
    m.record_rows("a", 5, 500)
    m.record_rows("", 2, 20)
    m.record_batch("published", 0.3)
    m.record_batch("skipped")
    m.record_commit(0.02, 1_700_000_000.0)
    m.record_lock_wait(0.004)
    m.record_rollback("recovery", 2)
    m.record_dead_letters("b", 3)
    m.record_error(ValueError("x"))
    m.set_pending_epochs(2)
    m.set_partition("a", 0, 40, 100)
    m.set_partition("a", 1, None, 7)
    return m


def test_metrics_snapshot_reads_back_every_recorded_value_under_its_series_name() -> None:
    snap = _recorded().snapshot()
    assert value_of(snap, "lakesink_records_ingested_total", topic="a") == 15
    assert value_of(snap, "lakesink_bytes_ingested_total", topic="a") == 1500
    assert value_of(snap, "lakesink_records_ingested_total", topic=UNKNOWN_TOPIC) == 2
    assert value_of(snap, "lakesink_batches_total", outcome="published") == 1
    assert value_of(snap, "lakesink_batches_total") == 2
    assert value_of(snap, "lakesink_batch_duration_seconds_count") == 1
    assert value_of(snap, "lakesink_batch_duration_seconds_sum") == pytest.approx(0.3)
    assert value_of(snap, "lakesink_commit_duration_seconds_bucket", le="0.025") == 1
    assert value_of(snap, "lakesink_lock_wait_seconds_count") == 1
    assert value_of(snap, "lakesink_rollbacks_total", reason="recovery") == 2
    assert value_of(snap, "lakesink_dead_letters_total", topic="b") == 3
    assert value_of(snap, "lakesink_errors_total", error="ValueError") == 1
    assert value_of(snap, "lakesink_pending_epochs") == 2
    assert value_of(snap, "lakesink_last_commit_timestamp_seconds") == 1_700_000_000
    assert value_of(snap, "lakesink_partition_lag", topic="a", partition="0") == 60
    # no committed offset yet: the lag is the whole high watermark, no committed sample
    assert value_of(snap, "lakesink_partition_lag", topic="a", partition="1") == 7
    assert len(snap["lakesink_partition_committed_offset"]) == 1
    assert snap["lakesink_ingestion_info"][0]["labels"] == {
        "writer": "w",
        "table": "/t",
        "topics": "a,b",
    }
    assert set(snap) <= series_names()


def test_metrics_parsed_from_prometheus_text_equal_the_registry_snapshot() -> None:
    m = _recorded()
    text = generate_latest(m.registry).decode()
    assert parse_exposition(text) == m.snapshot()


def test_metrics_registry_exposes_every_defined_metric_and_nothing_else() -> None:
    m = IngestionMetrics()
    exposed = {family.name for family in m.registry.collect()}
    assert exposed == {spec.name for spec in METRICS}
    for spec in METRICS:  # Prometheus conventions: base units, counters without _total
        assert re.fullmatch(r"lakesink_[a-z_]+", spec.name), spec.name
        assert not spec.name.endswith("_total")


def test_metrics_of_two_ingestions_in_one_process_do_not_mix() -> None:
    a, b = IngestionMetrics(), IngestionMetrics()
    a.record_rows("t", 3, 30)
    assert value_of(b.snapshot(), "lakesink_records_ingested_total") == 0


def _expressions(dashboard: dict[str, object]) -> list[str]:
    exprs: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if (key in ("expr", "definition") and isinstance(value, str)) or (
                    key == "query" and isinstance(value, str) and "(" in value
                ):
                    exprs.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(dashboard)
    return exprs


def metric_names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression selects; raises on an identifier that is neither
    a metric nor a known function or keyword."""
    text = re.sub(r'"[^"]*"', '""', expr)  # strings (label values, variables)
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", text)  # grouping labels
    text = re.sub(r"label_values\(([a-z_:]+),\s*[a-z_]+\)", r"label_values(\1)", text)
    names: set[str] = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?", text):
        word = match.group(0).rstrip("( ")
        if match.group(1):
            assert word in PROMQL_FUNCTIONS, f"unknown PromQL function {word!r} in {expr!r}"
        elif word not in PROMQL_KEYWORDS:
            names.add(word)
    return names


def test_dashboard_queries_reference_only_metrics_lakesink_defines() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = _expressions(dashboard)
    assert len(exprs) >= 15
    used: set[str] = set()
    for expr in exprs:
        names = metric_names_in(expr)
        assert names, f"{expr!r} selects no metric"
        unknown = names - series_names()
        assert not unknown, f"{expr!r} references {sorted(unknown)}, not lakesink metrics"
        used |= names
    # and every metric has a panel
    missing = [m.name for m in METRICS if not set(m.series_names) & used]
    assert not missing, f"no dashboard panel shows {missing}"


def test_a_fresh_ingestions_rollback_dead_letter_and_error_panels_read_zero() -> None:
    # the series exist from the start at 0: the panels show 0, not "No data"
    fresh = IngestionMetrics(writer_id="w", table="/t", topics="a,b", topic_names=("a", "b"))
    text = generate_latest(fresh.registry).decode()
    snap = parse_exposition(text)
    panels = {
        p["title"]: metric_names_in(t["expr"])
        for p in json.loads(DASHBOARD.read_text())["panels"]
        for t in p.get("targets", [])
    }
    zero_panels = [t for t in panels if re.match(r"(Rollbacks|Dead letters|Errors)\b", t)]
    assert len(zero_panels) == 3, sorted(panels)
    for title in zero_panels:
        for name in panels[title]:
            assert snap.get(name), f"{title}: {name} has no series before its first event"
            assert all(s["value"] == 0 for s in snap[name]), snap[name]
    assert {s["labels"]["topic"] for s in snap["lakesink_dead_letters_total"]} == {"a", "b"}
    assert {s["labels"]["reason"] for s in snap["lakesink_rollbacks_total"]} == {
        "batch_failed",
        "recovery",
    }
    assert {"ConfigError", "RecordError"} <= {
        s["labels"]["error"] for s in snap["lakesink_errors_total"]
    }
    fresh.record_rollback("recovery")  # counting on from 0
    assert value_of(fresh.snapshot(), "lakesink_rollbacks_total", reason="recovery") == 1


def test_dashboard_check_catches_a_misspelled_metric() -> None:
    names = metric_names_in('sum by (topic) (rate(lakesink_record_ingested_total{x="1"}[5m]))')
    assert names == {"lakesink_record_ingested_total"}
    assert names - series_names()
    with pytest.raises(AssertionError, match="unknown PromQL function"):
        metric_names_in("sumx(lakesink_partition_lag)")


def test_metrics_docs_name_every_metric_with_its_labels() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    for spec in METRICS:
        for series in spec.series_names[:1]:
            assert f"`{series}`" in doc, series
        for label in spec.labels:
            assert f"`{label}`" in doc, (spec.name, label)


def test_topic_counts_of_a_batch_split_rows_and_bytes_per_topic() -> None:
    one = pa.RecordBatch.from_pydict({"kafka_topic": ["a", "a"], "v": [1, 2]})
    assert topic_counts(one) == {"a": (2, one.nbytes)}
    mixed = pa.RecordBatch.from_pydict({"kafka_topic": ["a", "b", "a"], "v": [1, 2, 3]})
    counts = topic_counts(mixed)
    assert {t: n for t, (n, _) in counts.items()} == {"a": 2, "b": 1}
    assert all(nbytes > 0 for _, nbytes in counts.values())
    no_topic = pa.RecordBatch.from_pydict({"v": [1, 2, 3]})
    assert topic_counts(no_topic) == {"": (3, no_topic.nbytes)}


def test_rows_per_topic_attributes_rows_without_a_topic_to_the_batchs_only_topic() -> None:
    from lakesink.spark.task_writer import rows_per_topic

    def status(topics: dict[str, list[int]]) -> WriteStatus:
        return WriteStatus("1", "a", extra={TOPICS_EXTRA: topics})

    one = [OffsetRange(TopicPartition("a", 0), 0, 5), OffsetRange(TopicPartition("a", 1), 0, 5)]
    two = [*one, OffsetRange(TopicPartition("b", 0), 0, 5)]
    statuses = [status({"": [4, 40]}), status({"a": [6, 60]})]
    assert rows_per_topic(statuses, one) == {"a": (10, 100)}
    assert rows_per_topic(statuses, two) == {UNKNOWN_TOPIC: (4, 40), "a": (6, 60)}
