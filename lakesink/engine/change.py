"""The table change: the one value the commit engine passes to a format to commit.

A `TableChange` says what a commit does to a table, in no format's terms: the operation, the
files written, the file groups replaced, the schema of the rows, and the writer's state
(`extra`: the keys of lakesink.engine.writer_state). Each format encodes it into its own
metadata (Hudi: `lakesink.formats.hudi.table.metadata.CommitMetadata`, the completed commit
file; Iceberg: the snapshot summary and the manifests of the described data files).

`to_dict`/`from_dict` are the change's portable form, the one the async committer's pending
store keeps (lakesink.engine.async_commit): its shape is Hudi's version-1 JSON commit
metadata, kept as it was when the pending store was defined. It is an on-disk contract (golden
entries in tests/golden/pending): never change a key or the order of keys.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Self

from lakesink.engine.schema import NO_SCHEMA, TableSchema
from lakesink.errors import CorruptTableError
from lakesink.protocol.write_status import FileWrite

SCHEMA_KEY = "schema"
"""The key of the schema in the portable form's extra map (so `extra` may not use it)."""


def _frozen_map(m: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(m))


@dataclass(frozen=True)
class TableChange:
    """What one commit changes: the files it wrote, the file groups it replaced (partition ->
    file ids), the schema of its rows (lakesink.engine.schema: the Arrow schema, the format's
    field ids and its encoded text) and the writer's state. A schema given as text (a
    format's encoding read back from disk) is taken as `TableSchema.from_text`."""

    operation_type: str
    writes: tuple[FileWrite, ...] = ()
    replaced_file_ids: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    schema: TableSchema = NO_SCHEMA
    extra: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "schema", TableSchema.of(self.schema))
        object.__setattr__(self, "writes", tuple(self.writes))
        object.__setattr__(
            self,
            "replaced_file_ids",
            _frozen_map({p: tuple(ids) for p, ids in self.replaced_file_ids.items()}),
        )
        object.__setattr__(self, "extra", _frozen_map(self.extra))
        if SCHEMA_KEY in self.extra:
            raise ValueError(f"extra metadata must not use the reserved key {SCHEMA_KEY!r}")

    # -- the portable form (Hudi's field names) ---------------------------------------------

    def extra_metadata(self) -> dict[str, str]:
        """`extra` with the schema under `SCHEMA_KEY` (when there is one)."""
        out = dict(self.extra)
        if self.schema:
            out[SCHEMA_KEY] = self.schema.encode()
        return out

    def write_stats(self, *, legacy_fields: bool = True) -> dict[str, list[dict[str, Any]]]:
        """The writes grouped by partition, one stat each. `legacy_fields`: with the fields
        version-1 commit files carry (tempPath, min/maxEventTime, all null)."""
        out: dict[str, list[dict[str, Any]]] = {}
        for w in self.writes:
            stat: dict[str, Any] = {
                "fileId": w.file_id,
                "path": w.path,
                "prevCommit": w.prev_commit,
                "numWrites": w.num_writes,
                "numDeletes": w.num_deletes,
                "numUpdateWrites": w.num_update_writes,
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
            if legacy_fields:
                stat.update({"tempPath": None, "minEventTime": None, "maxEventTime": None})
            out.setdefault(w.partition_path, []).append(stat)
        return out

    def base_dict(self, *, legacy_fields: bool = True) -> dict[str, Any]:
        """The keys every encoding starts with, in their on-disk order."""
        return {
            "partitionToWriteStats": self.write_stats(legacy_fields=legacy_fields),
            "compacted": False,
            "extraMetadata": self.extra_metadata(),
            "operationType": self.operation_type,
        }

    def to_dict(self) -> dict[str, Any]:
        """The portable form. Only a data commit has one: a change that replaces file groups
        (a clustering) is never handed to another process."""
        if self.replaced_file_ids:
            raise ValueError("only a replacecommit may replace file groups")
        return self.base_dict()

    def to_json(self) -> str:
        """The portable form as the pending store keeps it (two-space indented JSON)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], what: str = "commit metadata") -> Self:
        """Parse the portable form (or a Hudi commit's dict); CorruptTableError naming `what`
        when it is malformed."""
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
                            num_update_writes=int(s.get("numUpdateWrites") or 0),
                            num_deletes=int(s.get("numDeletes") or 0),
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
                schema=TableSchema.from_text(schema),
                extra=extra,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CorruptTableError(f"{what} is malformed: {e!r}") from e

    @classmethod
    def from_json_bytes(cls, data: bytes, what: str = "commit metadata") -> Self:
        """Parse JSON text of the portable form; CorruptTableError naming `what` when it is
        empty, not JSON or malformed."""
        if not data:
            raise CorruptTableError(
                f"{what} is empty (0 bytes); a completed instant needs its metadata"
            )
        try:
            d = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CorruptTableError(f"{what} is not valid JSON commit metadata: {e}") from e
        if not isinstance(d, dict):
            raise CorruptTableError(f"{what} is not a JSON object")
        return cls.from_dict(d, what)

    # -- convenience -------------------------------------------------------------------------

    @property
    def total_records(self) -> int:
        return sum(w.num_writes for w in self.writes)

    def partitions(self) -> tuple[str, ...]:
        return tuple(sorted({w.partition_path for w in self.writes}))
