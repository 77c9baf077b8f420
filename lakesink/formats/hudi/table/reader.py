"""lakesink's own reader of its Hudi tables: snapshot, time travel and incremental queries
over the file-system view, returning what hudi-rs returns (rows of completed instants only)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lakesink.engine.evolution import conform, unify
from lakesink.errors import CorruptTableError, InstantArchivedError, SchemaMismatchError
from lakesink.formats.hudi.table.archive import load_archived_view
from lakesink.formats.hudi.table.avro_schema import META_SCHEMA
from lakesink.formats.hudi.table.file_group import FileSlice
from lakesink.formats.hudi.table.hudi_table import HudiTable, _format_partition_value
from lakesink.formats.hudi.table.log_file import is_log_file_name
from lakesink.formats.hudi.table.merge_on_read import merge_slice
from lakesink.formats.hudi.table.view import (
    FileSystemView,
    IncrementalOrder,
    active_commits_and_base,
    incremental_slices,
)
from lakesink.protocol.instant import InstantTime, TimelineLayout

PartitionFilter = Mapping[str, Any]


class TableReader:
    """Reads one table. Each call reads the timeline afresh."""

    def __init__(self, table: HudiTable) -> None:
        self.table = table

    # -- queries -----------------------------------------------------------------------------

    def snapshot(
        self, columns: Sequence[str] | None = None, partition_filter: PartitionFilter | None = None
    ) -> pa.Table:
        """Every row of the latest completed state."""
        view = FileSystemView(self.table)
        return self._read(view.latest_base_files(), columns, partition_filter, None)

    def as_of(
        self,
        instant_time: InstantTime | str,
        columns: Sequence[str] | None = None,
        partition_filter: PartitionFilter | None = None,
    ) -> pa.Table:
        """Time travel: the rows of completed instants requested at or before `instant_time`."""
        view = FileSystemView(self.table, InstantTime(str(instant_time)))
        return self._read(view.latest_base_files(), columns, partition_filter, None)

    def incremental(
        self,
        start_exclusive: InstantTime | str,
        end_inclusive: InstantTime | str | None = None,
        columns: Sequence[str] | None = None,
        partition_filter: PartitionFilter | None = None,
        *,
        by: IncrementalOrder | None = None,
    ) -> pa.Table:
        """Rows committed in (start, end]. `by` defaults to completion time for table version 8
        (the order commits became visible, safe with concurrent writers) and to instant time
        for version 6. hudi-rs 0.5 always uses instant time; both agree for a single writer."""
        timeline = self.table.timeline()
        if by is None:
            by = "completion" if self.table.layout is TimelineLayout.V2 else "requested"
        start = InstantTime(str(start_exclusive))
        archived = load_archived_view(self.table.storage)
        if archived is not None:
            reach = archived.completed_upto if by == "completion" else archived.upto
            if start < reach:
                raise InstantArchivedError(
                    f"rows committed up to {reach} ({by} time) of table "
                    f"{self.table.config.name!r} are archived; an incremental read can start "
                    f"at {reach} or later (read a snapshot for older rows)"
                )
        commits, _ = active_commits_and_base(timeline)
        if end_inclusive is None:
            last = timeline.last_completed()
            if last is None or not commits:
                return self._read([], columns, partition_filter, frozenset())
            end = (
                (last.completion_time or last.time)
                if by == "completion"
                else max(i.time for i, _ in commits)
            )
        else:
            end = InstantTime(str(end_inclusive))
        slices, times = incremental_slices(commits, start, end, by)
        return self._read(slices, columns, partition_filter, times)

    # -- internals ---------------------------------------------------------------------------

    def partition_values(self, partition_path: str) -> dict[str, str]:
        """Column → value (as text) of a partition folder."""
        fields = self.table.config.partition_fields
        if not fields:
            return {}
        parts = partition_path.split("/")
        if len(parts) != len(fields):
            raise CorruptTableError(
                f"partition {partition_path!r} does not have one folder per partition column "
                f"({', '.join(fields)})"
            )
        out: dict[str, str] = {}
        for f, part in zip(fields, parts, strict=True):
            if self.table.config.hive_style_partitioning:
                name, sep, value = part.partition("=")
                if not sep or name != f:
                    raise CorruptTableError(f"partition folder {part!r} is not '{f}=<value>'")
                out[f] = value
            else:
                out[f] = part
        return out

    def _keep_partition(self, partition_path: str, flt: PartitionFilter | None) -> bool:
        if not flt:
            return True
        values = self.partition_values(partition_path)
        for col, wanted in flt.items():
            if col not in values:
                raise SchemaMismatchError(
                    f"partition filter column {col!r} is not a partition column; the table is "
                    f"partitioned by {', '.join(self.table.config.partition_fields) or 'nothing'}"
                )
            options = wanted if isinstance(wanted, list | tuple | set | frozenset) else [wanted]
            if values[col] not in {_format_partition_value(v) for v in options}:
                return False
        return True

    def _read(
        self,
        slices: Iterable[FileSlice],
        columns: Sequence[str] | None,
        partition_filter: PartitionFilter | None,
        commit_times: frozenset[InstantTime] | None,
    ) -> pa.Table:
        chosen = [s for s in slices if self._keep_partition(s.partition_path, partition_filter)]
        chosen.sort(key=lambda s: (s.partition_path, s.file_id))
        tables: list[tuple[InstantTime, pa.Table]] = []
        for s in chosen:
            t = self._read_base(s) if s.has_base_file else None
            if s.log_paths:
                t = merge_slice(self.table, t, s.log_paths)
            assert t is not None  # a slice has a base file or log files
            if commit_times is not None:
                allowed = pa.array(sorted(t.value for t in commit_times), pa.string())
                t = t.filter(pc.is_in(t.column("_hoodie_commit_time"), value_set=allowed))
            tables.append((s.instant_time, t))
        result = _in_one_schema(tables) if tables else self._empty()
        if columns is not None:
            missing = [c for c in columns if c not in result.column_names]
            if missing:
                raise SchemaMismatchError(
                    f"column {missing[0]!r} is not in table {self.table.config.name!r}; columns "
                    f"are {', '.join(result.column_names)}"
                )
            result = result.select(list(columns))
        return result

    def _read_base(self, s: FileSlice) -> pa.Table:
        path = f"{self.table.uri}/{s.path}"
        fs, root = self.table.storage.arrow()
        try:
            return pq.read_table(f"{root}/{s.path}", filesystem=fs, partitioning=None)
        except FileNotFoundError:
            raise CorruptTableError(
                f"base file {path} of instant {s.instant_time} is missing; the table "
                "references a file that is gone"
            ) from None
        except (pa.ArrowInvalid, OSError) as e:
            raise CorruptTableError(f"base file {path} cannot be read: {e}") from e

    def _empty(self) -> pa.Table:
        timeline = self.table.timeline()
        archived = load_archived_view(self.table.storage)
        newest_first = reversed(timeline.in_completion_order(timeline.completed_data_instants()))
        candidates = itertools.chain(
            (w.path for inst in newest_first for w in timeline.commit_metadata(inst).writes),
            (
                s.path
                for s in sorted(
                    archived.slices if archived is not None else (),
                    key=lambda s: s.instant_time,
                    reverse=True,
                )
            ),
        )
        for rel in candidates:
            if is_log_file_name(rel.rsplit("/", 1)[-1]):
                continue  # the schema of a base file is enough
            if self.table.storage.exists(rel):
                fs, root = self.table.storage.arrow()
                return pq.read_schema(f"{root}/{rel}", filesystem=fs).empty_table()
        return META_SCHEMA.empty_table()


def _in_one_schema(tables: Sequence[tuple[InstantTime, pa.Table]]) -> pa.Table:
    """The slices' rows (in their order) as one table. Files written before a schema change
    keep their schema: all are read in the unified one, whose columns are in the order the
    table's schema evolved in (the schemas taken oldest slice first)."""
    schemas: list[pa.Schema] = []
    for _, t in sorted(tables, key=lambda x: x[0]):
        if not any(t.schema == s for s in schemas):
            schemas.append(t.schema)
    if len(schemas) == 1:
        return pa.concat_tables([t for _, t in tables])
    schema = unify(schemas)
    return pa.concat_tables([conform(t, schema) for _, t in tables])
