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
from types import MappingProxyType
from typing import Any, cast

import fastavro

from lakesink.errors import CorruptTableError
from lakesink.formats.hudi.table.avro_container import ContainerWriter
from lakesink.protocol.instant import Action, TimelineLayout
from lakesink.protocol.write_status import FileWrite

SCHEMA_KEY = "schema"
_NS = "org.apache.hudi.avro.model"


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


def _frozen_map(m: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(m))


@dataclass(frozen=True)
class CommitMetadata:
    """What a completed commit or replacecommit says: the files it wrote, the file groups it
    replaced, the schema of its rows (Avro JSON, meta columns included) and lakesink's keys."""

    operation_type: str
    writes: tuple[FileWrite, ...] = ()
    replaced_file_ids: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    schema: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "writes", tuple(self.writes))
        object.__setattr__(
            self,
            "replaced_file_ids",
            _frozen_map({p: tuple(ids) for p, ids in self.replaced_file_ids.items()}),
        )
        object.__setattr__(self, "extra", _frozen_map(self.extra))
        if SCHEMA_KEY in self.extra:
            raise ValueError(f"extra metadata must not use the reserved key {SCHEMA_KEY!r}")

    # -- Hudi's field names ------------------------------------------------------------------

    def extra_metadata(self) -> dict[str, str]:
        out = dict(self.extra)
        if self.schema:
            out[SCHEMA_KEY] = self.schema
        return out

    def partition_to_write_stats(self, layout: TimelineLayout) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for w in self.writes:
            stat: dict[str, Any] = {
                "fileId": w.file_id,
                "path": w.path,
                "prevCommit": w.prev_commit,
                "numWrites": w.num_writes,
                "numDeletes": 0,
                "numUpdateWrites": 0,
                "numInserts": w.num_inserts,
                "totalWriteBytes": w.total_write_bytes,
                "totalWriteErrors": 0,
                "partitionPath": w.partition_path,
                "totalLogRecords": 0,
                "totalLogFiles": 0,
                "totalUpdatedRecordsCompacted": 0,
                "totalLogBlocks": 0,
                "totalCorruptLogBlock": 0,
                "totalRollbackBlocks": 0,
                "fileSizeInBytes": w.file_size_bytes,
            }
            if layout is TimelineLayout.V1:
                stat.update({"tempPath": None, "minEventTime": None, "maxEventTime": None})
            out.setdefault(w.partition_path, []).append(stat)
        return out

    def to_dict(self, layout: TimelineLayout, action: Action) -> dict[str, Any]:
        d: dict[str, Any] = {
            "partitionToWriteStats": self.partition_to_write_stats(layout),
            "compacted": False,
            "extraMetadata": self.extra_metadata(),
            "operationType": self.operation_type,
        }
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
    def from_dict(cls, d: Mapping[str, Any], what: str = "commit metadata") -> CommitMetadata:
        try:
            writes: list[FileWrite] = []
            for partition, stats in (d.get("partitionToWriteStats") or {}).items():
                for s in stats or ():
                    writes.append(
                        FileWrite(
                            partition_path=s.get("partitionPath")
                            if s.get("partitionPath") is not None
                            else partition,
                            file_id=s["fileId"],
                            path=s["path"],
                            num_writes=int(s.get("numWrites") or 0),
                            file_size_bytes=int(s.get("fileSizeInBytes") or 0),
                            prev_commit=s.get("prevCommit") or "null",
                            num_inserts=int(s.get("numInserts") or 0),
                            total_write_bytes=int(s.get("totalWriteBytes") or 0),
                        )
                    )
            extra = {k: v for k, v in dict(d.get("extraMetadata") or {}).items() if v is not None}
            schema = extra.pop(SCHEMA_KEY, "") or ""
            replaced = {
                p: tuple(ids or ()) for p, ids in (d.get("partitionToReplaceFileIds") or {}).items()
            }
            texts = [schema, *extra, *extra.values(), *replaced]
            texts += [i for ids in replaced.values() for i in ids]
            texts += [
                x for w in writes for x in (w.partition_path, w.file_id, w.path, w.prev_commit)
            ]
            if not all(isinstance(t, str) for t in texts):
                raise TypeError("paths, file ids, schema and extraMetadata must be strings")
            return cls(
                operation_type=str(d.get("operationType") or "UNKNOWN"),
                writes=tuple(writes),
                replaced_file_ids=replaced,
                schema=schema,
                extra=extra,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CorruptTableError(f"{what} is malformed: {e!r}") from e

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
        if not data:
            raise CorruptTableError(
                f"{source} is empty (0 bytes); a completed instant needs its metadata"
            )
        if layout is TimelineLayout.V1 or data[:1] == b"{":
            try:
                d = json.loads(data.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise CorruptTableError(f"{source} is not valid JSON commit metadata: {e}") from e
            if not isinstance(d, dict):
                raise CorruptTableError(f"{source} is not a JSON object")
            return cls.from_dict(d, source)
        return cls.from_dict(_avro_record(data, source), source)

    # -- convenience -------------------------------------------------------------------------

    @property
    def total_records(self) -> int:
        return sum(w.num_writes for w in self.writes)

    def partitions(self) -> tuple[str, ...]:
        return tuple(sorted({w.partition_path for w in self.writes}))


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
