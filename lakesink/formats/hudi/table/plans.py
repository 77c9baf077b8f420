"""The Avro plan a pending clustering leaves in its `replacecommit.requested` file
(`HoodieRequestedReplaceMetadata` with a `HoodieClusteringPlan`), so that Java Hudi sees which
file groups a pending lakesink clustering rewrites: its writers then keep updates away from them
(an empty requested file reads as "not clustering" there). lakesink itself plans from its own
JSON plan; this file is for other Hudi writers and tools."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import fastavro

from lakesink.errors import CorruptTableError

AVRO_NAMESPACE = "org.apache.hudi.avro.model"
CLUSTER_OPERATION = "CLUSTER"


def optional_field(name: str, typ: Any) -> dict[str, Any]:
    """An Avro record field that may be null, null by default (Hudi's plans' optional fields)."""
    return {"name": name, "type": ["null", typ], "default": None}


def _version() -> dict[str, Any]:
    return {"name": "version", "type": ["int", "null"], "default": 1}


STRING_MAP = {"type": "map", "values": "string"}
_SLICE = {
    "type": "record",
    "name": "HoodieSliceInfo",
    "namespace": AVRO_NAMESPACE,
    "fields": [
        optional_field("dataFilePath", "string"),
        optional_field("deltaFilePaths", {"type": "array", "items": "string"}),
        {"name": "fileId", "type": ["null", "string"]},
        optional_field("partitionPath", "string"),
        optional_field("bootstrapFilePath", "string"),
        _version(),
    ],
}
_GROUP = {
    "type": "record",
    "name": "HoodieClusteringGroup",
    "namespace": AVRO_NAMESPACE,
    "fields": [
        optional_field("slices", {"type": "array", "items": _SLICE}),
        optional_field("metrics", {"type": "map", "values": "double"}),
        {"name": "numOutputFileGroups", "type": ["int", "null"], "default": 1},
        optional_field("extraMetadata", STRING_MAP),
        _version(),
    ],
}
_STRATEGY = {
    "type": "record",
    "name": "HoodieClusteringStrategy",
    "namespace": AVRO_NAMESPACE,
    "fields": [
        optional_field("strategyClassName", "string"),
        optional_field("strategyParams", STRING_MAP),
        _version(),
    ],
}
_PLAN = {
    "type": "record",
    "name": "HoodieClusteringPlan",
    "namespace": AVRO_NAMESPACE,
    "fields": [
        optional_field("inputGroups", {"type": "array", "items": _GROUP}),
        optional_field("strategy", _STRATEGY),
        optional_field("extraMetadata", STRING_MAP),
        _version(),
        optional_field("preserveHoodieMetadata", "boolean"),
        optional_field("missingSchedulePartitions", {"type": "array", "items": "string"}),
    ],
}
_REQUESTED_REPLACE = fastavro.parse_schema(
    {
        "type": "record",
        "name": "HoodieRequestedReplaceMetadata",
        "namespace": AVRO_NAMESPACE,
        "fields": [
            optional_field("operationType", "string"),
            optional_field("clusteringPlan", _PLAN),
            optional_field("extraMetadata", STRING_MAP),
            _version(),
        ],
    }
)


@dataclass(frozen=True, slots=True)
class PlannedSlice:
    """One file slice a clustering rewrites: its partition, file group and base file."""

    partition_path: str
    file_id: str
    data_file_path: str
    """Where the base file is, as a path Hadoop resolves (absolute)."""


def clustering_plan_bytes(
    groups: Mapping[str, Sequence[PlannedSlice]], extra: Mapping[str, str] | None = None
) -> bytes:
    """The `replacecommit.requested` content of a clustering: one input group per partition,
    each rewritten into one output file group, Hudi meta columns kept."""
    record = {
        "operationType": CLUSTER_OPERATION,
        "clusteringPlan": {
            "inputGroups": [
                {
                    "slices": [
                        {
                            "dataFilePath": s.data_file_path,
                            "deltaFilePaths": [],
                            "fileId": s.file_id,
                            "partitionPath": s.partition_path,
                            "bootstrapFilePath": "",
                            "version": 1,
                        }
                        for s in slices
                    ],
                    "metrics": {},
                    "numOutputFileGroups": 1,
                    "extraMetadata": {},
                    "version": 1,
                }
                for _, slices in sorted(groups.items())
                if slices
            ],
            "strategy": {
                "strategyClassName": None,
                "strategyParams": {},
                "version": 1,
            },
            "extraMetadata": dict(extra or {}),
            "version": 1,
            "preserveHoodieMetadata": True,
            "missingSchedulePartitions": [],
        },
        "extraMetadata": dict(extra or {}),
        "version": 1,
    }
    buf = io.BytesIO()
    fastavro.writer(buf, _REQUESTED_REPLACE, [record], codec="null")
    return buf.getvalue()


def planned_file_groups(data: bytes, source: str = "clustering plan") -> set[tuple[str, str]]:
    """(partition path, file id) of every slice in a `replacecommit.requested` clustering plan;
    empty for an empty file (a replacecommit that is not a clustering)."""
    if not data:
        return set()
    try:
        records = list(fastavro.reader(io.BytesIO(data)))
    except Exception as e:  # fastavro raises many unrelated types for garbage input
        raise CorruptTableError(f"{source} is not a HoodieRequestedReplaceMetadata: {e}") from e
    if len(records) != 1 or not isinstance(records[0], dict):
        raise CorruptTableError(f"{source} holds {len(records)} records, expected 1")
    plan = records[0].get("clusteringPlan") or {}
    out: set[tuple[str, str]] = set()
    for group in plan.get("inputGroups") or []:
        for s in group.get("slices") or []:
            out.add((str(s.get("partitionPath") or ""), str(s.get("fileId"))))
    return out
