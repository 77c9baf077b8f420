"""Commit and rollback metadata, the content of completed timeline files.

Layout 1 (table version 6) stores commit metadata as Hudi's JSON `HoodieCommitMetadata`;
layout 2 (table version 8) as an Avro container file holding one `HoodieCommitMetadata`
(or `HoodieReplaceCommitMetadata` for replacecommits). Rollback plans and rollback metadata
are Avro in both layouts, as Hudi writes them.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, cast

import fastavro

from lakesink.engine.change import SCHEMA_KEY as SCHEMA_KEY
from lakesink.engine.change import TableChange
from lakesink.errors import CorruptTableError
from lakesink.formats.hudi.table.avro_container import ContainerWriter
from lakesink.protocol.instant import Action, TimelineLayout

_NS = "org.apache.hudi.avro.model"

COMPACT_OPERATION = "COMPACT"
"""The operation type of a compaction's commit (Hudi's `WriteOperationType.COMPACT`)."""


def _nullable(name: str, typ: Any) -> dict[str, Any]:
    return {"name": name, "type": ["null", typ], "default": None}


_WRITE_STAT_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "HoodieWriteStat",
    "namespace": _NS,
    "fields": [
        _nullable("fileId", "string"),
        _nullable("path", "string"),
        _nullable("prevCommit", "string"),
        _nullable("numWrites", "long"),
        _nullable("numDeletes", "long"),
        _nullable("numUpdateWrites", "long"),
        _nullable("totalWriteBytes", "long"),
        _nullable("totalWriteErrors", "long"),
        _nullable("partitionPath", "string"),
        _nullable("totalLogRecords", "long"),
        _nullable("totalLogFiles", "long"),
        _nullable("totalUpdatedRecordsCompacted", "long"),
        _nullable("numInserts", "long"),
        _nullable("totalLogBlocks", "long"),
        _nullable("totalCorruptLogBlock", "long"),
        _nullable("totalRollbackBlocks", "long"),
        _nullable("fileSizeInBytes", "long"),
        _nullable("baseFile", "string"),
        _nullable("logFiles", {"type": "array", "items": "string"}),
        _nullable("prevBaseFile", "string"),
        _nullable("minEventTime", "long"),
        _nullable("maxEventTime", "long"),
        _nullable("tempPath", "string"),
        _nullable("numUpdates", "long"),
    ],
}


def _commit_avro_schema(replace: bool) -> dict[str, Any]:
    fields: list[dict[str, Any]] = [
        _nullable(
            "partitionToWriteStats",
            {"type": "map", "values": {"type": "array", "items": _WRITE_STAT_SCHEMA}},
        ),
        _nullable("compacted", "boolean"),
        _nullable("extraMetadata", {"type": "map", "values": "string"}),
        {"name": "version", "type": ["int", "null"], "default": 1},
        _nullable("operationType", "string"),
    ]
    if replace:
        fields.append(
            _nullable(
                "partitionToReplaceFileIds",
                {"type": "map", "values": {"type": "array", "items": "string"}},
            )
        )
    name = "HoodieReplaceCommitMetadata" if replace else "HoodieCommitMetadata"
    return {"type": "record", "name": name, "namespace": _NS, "fields": fields}


_COMMIT_SCHEMA = fastavro.parse_schema(_commit_avro_schema(False))
_REPLACE_SCHEMA = fastavro.parse_schema(_commit_avro_schema(True))
# Commit metadata is written on every publish and grows with the files of a commit: compiled
# encoders (lakesink.formats.hudi.table.avro_container), byte for byte what fastavro writes.
_COMMIT_WRITER = ContainerWriter(_COMMIT_SCHEMA)
_REPLACE_WRITER = ContainerWriter(_REPLACE_SCHEMA)

_INSTANT_INFO_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "HoodieInstantInfo",
    "namespace": _NS,
    "fields": [{"name": "commitTime", "type": "string"}, {"name": "action", "type": "string"}],
}

_ROLLBACK_SCHEMA = fastavro.parse_schema(
    {
        "type": "record",
        "name": "HoodieRollbackMetadata",
        "namespace": _NS,
        "fields": [
            {"name": "startRollbackTime", "type": "string"},
            {"name": "timeTakenInMillis", "type": "long"},
            {"name": "totalFilesDeleted", "type": "int"},
            {"name": "commitsRollback", "type": {"type": "array", "items": "string"}},
            {
                "name": "partitionMetadata",
                "type": {
                    "type": "map",
                    "values": {
                        "type": "record",
                        "name": "HoodieRollbackPartitionMetadata",
                        "fields": [
                            {"name": "partitionPath", "type": "string"},
                            {
                                "name": "successDeleteFiles",
                                "type": {"type": "array", "items": "string"},
                            },
                            {
                                "name": "failedDeleteFiles",
                                "type": {"type": "array", "items": "string"},
                            },
                            _nullable("rollbackLogFiles", {"type": "map", "values": "long"}),
                            _nullable("writtenLogFiles", {"type": "map", "values": "long"}),
                        ],
                    },
                },
            },
            {"name": "version", "type": ["int", "null"], "default": 1},
            {
                "name": "instantsRollback",
                "type": {"type": "array", "items": _INSTANT_INFO_SCHEMA},
                "default": [],
            },
        ],
    }
)

_ROLLBACK_PLAN_SCHEMA = fastavro.parse_schema(
    {
        "type": "record",
        "name": "HoodieRollbackPlan",
        "namespace": _NS,
        "fields": [
            {"name": "instantToRollback", "type": ["null", _INSTANT_INFO_SCHEMA], "default": None},
            _nullable(
                "rollbackRequests",
                {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "HoodieRollbackRequest",
                        "fields": [
                            {"name": "partitionPath", "type": "string"},
                            _nullable("fileId", "string"),
                            _nullable("latestBaseInstant", "string"),
                            {
                                "name": "filesToBeDeleted",
                                "type": {"type": "array", "items": "string"},
                                "default": [],
                            },
                            _nullable("logBlocksToBeDeleted", {"type": "map", "values": "long"}),
                        ],
                    },
                },
            ),
            {"name": "version", "type": ["int", "null"], "default": 1},
        ],
    }
)


def _avro_bytes(schema: Any, record: Mapping[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.writer(buf, schema, [record], codec="null")
    return buf.getvalue()


def _avro_record(data: bytes, what: str) -> dict[str, Any]:
    try:
        records = list(fastavro.reader(io.BytesIO(data)))
    except Exception as e:  # fastavro raises many unrelated types for garbage input
        raise CorruptTableError(f"{what} is not a valid Avro file: {e}") from e
    if len(records) != 1 or not isinstance(records[0], dict):
        raise CorruptTableError(f"{what} holds {len(records)} Avro records; expected exactly 1")
    return cast(dict[str, Any], records[0])


@dataclass(frozen=True)
class CommitMetadata(TableChange):
    """A table change as Hudi writes it in a completed commit or replacecommit (the schema:
    Avro JSON, meta columns included): the engine's `TableChange` with Hudi's two timeline
    encodings (JSON for layout 1, Avro for layout 2)."""

    @classmethod
    def of(cls, change: TableChange) -> CommitMetadata:
        """`change` as commit metadata (itself when it is one already)."""
        if isinstance(change, CommitMetadata):
            return change
        return cls(
            operation_type=change.operation_type,
            writes=change.writes,
            replaced_file_ids=change.replaced_file_ids,
            schema=change.schema,
            extra=change.extra,
        )

    # -- Hudi's encodings --------------------------------------------------------------------

    def partition_to_write_stats(self, layout: TimelineLayout) -> dict[str, list[dict[str, Any]]]:
        return self.write_stats(legacy_fields=layout is TimelineLayout.V1)

    def to_dict(
        self, layout: TimelineLayout = TimelineLayout.V1, action: Action = Action.COMMIT
    ) -> dict[str, Any]:
        d = self.base_dict(legacy_fields=layout is TimelineLayout.V1)
        # Hudi's compactor writes `HoodieCommitMetadata(compacted=true)`; the portable form
        # (base_dict, a golden contract) keeps false, never holding a compaction
        d["compacted"] = self.operation_type == COMPACT_OPERATION
        if action is Action.REPLACE_COMMIT:
            d["partitionToReplaceFileIds"] = {
                p: list(ids) for p, ids in self.replaced_file_ids.items()
            }
        elif self.replaced_file_ids:
            raise ValueError("only a replacecommit may replace file groups")
        if layout is TimelineLayout.V2:
            d["version"] = 1
        return d

    def to_bytes(self, layout: TimelineLayout, action: Action = Action.COMMIT) -> bytes:
        """The completed file's content for this layout and action."""
        return self.encode(self.to_dict(layout, action), layout, action)

    @staticmethod
    def encode(d: Mapping[str, Any], layout: TimelineLayout, action: Action) -> bytes:
        """The completed file's content for `to_dict`'s output `d`."""
        if layout is TimelineLayout.V1:
            return json.dumps(d, indent=2, sort_keys=False).encode("utf-8")
        writer = _REPLACE_WRITER if action is Action.REPLACE_COMMIT else _COMMIT_WRITER
        return writer.file_bytes(d)

    def as_read(self, d: Mapping[str, Any]) -> CommitMetadata:
        """What a reader parses from the file written from `d` (this metadata's `to_dict`):
        this very object when parsing would rebuild it equal (writes grouped by partition as
        the file lists them, every field set), else the dict parsed."""
        writes = self.writes
        runs = 1 + sum(a.partition_path != b.partition_path for a, b in pairwise(writes))
        grouped = runs == len({w.partition_path for w in writes}) or not writes
        if self.operation_type and grouped and all(w.prev_commit for w in writes):
            return self
        return self.from_dict(d)

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        layout: TimelineLayout,
        action: Action = Action.COMMIT,
        *,
        source: str = "commit metadata",
    ) -> CommitMetadata:
        """Parse a completed commit file; CorruptTableError naming `source` if it is empty or
        garbled."""
        if layout is TimelineLayout.V1 or data[:1] == b"{" or not data:
            return cls.from_json_bytes(data, source)
        return cls.from_dict(_avro_record(data, source), source)


@dataclass(frozen=True)
class RollbackPlan:
    """The content of a `rollback.requested` file: which instant it rolls back."""

    instant_time: str
    action: str

    def to_bytes(self) -> bytes:
        record = {
            "instantToRollback": {"commitTime": self.instant_time, "action": self.action},
            "rollbackRequests": [],
            "version": 1,
        }
        return _avro_bytes(_ROLLBACK_PLAN_SCHEMA, record)

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "rollback plan") -> RollbackPlan:
        if not data:
            raise CorruptTableError(f"{source} is empty (0 bytes)")
        r = _avro_record(data, source)
        info = r.get("instantToRollback")
        if not isinstance(info, dict):
            raise CorruptTableError(f"{source} names no instant to roll back")
        return cls(str(info["commitTime"]), str(info["action"]))


@dataclass(frozen=True)
class RollbackMetadata:
    """The content of a completed rollback: the rolled-back instant and the files deleted.
    hudi-rs skips rollback instants entirely; rolled-back files are gone from storage."""

    start_rollback_time: str
    rolled_back: tuple[tuple[str, str], ...]  # (instant time, action)
    deleted_files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # partition → paths
    failed_files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    time_taken_ms: int = 0

    def to_bytes(self) -> bytes:
        partitions = sorted(set(self.deleted_files) | set(self.failed_files))
        record = {
            "startRollbackTime": self.start_rollback_time,
            "timeTakenInMillis": self.time_taken_ms,
            "totalFilesDeleted": sum(len(v) for v in self.deleted_files.values()),
            "commitsRollback": [t for t, _ in self.rolled_back],
            "partitionMetadata": {
                p: {
                    "partitionPath": p,
                    "successDeleteFiles": list(self.deleted_files.get(p, ())),
                    "failedDeleteFiles": list(self.failed_files.get(p, ())),
                    "rollbackLogFiles": None,
                    "writtenLogFiles": None,
                }
                for p in partitions
            },
            "version": 1,
            "instantsRollback": [{"commitTime": t, "action": a} for t, a in self.rolled_back],
        }
        return _avro_bytes(_ROLLBACK_SCHEMA, record)

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "rollback metadata") -> RollbackMetadata:
        if not data:
            raise CorruptTableError(f"{source} is empty (0 bytes)")
        r = _avro_record(data, source)
        try:
            infos = r.get("instantsRollback") or []
            rolled = tuple((str(i["commitTime"]), str(i["action"])) for i in infos) or tuple(
                (str(t), "commit") for t in r["commitsRollback"]
            )
            pm = r.get("partitionMetadata") or {}
            return cls(
                start_rollback_time=str(r["startRollbackTime"]),
                rolled_back=rolled,
                deleted_files={p: tuple(m["successDeleteFiles"]) for p, m in pm.items()},
                failed_files={p: tuple(m["failedDeleteFiles"]) for p, m in pm.items()},
                time_taken_ms=int(r["timeTakenInMillis"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptTableError(f"{source} is malformed: {e!r}") from e
