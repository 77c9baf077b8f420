"""The Avro plan a pending compaction keeps in its `compaction.requested` file: Hudi's
`HoodieCompactionPlan`, one `HoodieCompactionOperation` per file slice with log files.

lakesink writes plan version 2, as Hudi 1.x does: the base file and the log files are named by
their file names alone (version 1 held absolute paths), the partition path beside them. The
plan is what a restart (or Java Hudi) executes: the slices it names, never more, so a log file
written after the plan was scheduled joins the slice the compaction creates.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import fastavro

from lakesink.errors import CorruptTableError
from lakesink.formats.hudi.table.plans import AVRO_NAMESPACE, STRING_MAP, optional_field
from lakesink.protocol.instant import InstantTime

PLAN_VERSION = 2
"""File names, not paths (Hudi's CompactionV2MigrationHandler)."""

_OPERATION = {
    "type": "record",
    "name": "HoodieCompactionOperation",
    "namespace": AVRO_NAMESPACE,
    "fields": [
        {"name": "baseInstantTime", "type": ["null", "string"]},
        optional_field("deltaFilePaths", {"type": "array", "items": "string"}),
        optional_field("dataFilePath", "string"),
        {"name": "fileId", "type": ["null", "string"]},
        optional_field("partitionPath", "string"),
        optional_field("metrics", {"type": "map", "values": "double"}),
        optional_field("bootstrapFilePath", "string"),
    ],
}
_STRATEGY = {
    "type": "record",
    "name": "HoodieCompactionStrategy",
    "namespace": AVRO_NAMESPACE,
    "fields": [
        optional_field("compactorClassName", "string"),
        optional_field("strategyParams", STRING_MAP),
        {"name": "version", "type": ["int", "null"], "default": 1},
    ],
}
PLAN_SCHEMA = fastavro.parse_schema(
    {
        "type": "record",
        "name": "HoodieCompactionPlan",
        "namespace": AVRO_NAMESPACE,
        "fields": [
            optional_field("operations", {"type": "array", "items": _OPERATION}),
            optional_field("extraMetadata", STRING_MAP),
            {"name": "version", "type": ["int", "null"], "default": 1},
            optional_field("strategy", _STRATEGY),
            {"name": "preserveHoodieMetadata", "type": ["boolean", "null"], "default": False},
            optional_field("missingSchedulePartitions", {"type": "array", "items": "string"}),
        ],
    }
)


@dataclass(frozen=True, slots=True)
class CompactionOperation:
    """One file slice a compaction merges into a new base file of the same file group."""

    partition_path: str
    file_id: str
    base_instant: InstantTime
    base_file: str
    """The base file's name; "" for a slice of log files only."""
    log_files: tuple[str, ...]
    """The log files' names, in the order readers apply them."""

    def relative(self, name: str) -> str:
        """A file of the slice as a path relative to the table root."""
        return f"{self.partition_path}/{name}" if self.partition_path else name


def compaction_plan_bytes(
    operations: Sequence[CompactionOperation], extra: dict[str, str] | None = None
) -> bytes:
    """The `compaction.requested` content for `operations` (an Avro container of one plan)."""
    record = {
        "operations": [
            {
                "baseInstantTime": op.base_instant.value,
                "deltaFilePaths": list(op.log_files),
                "dataFilePath": op.base_file or None,
                "fileId": op.file_id,
                "partitionPath": op.partition_path,
                "metrics": {"TOTAL_LOG_FILES": float(len(op.log_files))},
                "bootstrapFilePath": None,
            }
            for op in operations
        ],
        "extraMetadata": dict(extra or {}),
        "version": PLAN_VERSION,
        "strategy": None,
        # Hudi's flag for keeping the meta columns of the rows; lakesink always keeps them
        "preserveHoodieMetadata": True,
        "missingSchedulePartitions": None,
    }
    buf = io.BytesIO()
    fastavro.writer(buf, PLAN_SCHEMA, [record], codec="null")
    return buf.getvalue()


def read_compaction_plan(data: bytes, source: str) -> tuple[CompactionOperation, ...]:
    """The operations of a `compaction.requested` file; CorruptTableError naming `source` for
    anything else (plan version 1's absolute paths are cut to their file names)."""
    try:
        records = list(fastavro.reader(io.BytesIO(data)))
    except Exception as e:  # fastavro raises many unrelated types for garbage input
        raise CorruptTableError(f"{source} is not a HoodieCompactionPlan: {e}") from e
    if len(records) != 1 or not isinstance(records[0], dict):
        raise CorruptTableError(f"{source} holds {len(records)} records, expected 1 plan")
    out: list[CompactionOperation] = []
    for op in records[0].get("operations") or []:
        file_id, base = op.get("fileId"), op.get("baseInstantTime")
        if not file_id or not base:
            raise CorruptTableError(f"{source}: an operation without a file id or base instant")
        out.append(
            CompactionOperation(
                partition_path=str(op.get("partitionPath") or ""),
                file_id=str(file_id),
                base_instant=InstantTime(str(base)),
                base_file=_name(op.get("dataFilePath") or ""),
                log_files=tuple(_name(p) for p in op.get("deltaFilePaths") or ()),
            )
        )
    return tuple(out)


def _name(path: str) -> str:
    return str(path).rsplit("/", 1)[-1]
