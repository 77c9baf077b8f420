"""The Hudi clustering plan a lakesink clustering leaves in its replacecommit.requested."""

from __future__ import annotations

import io

import fastavro
import pytest

from lakesink.errors import CorruptTableError
from lakesink.formats.hudi.table.plans import (
    PlannedSlice,
    clustering_plan_bytes,
    planned_file_groups,
)


def test_clustering_plan_round_trips_with_one_input_group_per_partition() -> None:
    groups = {
        "day=2024-01-02": [PlannedSlice("day=2024-01-02", "f3-0", "/t/day=2024-01-02/f3.parquet")],
        "day=2024-01-01": [
            PlannedSlice("day=2024-01-01", "f1-0", "/t/day=2024-01-01/f1.parquet"),
            PlannedSlice("day=2024-01-01", "f2-0", "/t/day=2024-01-01/f2.parquet"),
        ],
    }
    data = clustering_plan_bytes(groups, {"lakesink.clustering": "true"})
    assert planned_file_groups(data) == {
        ("day=2024-01-01", "f1-0"),
        ("day=2024-01-01", "f2-0"),
        ("day=2024-01-02", "f3-0"),
    }
    (record,) = list(fastavro.reader(io.BytesIO(data)))
    assert record["operationType"] == "CLUSTER"
    plan = record["clusteringPlan"]
    assert plan["preserveHoodieMetadata"] is True
    assert [len(g["slices"]) for g in plan["inputGroups"]] == [2, 1]
    assert plan["inputGroups"][0]["slices"][0]["dataFilePath"] == "/t/day=2024-01-01/f1.parquet"


def test_an_empty_requested_file_is_no_clustering_and_garbage_is_corrupt() -> None:
    assert planned_file_groups(b"") == set()
    with pytest.raises(CorruptTableError, match="HoodieRequestedReplaceMetadata"):
        planned_file_groups(b"not avro", "t/.hoodie/1.replacecommit.requested")
