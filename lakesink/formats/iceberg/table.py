"""An Iceberg table as the commit engine sees it: `IcebergTable`.

What the engine calls (the format interface, in the engine's words):
- `committed_offsets(writer_id)` / `last_commit(writer_id)`: the writer's offsets, read from the
  snapshot lineage (recovery walks back past other writers' snapshots);
- `begin(writer_id, ranges)` -> `IcebergAppend`: `stage(files)`, `commit(vtts_ms)` with the
  requirement, `rollback()` (delete the staged files);
- `commit_append(files, requirement)`: one fast append whose requirement — the writer's offsets
  in the current lineage are exactly the batch's start offsets — holds on the metadata the
  catalog commits on. The SQL catalog runs its commit in this process, so it validates the
  requirement itself (an `AssertWriterOffsets` beside pyiceberg's own assertions) on every
  retry after a concurrent commit. A REST server knows only the REST spec's requirements: the
  append asserts that `main` is still the snapshot the offsets were checked on
  (`assert-ref-snapshot-id`), the server refuses it when another commit moved `main`, and the
  table is refreshed and the offsets checked again. The outcome says whether the append was
  committed now, had landed earlier (our commit id found: a lost response), or was a replay of
  committed ranges;
- `schema()`, `write_context()` (for tasks), and the maintenance primitives
  `expire_snapshots` (keeping each writer's newest commit) and `remove_orphan_files`.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakesink.engine.evolution import EvolutionMode, evolve
from lakesink.errors import (
    CommitError,
    CommitStateUnknownError,
    CorruptTableError,
    FencedError,
    SchemaMismatchError,
    TableNotFoundError,
)
from lakesink.extras import require
from lakesink.formats.iceberg.datafiles import DataFileDescription, WriteContext, to_data_file
from lakesink.formats.iceberg.errors import CatalogUnavailableError, LostToConcurrentCommitError
from lakesink.formats.iceberg.evolution import (
    PlannedEvolution,
    plan_evolution,
    stage_schema,
    with_schema,
)
from lakesink.formats.iceberg.maintenance import referenced_files, remove_orphans
from lakesink.formats.iceberg.on_base import commit_unretried, require_main_unmoved, transaction
from lakesink.formats.iceberg.replan import commit_replanned
from lakesink.formats.iceberg.schema import (
    PartitionFieldSetting,
    check_compatible,
    iceberg_schema,
    partition_spec,
)
from lakesink.formats.iceberg.snapshots import (
    KEY_BACKFILL_ID,
    AppendRequirement,
    AppendVerdict,
    SnapshotInfo,
    WriterCommit,
    find_writer_commit,
    incarnation_key,
    last_commit_by_writer,
    parse_incarnation,
)
from lakesink.protocol.offsets import OffsetRange, WriterOffsets

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata

    from lakesink.formats.iceberg.rowdelta import RowDelta
    from lakesink.formats.iceberg.upsert import BucketRewrite

log = logging.getLogger(__name__)

__all__ = ["AppendResult", "CommitOutcome", "IcebergAppend", "IcebergTable"]


class CommitOutcome(Enum):
    """What `commit_append` did."""

    COMMITTED = "committed"
    """A new snapshot with the files and the writer's new offsets."""
    LANDED_EARLIER = "landed-earlier"
    """An earlier attempt of this commit landed (its response was lost): nothing more done."""
    REPLAYED = "replayed"
    """The batch's ranges were committed before under another commit id: nothing done."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    """The outcome of one append, the writer's offsets after it, the snapshot that holds them
    and how many catalog commits were tried."""

    outcome: CommitOutcome
    offsets: WriterOffsets
    snapshot_id: int | None
    attempts: int


class _RequirementNotMet(Exception):
    """Raised inside the catalog's commit by AssertWriterOffsets; deliberately not pyiceberg's
    CommitFailedException, so pyiceberg does not retry it: lakesink decides what it means."""


def _assert_writer_offsets_type() -> Any:
    """The pyiceberg requirement class, built on first use (pyiceberg is optional)."""
    global _ASSERT_CLASS
    if _ASSERT_CLASS is not None:
        return _ASSERT_CLASS
    from pyiceberg.table.update import ValidatableTableRequirement

    class AssertWriterOffsets(ValidatableTableRequirement):
        """The writer's offsets in the lineage of the metadata being committed on are the
        batch's start offsets (lakesink's AppendRequirement), checked by the catalog."""

        type: str = "lakesink-assert-writer-offsets"
        writer_id: str
        commit_id: str
        ranges: list[tuple[str, int, int, int]]

        def requirement(self) -> AppendRequirement:
            from lakesink.protocol.offsets import TopicPartition

            return AppendRequirement(
                self.writer_id,
                self.commit_id,
                tuple(OffsetRange(TopicPartition(t, p), s, e) for t, p, s, e in self.ranges),
            )

        def validate(self, base_metadata: TableMetadata | None) -> None:  # type: ignore[override]
            if base_metadata is None:
                raise _RequirementNotMet("the table has no metadata")
            snaps, current = snapshot_infos(base_metadata)
            verdict = self.requirement().evaluate(
                find_writer_commit(snaps, current, self.writer_id)
            )
            if verdict is not AppendVerdict.PROCEED:
                raise _RequirementNotMet(verdict.value)

    _ASSERT_CLASS = AssertWriterOffsets
    return AssertWriterOffsets


_ASSERT_CLASS: Any = None


class _IncarnationMoved(Exception):
    """Raised inside the catalog's commit by AssertWriterIncarnation: the table's incarnation
    of the writer id is not the one expected (found: `found`). Not a CommitFailedException, so
    pyiceberg does not retry it."""

    def __init__(self, found: int | None) -> None:
        super().__init__(f"incarnation {found}")
        self.found = found


def _assert_incarnation_type() -> Any:
    """The pyiceberg requirement that the table property `lakesink.writer.<id>.incarnation`
    holds `expected` (None: unset) in the metadata being committed on; built on first use."""
    global _INCARNATION_CLASS
    if _INCARNATION_CLASS is not None:
        return _INCARNATION_CLASS
    from pyiceberg.table.update import ValidatableTableRequirement

    class AssertWriterIncarnation(ValidatableTableRequirement):
        type: str = "lakesink-assert-writer-incarnation"
        writer_id: str
        expected: int | None

        def validate(self, base_metadata: TableMetadata | None) -> None:  # type: ignore[override]
            found = (
                parse_incarnation(base_metadata.properties, self.writer_id)
                if base_metadata is not None
                else None
            )
            if found != self.expected:
                raise _IncarnationMoved(found)

    _INCARNATION_CLASS = AssertWriterIncarnation
    return AssertWriterIncarnation


_INCARNATION_CLASS: Any = None


def snapshot_infos(metadata: TableMetadata) -> tuple[dict[int, SnapshotInfo], int | None]:
    """The snapshots of `metadata` as lineage-walk values, and the current snapshot's id."""
    out = {
        s.snapshot_id: SnapshotInfo(
            s.snapshot_id,
            s.parent_snapshot_id,
            int(s.sequence_number or 0),
            s.timestamp_ms,
            dict(s.summary.additional_properties) if s.summary is not None else {},
        )
        for s in metadata.snapshots
    }
    return out, metadata.current_snapshot_id


def _identifier(name: str | tuple[str, ...]) -> tuple[str, ...]:
    return tuple(name.split(".")) if isinstance(name, str) else name


class IcebergTable:
    """One Iceberg table in a catalog, with the operations lakesink's commit engine calls."""

    def __init__(
        self,
        catalog: Catalog,
        table: Table,
        *,
        max_attempts: int = 5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._catalog = catalog
        self._table = table
        self._max_attempts = max_attempts
        self._sleep = sleep
        # the schema of the rows a writer opened the table for (what its batches evolve the
        # table by, `plan_evolution`); None when opened to read
        self.rows: pa.Schema | None = None
        # schema.field.mapping's source names by column path: aliases in the name mapping
        self.aliases: Mapping[str, Sequence[str]] = {}

    # -- opening --------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        catalog: Catalog,
        name: str | tuple[str, ...],
        rows: pa.Schema | None = None,
        partition_fields: Sequence[PartitionFieldSetting] = (),
        *,
        location: str | None = None,
        create: bool = True,
        properties: dict[str, str] | None = None,
        evolution: EvolutionMode | None = None,
        identifier_fields: Sequence[str] = (),
        aliases: Mapping[str, Sequence[str]] | None = None,
        **kwargs: Any,
    ) -> IcebergTable:
        """The table `name` (`namespace.table`); created on first use from the Arrow schema
        of the decoded `rows` and the partition fields when `create`. An existing table must
        accept `rows` (SchemaMismatchError naming the column otherwise), or with `evolution`
        add-and-widen, be one they can evolve (SchemaEvolutionError naming the field: the
        batches' commits evolve it). `identifier_fields`: a new table's identifier fields (a
        table of keys; they must be non-nullable in `rows`). A new table gets a name mapping
        (`schema.name-mapping.default`) listing `aliases` (column path -> source names,
        schema.field.mapping) beside the column names: name_mapping.py."""
        require("pyiceberg", "Iceberg tables")
        from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError

        ident = _identifier(name)
        shown = ".".join(ident)
        try:
            table = _load(catalog, ident)
        except NoSuchTableError as e:
            if not create or rows is None:
                raise TableNotFoundError(
                    f"no Iceberg table {shown} in catalog {catalog.name!r}"
                ) from e
            schema = iceberg_schema(rows)
            if identifier_fields:
                from lakesink.formats.iceberg.keyed import with_identifier_fields

                schema = with_identifier_fields(schema, identifier_fields)
            spec = partition_spec(schema, partition_fields)
            # the ids the catalog gives the new table's fields, which the mapping names
            from pyiceberg.schema import assign_fresh_schema_ids

            from lakesink.formats.iceberg.name_mapping import (
                NAME_MAPPING_PROPERTY,
                name_mapping_json,
            )

            mapping = name_mapping_json(assign_fresh_schema_ids(schema), aliases)
            catalog.create_namespace_if_not_exists(ident[:-1])
            try:
                table = catalog.create_table(
                    ident,
                    schema=schema,
                    partition_spec=spec,
                    location=location,
                    properties={**(properties or {}), NAME_MAPPING_PROPERTY: mapping},
                )
                log.info("created Iceberg table %s at %s", shown, table.location())
            except TableAlreadyExistsError:  # another writer created it first
                table = _load(catalog, ident)
        if rows is not None and evolution == "add-and-widen":
            evolve(table.schema().as_arrow(), rows, evolution)
        elif rows is not None:
            try:
                check_compatible(table.schema(), rows, shown)
            except SchemaMismatchError as e:
                if evolution is None:
                    raise
                raise SchemaMismatchError(
                    f"{e} (schema.evolution is off: set schema.evolution = add-and-widen to "
                    "evolve the table with the batches)"
                ) from e
        out = cls(catalog, table, **kwargs)
        out.rows = rows
        out.aliases = dict(aliases or {})
        return out

    # -- reading state --------------------------------------------------------------------

    @property
    def name(self) -> str:
        return ".".join(self._table.name())

    @property
    def location(self) -> str:
        return self._table.location()

    @property
    def pyiceberg(self) -> Table:
        """The pyiceberg Table (scans, inspection)."""
        return self._table

    def refresh(self) -> None:
        """Reload the table's current metadata from the catalog."""
        self._table = _load(self._catalog, self._table.name())

    def schema(self) -> pa.Schema:
        """The table's current schema as Arrow."""
        return self._table.schema().as_arrow()

    def write_context(
        self, evolution: PlannedEvolution | None = None, *, widen_rows: bool = False
    ) -> WriteContext:
        """What tasks need to write data files for the current table version (with the
        `evolution` the batch's commit will make: its schema current, the rows conformed;
        `widen_rows`: without one, rows narrower than the table are conformed to it)."""
        # tasks need the schema, spec, properties and location, not the snapshot history
        # (which grows with every commit and would travel to every task)
        slim = self._table.metadata.model_copy(
            update={
                "snapshots": [],
                "snapshot_log": [],
                "metadata_log": [],
                "refs": {},
                "current_snapshot_id": None,
                "statistics": [],
                "partition_statistics": [],
            }
        )
        if evolution is not None:
            slim = with_schema(slim, evolution.schema)
        return WriteContext(
            self.name,
            slim.model_dump_json(),
            tuple(sorted(self._table.io.properties.items())),
            evolution.rows if evolution is not None else None,
            widen_rows=widen_rows and evolution is None,
        )

    def plan_evolution(self, rows: pa.Schema, mode: EvolutionMode) -> PlannedEvolution | None:
        """The schema change a batch of `rows` makes (see `formats/iceberg/evolution.py`)."""
        return plan_evolution(self._table, rows, mode, self.name)

    def last_commit(self, writer_id: str) -> WriterCommit | None:
        """The writer's newest commit in the current snapshot's lineage."""
        snaps, current = snapshot_infos(self._table.metadata)
        return find_writer_commit(snaps, current, writer_id)

    def backfill_snapshot(self, backfill_id: str) -> int | None:
        """The retained snapshot that committed backfill `backfill_id` (None: none did)."""
        for snapshot in self._table.metadata.snapshots:
            summary = snapshot.summary
            if summary is not None and summary.get(KEY_BACKFILL_ID) == backfill_id:
                return int(snapshot.snapshot_id)
        return None

    def committed_offsets(self, writer_id: str) -> WriterOffsets:
        """The writer's next offset of every partition it committed (empty if none)."""
        last = self.last_commit(writer_id)
        return last.offsets if last is not None else WriterOffsets.empty()

    def writer_incarnation(self, writer_id: str) -> int | None:
        """The newest incarnation claimed for `writer_id` (the table property
        `lakesink.writer.<id>.incarnation`), None when none was."""
        return parse_incarnation(self._table.metadata.properties, writer_id)

    # -- fencing --------------------------------------------------------------------------

    def claim_incarnation(self, writer_id: str) -> int:
        """Become the newest incarnation of `writer_id`: the table property
        `lakesink.writer.<id>.incarnation` goes from the value read (n, or unset) to n + 1 in
        one catalog commit that requires it still to be n, so two starts never get the same
        number; retried on a concurrent commit. From then on every append of an older
        incarnation is refused (`commit_append(..., incarnation=)`)."""
        require("pyiceberg", "Iceberg tables")
        from pyiceberg.catalog.sql import SqlCatalog
        from pyiceberg.exceptions import CommitFailedException

        if not isinstance(self._catalog, SqlCatalog):
            return self._claim_without_requirement(writer_id)
        assert_type = _assert_incarnation_type()
        for attempt in range(1, self._max_attempts * 4 + 1):
            if attempt > 1:
                self._sleep(min(0.02 * 2**attempt, 1.0))
            self.refresh()
            current = self.writer_incarnation(writer_id)
            claimed = (current or 0) + 1
            tx = transaction(self._table)
            try:
                tx._stage((), (assert_type(writer_id=writer_id, expected=current),))
                tx.set_properties({incarnation_key(writer_id): str(claimed)})
                tx.commit_transaction()
            except (CommitFailedException, _IncarnationMoved) as e:
                log.info(
                    "table %s: claiming incarnation %d of writer %s lost to a concurrent "
                    "commit (%s); trying again", self.name, claimed, writer_id, e,
                )  # fmt: skip
                continue
            self.refresh()
            log.info("table %s: writer %s claimed incarnation %d", self.name, writer_id, claimed)
            return claimed
        raise CommitError(
            f"table {self.name}: writer {writer_id!r} could not claim an incarnation "
            f"({self._max_attempts * 4} concurrent commits won); start it again"
        )

    def _claim_without_requirement(self, writer_id: str) -> int:
        """The claim on a catalog that cannot run lakesink's requirement inside its commit
        (REST: the spec has no requirement on a table property): n + 1 is set on the newest
        metadata. A start after another one fences it as on the SQL catalog; two starts at the
        same moment may both get n + 1 (their offsets requirement still lands each batch once)."""
        self.refresh()
        claimed = (self.writer_incarnation(writer_id) or 0) + 1
        tx = transaction(self._table)
        tx.set_properties({incarnation_key(writer_id): str(claimed)})
        tx.commit_transaction()
        self.refresh()
        log.info("table %s: writer %s claimed incarnation %d", self.name, writer_id, claimed)
        return claimed

    def _fenced(self, writer_id: str, own: int, found: int | None) -> FencedError:
        return FencedError(
            f"table {self.name}: writer {writer_id!r} incarnation {own} is fenced: the table's "
            f"incarnation of this writer id is now {found} (a newer start of the same writer "
            "id claimed it); this one commits nothing and must stop (two processes with the "
            "same writer.id?)"
        )

    def check_incarnation(self, writer_id: str, own: int) -> None:
        """FencedError naming both incarnations when the table's incarnation of `writer_id`
        (in the metadata loaded last) is not `own`."""
        found = self.writer_incarnation(writer_id)
        if found != own:
            raise self._fenced(writer_id, own, found)

    # -- committing -----------------------------------------------------------------------

    def begin(
        self, writer_id: str, ranges: Sequence[OffsetRange], commit_id: str | None = None
    ) -> IcebergAppend:
        """Start one batch's append: its requirement and a fresh commit id."""
        req = AppendRequirement(writer_id, commit_id or uuid.uuid4().hex, tuple(ranges))
        return IcebergAppend(self, req)

    def commit_append(
        self,
        files: Sequence[DataFileDescription],
        requirement: AppendRequirement,
        vtts_ms: int | None = None,
        *,
        incarnation: int | None = None,
        extra_summary: Mapping[str, str] | None = None,
        schema: Schema | None = None,
        rewrite: BucketRewrite | RowDelta | None = None,
    ) -> AppendResult:
        """One fast append of `files` with lakesink's summary (plus `extra_summary`, e.g. a
        backfill's id), if `requirement` holds; with `schema` (a batch's planned evolution),
        the schema update in the same catalog commit. With `rewrite` (a batch of a table of
        keys) an overwrite instead, that also removes the files the batch replaces, committed
        only on the snapshot where each bucket it rewrote was checked to hold exactly the files
        it read (CommitConflictError otherwise: the batch is written again).

        Retries (refreshing, re-checking) on pyiceberg's CommitFailedException and after a
        commit whose outcome is unknown. OffsetError when the writer's offsets moved
        elsewhere; CommitError when the retries ran out; CommitStateUnknownError when the last
        attempt's outcome stayed unknown (then the files must stay). `incarnation`: the
        writer's claimed incarnation (`claim_incarnation`); the catalog then also requires that
        the table's incarnation of the writer id is still this one, and FencedError naming both
        says a newer incarnation started (nothing is appended)."""
        require("pyiceberg", "Iceberg tables")
        from pyiceberg.catalog.sql import SqlCatalog
        from pyiceberg.exceptions import (
            CommitFailedException,
            CommitStateUnknownException,
            ValidationException,
        )

        # the SQL catalog commits in this process and can run lakesink's own requirement; any
        # other catalog (REST) is sent only the spec's requirements, the base snapshot among them
        in_catalog = isinstance(self._catalog, SqlCatalog)
        unknown: BaseException | None = None
        for attempt in range(1, self._max_attempts + 1):
            if attempt > 1:
                self._sleep(min(0.05 * 2**attempt, 2.0))
                try:
                    self.refresh()
                except CatalogUnavailableError as e:
                    if unknown is not None:
                        raise CommitStateUnknownError(
                            f"table {self.name}: commit {requirement.commit_id} may have "
                            "landed; the catalog cannot be read to tell"
                        ) from e
                    raise
            if incarnation is not None:
                self.check_incarnation(requirement.writer_id, incarnation)
            last = self.last_commit(requirement.writer_id)
            verdict = requirement.evaluate(last)
            if verdict is not AppendVerdict.PROCEED:
                assert last is not None
                outcome = (
                    CommitOutcome.LANDED_EARLIER
                    if verdict is AppendVerdict.LANDED
                    else CommitOutcome.REPLAYED
                )
                log.info(
                    "table %s writer %s commit %s: %s", self.name, requirement.writer_id,
                    requirement.commit_id, outcome.value,
                )  # fmt: skip
                return AppendResult(outcome, last.offsets, self._writer_snapshot(last), attempt)
            committed = last.offsets if last is not None else WriterOffsets.empty()
            summary = WriterCommit(
                requirement.writer_id,
                requirement.commit_id,
                requirement.end_offsets(committed),
                vtts_ms,
                incarnation,
            )
            try:
                properties = {**summary.to_summary(), **(extra_summary or {})}
                if rewrite is not None:
                    rewrite.check(self._table)  # on the snapshot the overwrite must land on
                    own = incarnation if in_catalog else None
                    self._overwrite_on_base(files, rewrite, properties, summary.writer_id, own)
                elif in_catalog:
                    self._append(files, requirement, summary, properties, incarnation, schema)
                else:
                    self._append_on_base(files, properties, schema)
            except _IncarnationMoved as e:
                raise self._fenced(requirement.writer_id, incarnation or 0, e.found) from None
            except _RequirementNotMet:
                continue  # the offsets moved under us: re-read and decide
            except (CommitFailedException, ValidationException) as e:
                # did not land; a ValidationException comes from pyiceberg's own retry when a
                # concurrent expiry removed the snapshot this append started from
                unknown = None
                log.info("table %s: commit failed (%s), retrying", self.name, e)
                continue
            except CommitStateUnknownException as e:
                unknown = e
                log.warning("table %s: commit state unknown (%s), checking", self.name, e)
                continue
            except Exception as e:
                if _is_connection_error(e):
                    unknown = e
                    log.warning("table %s: catalog failed during commit (%s)", self.name, e)
                    continue
                raise
            snap = self._table.metadata.current_snapshot_id
            log.info(
                "table %s writer %s commit %s: snapshot %s, %d files",
                self.name, requirement.writer_id, requirement.commit_id, snap, len(files),
            )  # fmt: skip
            return AppendResult(CommitOutcome.COMMITTED, summary.offsets, snap, attempt)
        if unknown is not None:
            raise CommitStateUnknownError(
                f"table {self.name}: commit {requirement.commit_id} has an unknown outcome "
                f"after {self._max_attempts} attempts; keep its files and look for the commit id"
            ) from unknown
        raise CommitError(
            f"table {self.name}: commit {requirement.commit_id} did not land in "
            f"{self._max_attempts} attempts (concurrent commits); retrying the batch is safe"
        )

    def _append(
        self,
        files: Sequence[DataFileDescription],
        requirement: AppendRequirement,
        summary: WriterCommit,
        properties: Mapping[str, str],
        incarnation: int | None = None,
        schema: Schema | None = None,
    ) -> None:
        assert_type = _assert_writer_offsets_type()
        check = assert_type(
            writer_id=requirement.writer_id,
            commit_id=requirement.commit_id,
            ranges=[
                (r.partition.topic, r.partition.partition, r.start, r.end)
                for r in requirement.ranges
            ],
        )
        version = self._table.metadata.format_version
        tx = transaction(self._table)
        # checked now against this base, and by the catalog against the metadata it commits on
        tx._stage((), (check,))
        if incarnation is not None:  # a zombie's append fails inside the catalog's commit
            tx._stage(
                (), (_assert_incarnation_type()(writer_id=summary.writer_id, expected=incarnation),)
            )
        if schema is not None:  # the schema update and the append: one catalog commit
            stage_schema(tx, schema, self.name, self.aliases)
        snapshot = tx.update_snapshot(snapshot_properties=dict(properties))
        with snapshot.fast_append() as append:
            for f in files:
                append.append_data_file(to_data_file(f, version))
        tx.commit_transaction()

    def _append_on_base(
        self,
        files: Sequence[DataFileDescription],
        properties: Mapping[str, str],
        schema: Schema | None = None,
    ) -> None:
        """The append for a catalog that cannot run lakesink's requirement (REST): it requires
        that `main` is still the snapshot the caller checked the writer's offsets on, so the
        server refuses it (CommitFailedException) when any other commit landed meanwhile."""
        metadata = self._table.metadata
        tx = transaction(self._table)
        require_main_unmoved(tx)
        if schema is not None:
            stage_schema(tx, schema, self.name, self.aliases)
        snapshot = tx.update_snapshot(snapshot_properties=dict(properties))
        with snapshot.fast_append() as append:
            for f in files:
                append.append_data_file(to_data_file(f, metadata.format_version))
        # pyiceberg retries a refused commit by moving the append onto the new head, which would
        # skip the offsets check: without that retry it raises instead, and the caller
        # refreshes and checks again
        commit_unretried(tx)

    def _overwrite_on_base(
        self,
        files: Sequence[DataFileDescription],
        rewrite: BucketRewrite | RowDelta,
        properties: Mapping[str, str],
        writer_id: str,
        incarnation: int | None,
    ) -> None:
        """One overwrite snapshot: `rewrite.removed` out, `files` in. It requires that `main`
        is still the snapshot the caller checked the offsets and the buckets on (any catalog
        refuses it otherwise, CommitFailedException, and the caller checks again on the new
        head), and on the SQL catalog also the writer's incarnation. pyiceberg's own retry,
        which would move it onto a new head unchecked, is kept out as in `_append_on_base`."""
        from pyiceberg.table.snapshots import Operation
        from pyiceberg.table.update.snapshot import _OverwriteFiles

        from lakesink.formats.iceberg.upsert import BucketRewrite

        metadata = self._table.metadata
        tx = transaction(self._table)
        require_main_unmoved(tx)
        if incarnation is not None:
            tx._stage((), (_assert_incarnation_type()(writer_id=writer_id, expected=incarnation),))
        version = metadata.format_version
        if not isinstance(rewrite, BucketRewrite):  # merge-on-read: a row delta (rowdelta.py)
            rewrite.stage(tx, self._table.io, files, properties)
        else:
            producer = _OverwriteFiles(
                operation=Operation.OVERWRITE,
                transaction=tx,
                io=self._table.io,
                snapshot_properties=dict(properties),
            )
            with producer as overwrite:
                for d in rewrite.removed:
                    overwrite.delete_data_file(to_data_file(d, version))
                for f in files:
                    overwrite.append_data_file(to_data_file(f, version))
        commit_unretried(tx)

    def _writer_snapshot(self, commit: WriterCommit) -> int | None:
        snaps, current = snapshot_infos(self._table.metadata)
        return last_commit_by_writer(snaps, current).get(commit.writer_id)

    def abort(self, files: Sequence[DataFileDescription]) -> None:
        """Delete the data files of a batch that will not be committed. Only for a commit that
        did not land: never after CommitStateUnknownError."""
        io = self._table.io
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                io.delete(f.path)
        log.info("table %s: deleted %d files of an aborted batch", self.name, len(files))

    # -- maintenance ----------------------------------------------------------------------

    def expire_snapshots(
        self, older_than_ms: int, *, summary: dict[str, str] | None = None
    ) -> list[int]:
        """Expire snapshots older than `older_than_ms` (epoch ms), except the current one and
        each writer's newest commit (so its offsets stay readable), in one catalog commit that
        also records `summary` (what ran) in the table property `lakesink.maintenance.last-expire`.
        Decided on fresh metadata and again after a concurrent commit (lakesink.formats.iceberg.
        replan). Returns the expired ids. Only metadata changes; files no snapshot references go
        with orphan removal."""
        require("pyiceberg", "Iceberg tables")
        try:
            return commit_replanned(
                lambda: self._expire_once(older_than_ms, summary),
                attempts=self._max_attempts,
                what=f"table {self.name}: expire-snapshots",
                sleep=self._sleep,
            )
        except LostToConcurrentCommitError as e:
            raise CommitError(
                f"table {self.name}: expiring snapshots lost to concurrent commits "
                f"{self._max_attempts} times; run it again"
            ) from e

    def _expire_once(self, older_than_ms: int, summary: dict[str, str] | None) -> list[int]:
        """One attempt of `expire_snapshots`, planned on fresh metadata."""
        import json

        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.table.update import RemoveSnapshotsUpdate

        self.refresh()
        snaps, current = snapshot_infos(self._table.metadata)
        keep = set(last_commit_by_writer(snaps, current).values())
        keep.update(ref.snapshot_id for ref in self._table.metadata.refs.values())
        if current is not None:
            keep.add(current)
        doomed = sorted(
            s.snapshot_id
            for s in snaps.values()
            if s.timestamp_ms < older_than_ms and s.snapshot_id not in keep
        )
        if not doomed:
            return []
        record = {**(summary or {}), "expired": str(len(doomed))}
        try:
            tx = transaction(self._table)
            # one update staged directly: pyiceberg's ExpireSnapshots.by_ids deep-copies the
            # whole metadata twice per id (minutes for 1,000 snapshots); branch and tag heads
            # are kept above as it would keep them
            tx._stage((RemoveSnapshotsUpdate.model_validate({"snapshot-ids": doomed}),))
            tx.set_properties(
                {"lakesink.maintenance.last-expire": json.dumps(record, sort_keys=True)}
            )
            tx.commit_transaction()
        except (CommitFailedException, ValueError) as e:
            # a concurrent commit (or a concurrent expiry that removed one of ours)
            log.info("table %s: expiry lost to a concurrent commit (%s)", self.name, e)
            raise LostToConcurrentCommitError(
                f"table {self.name}: expiry lost to a concurrent commit"
            ) from e
        self.refresh()
        log.info("table %s: expired %d snapshots", self.name, len(doomed))
        return doomed

    def remove_orphan_files(
        self,
        older_than_s: float,
        *,
        now: float | None = None,
        storage_options: Any = None,
        in_flight: Sequence[str] = (),
    ) -> list[str]:
        """Delete files under the table's location that no retained snapshot or metadata file
        references, that no in-flight batch names (`in_flight`: data files written but not yet
        committed) and that are older than the safety window `older_than_s` (so files of a batch
        still being written or committed are spared). What the table references is read again
        after the listing, so a batch that committed meanwhile keeps its files. Returns the
        deleted locations."""
        self.refresh()
        keep = referenced_files(self._table)

        seen = self._table.metadata_location

        def recheck() -> set[str]:
            self.refresh()
            return keep if self._table.metadata_location == seen else referenced_files(self._table)

        return remove_orphans(
            self.location,
            keep,
            older_than_s=older_than_s,
            now=time.time() if now is None else now,
            storage_options=storage_options,
            in_flight=in_flight,
            recheck=recheck,
        )


@dataclass
class IcebergAppend:
    """One batch's append: staged files, then commit (with the requirement) or rollback."""

    table: IcebergTable
    requirement: AppendRequirement
    files: list[DataFileDescription] = field(default_factory=list)

    def stage(self, files: Sequence[DataFileDescription]) -> None:
        self.files.extend(files)

    def commit(self, vtts_ms: int | None = None) -> AppendResult:
        return self.table.commit_append(self.files, self.requirement, vtts_ms)

    def rollback(self) -> None:
        self.table.abort(self.files)
        self.files.clear()


def _load(catalog: Catalog, ident: tuple[str, ...]) -> Table:
    """Load a table; a corrupt metadata file is CorruptTableError naming it, an unreachable
    catalog CatalogUnavailableError."""
    from pyiceberg.exceptions import NoSuchTableError, ValidationError

    shown = ".".join(ident)
    try:
        return catalog.load_table(ident)
    except NoSuchTableError:
        raise
    except (ValidationError, ValueError, UnicodeDecodeError, EOFError) as e:
        where = _metadata_location(catalog, ident) or "its metadata file"
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CorruptTableError(
            f"Iceberg table {shown}: {where} cannot be read ({first}); restore it from a "
            "backup or point the catalog at the previous metadata file"
        ) from e
    except Exception as e:
        if _is_connection_error(e):
            raise CatalogUnavailableError(
                f"Iceberg catalog {catalog.name!r} cannot be reached to load {shown}: "
                f"{type(e).__name__}"
            ) from e
        raise


def _metadata_location(catalog: Catalog, ident: tuple[str, ...]) -> str | None:
    """The metadata file a SQL catalog points at for `ident` (for error messages)."""
    engine = getattr(catalog, "engine", None)
    if engine is None:
        return None
    try:
        from pyiceberg.catalog.sql import IcebergTables
        from sqlalchemy import select
        from sqlalchemy.orm import Session

        with Session(engine) as session:
            row = session.execute(
                select(IcebergTables.metadata_location).where(
                    IcebergTables.table_namespace == ".".join(ident[:-1]),
                    IcebergTables.table_name == ident[-1],
                )
            ).first()
        return str(row[0]) if row is not None and row[0] else None
    except Exception:
        return None


def _is_connection_error(e: BaseException) -> bool:
    """A database or network failure (the catalog or store unreachable)."""
    module = type(e).__module__
    return isinstance(e, ConnectionError | TimeoutError) or module.startswith(
        ("sqlalchemy.exc", "requests", "urllib3", "psycopg")
    )
