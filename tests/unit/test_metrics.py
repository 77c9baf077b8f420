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
    TABLE_SERIES,
    UNKNOWN_TOPIC,
    IngestionMetrics,
    parse_exposition,
    series_names,
    table_samples,
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
    fresh = IngestionMetrics(
        writer_id="w",
        table="/t",
        topics="a,b",
        topic_names=("a", "b"),
        table_names=("t",),
        dead_letter_table="dlq",
    )
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
    assert {
        (s["labels"]["table"], s["labels"]["topic"]) for s in snap["lakesink_dead_letters_total"]
    } == {("dlq", "a"), ("dlq", "b")}
    assert {
        (s["labels"]["table"], s["labels"]["reason"]) for s in snap["lakesink_rollbacks_total"]
    } == {
        ("t", "batch_failed"),
        ("t", "recovery"),
    }
    assert {"ConfigError", "RecordError"} <= {
        s["labels"]["error"] for s in snap["lakesink_errors_total"]
    }
    fresh.record_rollback("recovery")  # counting on from 0, as the first table
    assert value_of(fresh.snapshot(), "lakesink_rollbacks_total", table="t", reason="recovery") == 1
    # a table whose view is made later (a dynamic table) reads 0 at once too
    fresh.of_table("later")
    rolled = value_of(fresh.snapshot(), "lakesink_rollbacks_total", table="later")
    assert rolled == 0 and len(fresh.snapshot()["lakesink_rollbacks_total"]) == 4


def test_metrics_about_a_table_carry_its_name_and_the_ingestions_own_carry_none() -> None:
    m = IngestionMetrics(writer_id="w", table="/t", topics="a", table_names=("orders", "eu"))
    orders, eu = m.of_table("orders"), m.of_table("eu")
    assert m.of_table("orders") is orders and orders.registry is m.registry
    orders.record_rows("a", 10, 100)
    eu.record_rows("a", 3, 30)
    orders.record_commit(0.02, 1_700_000_000.0)
    eu.record_commit(0.5, 1_700_000_100.0)
    eu.record_lock_wait(0.1)
    orders.record_rollback("batch_failed")
    orders.set_partition("a", 0, 40, 100)
    eu.set_partition("a", 0, 90, 100)
    eu.set_pending_epochs(1)
    m.of_table("dlq").record_dead_letters("a", 2)
    eu.record_batch("published", 0.4)  # the ingestion's: no table label
    eu.record_error(ValueError("x"))
    eu.record_offsets_lost("a", 5)
    snap = m.snapshot()
    per_table = {
        "lakesink_records_ingested_total": {"orders": 10, "eu": 3},
        "lakesink_bytes_ingested_total": {"orders": 100, "eu": 30},
        "lakesink_commit_duration_seconds_count": {"orders": 1, "eu": 1},
        "lakesink_last_commit_timestamp_seconds": {"orders": 1_700_000_000, "eu": 1_700_000_100},
        "lakesink_lock_wait_seconds_count": {"orders": 0, "eu": 1},
        "lakesink_rollbacks_total": {"orders": 1, "eu": 0},
        "lakesink_partition_committed_offset": {"orders": 40, "eu": 90},
        "lakesink_partition_high_watermark": {"orders": 100, "eu": 100},
        "lakesink_partition_lag": {"orders": 60, "eu": 10},
        "lakesink_pending_epochs": {"orders": 0, "eu": 1},
    }
    for series, expected in per_table.items():
        got = {t: value_of(snap, series, table=t) for t in expected}
        assert got == expected, series
    assert {s["labels"]["table"] for s in snap["lakesink_dead_letters_total"]} == {"dlq"}
    for series in (
        "lakesink_batches_total",
        "lakesink_errors_total",
        "lakesink_offsets_lost_total",
        "lakesink_batch_duration_seconds_count",
    ):
        assert all("table" not in s["labels"] for s in snap[series]), series
    # the ingestion's own metrics (batches, errors, lost offsets) have no table label
    assert {m.name for m in METRICS if "table" in m.labels and m.kind != "info"} == {
        "lakesink_records_ingested",
        "lakesink_bytes_ingested",
        "lakesink_dead_letters",
        "lakesink_partition_committed_offset",
        "lakesink_partition_high_watermark",
        "lakesink_partition_lag",
        "lakesink_commit_duration_seconds",
        "lakesink_lock_wait_seconds",
        "lakesink_pending_epochs",
        "lakesink_rollbacks",
        "lakesink_table_service_runs",
        "lakesink_last_commit_timestamp_seconds",
    }
    # a table's samples: its own and the ingestion's, none of the other table's
    of_eu = table_samples(snap, "eu")
    assert value_of(of_eu, "lakesink_records_ingested_total") == 3
    assert value_of(of_eu, "lakesink_batches_total") == 1
    assert "lakesink_dead_letters_total" not in of_eu
    assert of_eu["lakesink_ingestion_info"] == snap["lakesink_ingestion_info"]


def test_a_tables_view_serves_and_closes_the_ingestions_one_endpoint() -> None:
    m = IngestionMetrics(table_names=("t",))
    view = m.of_table("t")
    url = view.serve("127.0.0.1", 0)
    try:
        assert m.url == url == view.url
        view.close()  # not the view's to close
        assert m.url == url
    finally:
        m.close()
    assert m.url is None and view.url is None


def test_dashboard_filters_and_splits_every_per_table_metric_by_table() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert "table" in names
    for expr in _expressions(dashboard):
        about_tables = metric_names_in(expr) & TABLE_SERIES
        if not about_tables or expr.startswith("label_values"):
            continue
        # the dead-letter table is not a table of rows: its panel is not filtered by $table
        assert 'table=~"$table"' in expr or about_tables == {"lakesink_dead_letters_total"}, expr
        for grouping in re.findall(r"\bby \(([^)]*)\)", expr):  # per-table series
            assert "table" in grouping, expr


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
