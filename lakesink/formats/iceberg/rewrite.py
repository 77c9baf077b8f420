"""Rewriting small data files of an Iceberg table into target-size ones: one REPLACE snapshot.

A rewrite groups the live data files smaller than a threshold by partition, reads each group's
rows, writes them again as files of the target size, and commits one snapshot that removes the
old files and adds the new ones (operation `replace`: the table's rows do not change).

pyiceberg 0.12 has no public rewrite API; its `_OverwriteFiles` snapshot producer already does
the manifest work of a replace (keeps every manifest that does not hold a removed file, rewrites
those that do, requires each removed file to be live in the snapshot it commits on) and takes
part in pyiceberg's commit retry. `ReplaceFiles` is that producer with two changes, the only
private surface lakesink uses here:
- the snapshot's operation is `replace` (pyiceberg's summary totals only know append, overwrite
  and delete, so the totals are built as for an overwrite and the operation set afterwards);
- the concurrency check is Iceberg's RewriteFiles rule, not an overwrite's: files appended
  concurrently never conflict (they stay in the table), a removed file that is no longer live
  fails the commit (`ValidationException`), so the caller re-plans on fresh metadata.

Rows are read with pyiceberg's `ArrowScan` (field ids, schema evolution) and written with the
table's own data-file writer.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakesink.engine.tiers import tiered_selection
from lakesink.errors import ConfigError, CorruptTableError, UnsupportedTableError
from lakesink.extras import require
from lakesink.formats.iceberg.on_base import transaction

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

EMPTY: Mapping[str, str] = {}

__all__ = ["RewriteGroup", "RewriteOptions", "plan_rewrite", "replace_files"]


@dataclass(frozen=True, slots=True)
class RewriteOptions:
    """Which files a rewrite takes and what it writes."""

    small_file_bytes: int
    """Live data files smaller than this are rewritten."""
    target_file_bytes: int
    """The size the rewritten files are cut at (Iceberg's write.target-file-size-bytes)."""
    min_files: int = 2
    """A partition is rewritten only when it has at least this many small files."""
    tier_ratio: int = 0
    """Only files of one size tier together, a tier once it has this many (`engine.tiers`);
    0: every small file of a partition at once (a rewrite by hand)."""

    def __post_init__(self) -> None:
        for name in ("small_file_bytes", "target_file_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"rewrite {name} must be > 0, got {getattr(self, name)}")
        if self.min_files < 2:
            raise ConfigError(f"rewrite min_files must be >= 2, got {self.min_files}")
        if self.tier_ratio == 1 or self.tier_ratio < 0:
            raise ConfigError(f"rewrite tier_ratio must be 0 or >= 2, got {self.tier_ratio}")


@dataclass(frozen=True, slots=True)
class RewriteGroup:
    """Small data files of one partition that one output bin replaces."""

    spec_id: int
    partition: tuple[Any, ...]
    files: tuple[DataFile, ...]

    @property
    def size_bytes(self) -> int:
        return sum(int(f.file_size_in_bytes) for f in self.files)

    @property
    def record_count(self) -> int:
        return sum(int(f.record_count) for f in self.files)


def plan_rewrite(table: Table, options: RewriteOptions) -> list[RewriteGroup]:
    """The groups of the current snapshot's small data files worth rewriting: per partition of
    the default spec, files under the threshold (of the tiers due, with a tier ratio),
    bin-packed up to the target size, bins of two files or more. A table with delete files is
    refused (lakesink writes none)."""
    require("pyiceberg", "Iceberg tables")
    if table.metadata.current_snapshot_id is None:
        return []
    spec_id = table.metadata.default_spec_id
    by_partition: dict[tuple[Any, ...], list[DataFile]] = {}
    for task in table.scan().plan_files():
        if task.delete_files:
            raise UnsupportedTableError(
                f"table {'.'.join(table.name())}: data file {task.file.file_path} has delete "
                "files; rewriting data files with deletes is not supported"
            )
        f = task.file
        if f.spec_id != spec_id or int(f.file_size_in_bytes) >= options.small_file_bytes:
            continue
        key = tuple(f.partition[i] for i in range(len(f.partition)))
        by_partition.setdefault(key, []).append(f)
    groups: list[RewriteGroup] = []
    for key, files in sorted(by_partition.items(), key=lambda kv: repr(kv[0])):
        files.sort(key=lambda f: f.file_path)
        sizes = [int(f.file_size_in_bytes) for f in files]
        taken = tiered_selection(
            sizes,
            target=options.target_file_bytes,
            ratio=options.tier_ratio,
            min_files=options.min_files,
        )
        files = [files[i] for i in taken]
        if len(files) < options.min_files:
            continue
        current: list[DataFile] = []
        size = 0
        for f in files:
            if current and size + int(f.file_size_in_bytes) > options.target_file_bytes:
                if len(current) > 1:
                    groups.append(RewriteGroup(spec_id, key, tuple(current)))
                current, size = [], 0
            current.append(f)
            size += int(f.file_size_in_bytes)
        if len(current) > 1:
            groups.append(RewriteGroup(spec_id, key, tuple(current)))
    return groups


def _read_rows(table: Table, files: Sequence[DataFile]) -> Any:
    """The rows of `files` under the table's current schema, as one Arrow table."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.table import FileScanTask

    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    return scan.to_table([FileScanTask(f) for f in files])


ONE_FILE = str(2**62)
"""pyiceberg's write.target-file-size-bytes for "never cut": see `_write_rows`."""


def _write_rows(
    table: Table, rows: Any, size_on_disk: int, target_file_bytes: int
) -> list[DataFile]:
    """Write `rows` (read from files of `size_on_disk` bytes) as data files of the table of
    about `target_file_bytes` each: cut into equal slices by the size on disk. pyiceberg would
    cut by the Arrow batches' sizes in memory (`nbytes`: several times the compressed size,
    and the whole shared buffer for a slice), which wrote ~1 MB files out of 37 small ones:
    still small, so every later run rewrote the whole table again."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    metadata = table.metadata.model_copy(
        update={
            "properties": {**table.metadata.properties, "write.target-file-size-bytes": ONE_FILE}
        }
    )
    if not rows.num_rows:
        return []
    pieces = max(1, min(rows.num_rows, -(-size_on_disk // target_file_bytes)))
    step = -(-rows.num_rows // pieces)
    files = [
        f
        for start in range(0, rows.num_rows, step)
        for f in _dataframe_to_data_files(
            metadata, rows.slice(start, step), table.io, write_uuid=uuid.uuid4()
        )
    ]
    for f in files:
        f.spec_id = metadata.default_spec_id
    return files


def _replace_files_type() -> Any:
    """pyiceberg's overwrite producer made a replace (built on first use: pyiceberg is optional)."""
    global _REPLACE_CLASS
    if _REPLACE_CLASS is not None:
        return _REPLACE_CLASS
    from pyiceberg.table.snapshots import Operation, Summary
    from pyiceberg.table.update.snapshot import _OverwriteFiles

    class ReplaceFiles(_OverwriteFiles):
        """A REPLACE snapshot: removed data files swapped for added ones, rows unchanged."""

        def _summary(self, snapshot_properties: Mapping[str, str] = EMPTY) -> Any:
            built = super()._summary(dict(snapshot_properties))
            return Summary(operation=Operation.REPLACE, **built.additional_properties)

        def _validate_concurrency(self) -> None:
            # Iceberg's RewriteFiles rule: concurrent appends are kept and never conflict; a
            # removed file that is not live in the new base fails the commit, which
            # `_deleted_entries` checks on every attempt (ValidationException "Missing required
            # files to delete").
            return None

    _REPLACE_CLASS = ReplaceFiles
    return ReplaceFiles


_REPLACE_CLASS: Any = None


@dataclass(frozen=True, slots=True)
class ReplaceOutcome:
    """What one replace wrote and removed."""

    removed: tuple[str, ...]
    added: tuple[str, ...]
    rows: int
    snapshot_id: int | None


def replace_files(
    table: Table,
    groups: Sequence[RewriteGroup],
    options: RewriteOptions,
    summary: Mapping[str, str],
) -> ReplaceOutcome:
    """Rewrite `groups` and commit one REPLACE snapshot with `summary` in its summary.

    Raises pyiceberg's ValidationException when a removed file was deleted or rewritten
    concurrently (the new files are then deleted: re-plan on fresh metadata and try again) and
    CommitFailedException when pyiceberg's own retries ran out. The caller refreshes `table`."""
    require("pyiceberg", "Iceberg tables")
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    removed = [f for g in groups for f in g.files]
    added: list[DataFile] = []
    rows = 0
    committing = False
    try:
        for g in groups:
            data = _read_rows(table, g.files)
            if data.num_rows != g.record_count:
                raise CorruptTableError(
                    f"table {'.'.join(table.name())}: the data files of partition "
                    f"{g.partition} hold {data.num_rows} rows, their manifests say "
                    f"{g.record_count}; nothing was rewritten"
                )
            rows += data.num_rows
            added.extend(_write_rows(table, data, g.size_bytes, options.target_file_bytes))
        from pyiceberg.table.snapshots import Operation

        tx = transaction(table)
        # built as an overwrite (for pyiceberg's summary totals), published as a replace
        producer = _replace_files_type()(
            operation=Operation.OVERWRITE,
            transaction=tx,
            io=table.io,
            snapshot_properties=dict(summary),
        )
        with producer as replace:
            for f in removed:
                replace.delete_data_file(f)
            for f in added:
                replace.append_data_file(f)
        committing = True
        tx.commit_transaction()
    except Exception as e:
        # the new files go unless the commit may have landed (an unknown outcome keeps them)
        if not committing or isinstance(e, ValidationException | CommitFailedException):
            _delete_quietly(table, [f.file_path for f in added])
        raise
    snap = table.metadata.current_snapshot_id
    return ReplaceOutcome(
        tuple(f.file_path for f in removed), tuple(f.file_path for f in added), rows, snap
    )


def _delete_quietly(table: Table, paths: Sequence[str]) -> None:
    for p in paths:
        try:
            table.io.delete(p)
        except Exception as e:  # a leftover is an orphan, removed by remove-orphan-files
            log.warning("table %s: could not delete %s: %s", ".".join(table.name()), p, e)
