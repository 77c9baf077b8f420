"""Merge-on-read tables written by hand for the tests: a base file per partition, then
deltacommits of log files (Parquet data blocks and delete blocks) through
lakesink.formats.hudi.table.log_file, and `fold`, the rows Hudi's readers return for them (a
plain-dict reference). Used by tests/unit/test_hudi_log_files.py and the Java Hudi check."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lakesink.formats.hudi.table.avro_schema import avro_schema_for, with_meta_columns
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.log_file import (
    DeleteRecord,
    DeltaWrite,
    OrderingBranch,
    log_rows,
    write_log_file,
)
from lakesink.formats.hudi.table.merge_on_read import encode_delta_commit
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.view import FileSystemView
from lakesink.formats.hudi.table.writer import BaseFileWriter
from lakesink.protocol.instant import Action, InstantTime
from lakesink.protocol.write_status import FileWrite

SCHEMA = pa.schema(
    [("id", pa.int64()), ("day", pa.string()), ("ts", pa.int64()), ("v", pa.string())]
)
DATA = SCHEMA.names
AVRO = avro_schema_for(with_meta_columns(SCHEMA), "t_record")


def instant(n: int) -> InstantTime:
    return InstantTime(f"20240101000000{n:03d}")


def day_of(key: int) -> str:
    return "d2" if key >= 100 else f"d{key % 2}"


# (key, op, ts, value); op "u" upsert, "d" delete with ts, "x" delete without ordering value
Version = tuple[int, str, int | None, str]


def data_rows(versions: Sequence[Version]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"id": k, "day": day_of(k), "ts": ts, "v": v} for k, op, ts, v in versions if op == "u"],
        schema=SCHEMA,
    )


class MorTable:
    """A merge-on-read table written by hand: a base commit, then deltacommits of log files."""

    def __init__(self, path: Path, version: int, ordering: str | None) -> None:
        config = TableConfig(
            "t",
            ("id",),
            ("day",),
            version=version,  # type: ignore[arg-type]
            table_type="MERGE_ON_READ",
            ordering_field=ordering,
        )
        self.table = HudiTable.create(path, config)
        self.n = 0
        self.groups: dict[str, tuple[str, str]] = {}  # partition -> (file id, base file name)

    def base(self, versions: Sequence[Version]) -> None:
        """The first deltacommit: base files, one file group per partition."""
        t = self._next()
        timeline = self.table.timeline()
        inst = timeline.begin(Action.DELTA_COMMIT, t)
        writes: list[FileWrite] = []
        rows = data_rows(versions)
        for day in sorted(set(rows.column("day").to_pylist())):
            part = rows.filter(pc.equal(rows.column("day"), day))
            w = BaseFileWriter(self.table, f"day={day}", t, "0-1-0")
            w.write(part)
            (done,) = w.close()
            writes.append(done)
            self.groups[done.partition_path] = (done.file_id, done.path.rsplit("/", 1)[-1])
        md = CommitMetadata("UPSERT", tuple(writes), schema=AVRO)
        timeline.publish(inst, md)

    def delta(self, versions: Sequence[Version], *, new_group_id: str | None = None) -> None:
        """One deltacommit: per partition one log file of upserts and deletes (`new_group_id`:
        the file id of a file group of log files only, for partitions without a group)."""
        t = self._next()
        timeline = self.table.timeline()
        inst = timeline.begin(Action.DELTA_COMMIT, t)
        view = FileSystemView(self.table)
        deltas: list[DeltaWrite] = []
        ordering = self.table.config.ordering_field
        for day in sorted({day_of(k) for k, *_ in versions}):
            partition = f"day={day}"
            mine = [x for x in versions if day_of(x[0]) == day]
            if partition not in self.groups:
                assert new_group_id is not None
                self.groups[partition] = (new_group_id, "")
            file_id, base_name = self.groups[partition]
            latest = [s for s in view.latest_base_files([partition]) if s.file_id == file_id]
            base_instant = latest[0].instant_time if latest and latest[0].has_base_file else None
            previous = latest[0].log_paths if latest else ()
            if latest and not latest[0].has_base_file:
                base_instant = latest[0].instant_time
            data = log_rows(
                self.table, data_rows(mine), partition, file_id, t, 0, with_meta_columns(SCHEMA)
            )
            deletes = [
                DeleteRecord(str(k), partition, ts, OrderingBranch.LONG)
                if op == "d" and ordering is not None and ts is not None
                else DeleteRecord(str(k), partition)  # Hudi's default: no ordering value
                for k, op, ts, _ in mine
                if op in ("d", "x")
            ]
            deltas.append(
                write_log_file(
                    self.table,
                    partition,
                    file_id,
                    t,
                    "0-2-0",
                    AVRO,
                    rows=data,
                    deletes=deletes,
                    base_file=base_name,
                    base_instant=base_instant,
                    previous_logs=previous,
                )
            )
        md = CommitMetadata("UPSERT", tuple(d.write for d in deltas), schema=AVRO)
        encoded = encode_delta_commit(self.table.layout, inst, md, deltas)
        timeline.publish(inst, md, encoded=encoded)

    def _next(self) -> InstantTime:
        self.n += 1
        return instant(self.n)


def fold(batches: Sequence[Sequence[Version]], ordering: str | None) -> list[dict[str, Any]]:
    """The rows of a slice whose base file holds `batches[0]` and whose log files the other
    batches, in order, as Hudi merges them: the log's versions of a key first, each later one
    winning when its ordering value is at least the held one's, then the log's winner over the
    base row on the same rule. Without an ordering field the later version wins. A delete "x"
    is Hudi's delete without an ordering value: in the log it wins over every earlier
    version, a later upsert wins over it, a later delete changes nothing, and as the log's winner
    it removes the base row."""

    def unordered(v: Version) -> bool:
        return ordering is not None and v[1] == "x"

    def wins(new: Version, held: Version | None) -> bool:
        if held is None or ordering is None or unordered(new):
            return True
        if unordered(held):  # a delete of a key it holds changes nothing
            return new[1] == "u"
        return new[2] >= held[2]  # type: ignore[operator]

    base = {v[0]: v for v in batches[0]}
    log: dict[int, Version] = {}
    for batch in batches[1:]:
        for v in batch:
            if wins(v, log.get(v[0])):
                log[v[0]] = v
    rows = []
    for key in base.keys() | log.keys():
        held, latest = base.get(key), log.get(key)
        winner = latest if latest is not None and wins(latest, held) else held
        assert winner is not None
        if winner[1] == "u":
            rows.append({"id": key, "day": day_of(key), "ts": winner[2], "v": winner[3]})
    return sorted(rows, key=lambda r: r["id"])
