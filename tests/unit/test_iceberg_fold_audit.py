"""The fold audit of an Iceberg table of keys, its pure parts: the committed ranges chained from
the writer's snapshot summaries (`lakesink.ranges`), and two readers' rows compared by key.
(End to end: tests/integration/test_iceberg_upsert_ingest.py and test_cdc_debezium.py.)"""

from __future__ import annotations

import json
from decimal import Decimal

import pyarrow as pa

from lakesink.formats.iceberg.audit import IcebergAuditReport
from lakesink.formats.iceberg.fold_audit import _rows_differ, committed_spans
from lakesink.formats.iceberg.snapshots import (
    KEY_MAINTENANCE,
    KEY_RANGES,
    KEY_SKIPPED,
    SnapshotInfo,
    WriterCommit,
)
from lakesink.protocol.offsets import TopicPartition, WriterOffsets

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def commit(
    seq: int,
    offsets: dict[str, int],
    ranges: list[list[object]] | None,
    *,
    writer: str = "w",
    skipped: list[list[object]] | None = None,
) -> SnapshotInfo:
    summary = WriterCommit(writer, f"c{seq}", WriterOffsets.from_json(offsets)).to_summary()
    if ranges is not None:
        summary[KEY_RANGES] = json.dumps(ranges)
    if skipped is not None:
        summary[KEY_SKIPPED] = json.dumps(skipped)
    return SnapshotInfo(seq, seq - 1 or None, seq, seq * 1000, summary)


def spans_of(
    snapshots: list[SnapshotInfo],
) -> tuple[dict[TopicPartition, tuple[int, int]], IcebergAuditReport]:
    report = IcebergAuditReport("w", "ns.accounts")
    return committed_spans(snapshots, "w", report), report


def test_the_writers_ranges_chain_past_other_writers_and_maintenance_snapshots() -> None:
    spans, report = spans_of(
        [
            commit(1, {"t:0": 5, "t:1": 3}, [["t:0", 2, 5], ["t:1", 0, 3]]),
            commit(2, {"t:0": 40}, [["t:0", 0, 40]], writer="other"),
            SnapshotInfo(3, 2, 3, 3000, {KEY_MAINTENANCE: "rewrite-data-files"}),
            commit(4, {"t:0": 9, "t:1": 3}, [["t:0", 5, 9]]),  # t:1 had nothing new
        ]
    )
    assert report.problems == []
    assert spans == {T0: (2, 9), T1: (0, 3)}
    assert report.commits == 2 and report.committed == {"t:0": 9, "t:1": 3}


def test_spans_kafka_deleted_before_they_were_read_keep_the_ranges_contiguous() -> None:
    spans, report = spans_of(
        [
            commit(1, {"t:0": 5}, [["t:0", 0, 5]]),
            commit(2, {"t:0": 20}, [["t:0", 12, 20]], skipped=[["t:0", 5, 12]]),
        ]
    )
    assert report.problems == [] and spans == {T0: (0, 20)}


def test_a_gap_between_two_commits_is_named() -> None:
    _, report = spans_of(
        [commit(1, {"t:0": 5}, [["t:0", 0, 5]]), commit(2, {"t:0": 20}, [["t:0", 7, 20]])]
    )
    assert len(report.problems) == 1 and "starts at 7" in report.problems[0], report.problems
    assert "ended at 5" in report.problems[0]


def test_ranges_that_end_short_of_the_committed_offsets_are_named() -> None:
    _, report = spans_of([commit(1, {"t:0": 8}, [["t:0", 0, 5]])])
    assert report.problems == ["t:0: the ranges end at 5 but the newest commit records 8"]


def test_offsets_that_move_back_are_named() -> None:
    _, report = spans_of(
        [commit(1, {"t:0": 5}, [["t:0", 0, 5]]), commit(2, {"t:0": 3}, [["t:0", 5, 3]])]
    )
    assert any("offsets of t:0 moved back" in p for p in report.problems), report.problems


def test_a_commit_without_ranges_cannot_be_folded() -> None:
    _, report = spans_of([commit(1, {"t:0": 5}, None)])
    assert len(report.problems) == 1, report.problems
    assert f"records no ranges ({KEY_RANGES})" in report.problems[0]


def test_a_lineage_cut_by_expiry_is_named_rather_than_folded_in_part() -> None:
    _, report = spans_of([commit(7, {"t:0": 9}, [["t:0", 5, 9]])])
    assert len(report.problems) == 1 and "were expired" in report.problems[0], report.problems


LARGE_STRING = pa.large_string()


def table(ids: list[int], owners: list[str], string: pa.DataType = LARGE_STRING) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int32()),
            "owner": pa.array(owners, string),
            "balance": pa.array([Decimal("1.50")] * len(ids), pa.decimal128(12, 2)),
        }
    )


def test_readers_agree_when_only_their_arrow_types_differ() -> None:
    first = table([1, 2], ["Ada", "Alan"])
    second = table([2, 1], ["Alan", "Ada"], pa.string()).select(["owner", "balance", "id"])
    assert _rows_differ(first, second, ("id",)) == ""


def test_readers_disagree_on_a_value_a_missing_column_or_a_repeated_key() -> None:
    first = table([1, 2], ["Ada", "Alan"])
    assert "other rows of 1 keys, e.g. [(2,)]" in _rows_differ(
        first, table([1, 2], ["Ada", "Grace"]), ("id",)
    )
    assert "DuckDB lacks balance" in _rows_differ(first, first.drop_columns(["balance"]), ("id",))
    repeated = table([1, 2, 2], ["Ada", "Alan", "Alan"])
    assert "1 rows repeating a key" in _rows_differ(first, repeated, ("id",))


def test_the_fold_comparison_counts_a_null_list_as_empty_only_when_asked() -> None:
    # pyiceberg writes the null headers of a record without headers as an empty list
    from lakesink.formats.audit import _by_key

    rows = pa.table({"id": [1], "tags": pa.array([[]], pa.list_(pa.string()))})
    assert _by_key(rows, ("id",), null_list_is_empty=True) == {(1,): (1, None)}
    assert _by_key(rows, ("id",)) == {(1,): (1, [])}
