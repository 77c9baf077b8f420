"""Iceberg tables (lakesink/formats/iceberg/) as lakesink's configuration names them.

With `table.format=iceberg`, `table.path` is the warehouse (a local folder or an object-store
prefix), the table is `iceberg.namespace` . `table.name` in the catalog `iceberg.catalog.*`
(by default a SQLite file `catalog.db` in a local warehouse).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from lakesink.engine import writer_state as keys
from lakesink.engine.change import TableChange
from lakesink.engine.evolution import EvolutionMode
from lakesink.engine.format import CommitControl
from lakesink.errors import CommitError, ConfigError, CorruptTableError
from lakesink.formats.iceberg.catalog import CatalogSettings, open_catalog
from lakesink.formats.iceberg.datafiles import DataFileDescription
from lakesink.formats.iceberg.evolution import PlannedEvolution, schema_from_text
from lakesink.formats.iceberg.keyed import MUTATIONS_PROPERTY
from lakesink.formats.iceberg.schema import PartitionFieldSetting, parse_partition_spec
from lakesink.formats.iceberg.snapshots import (
    KEY_COMMIT_ID,
    KEY_LOST,
    KEY_RANGES,
    KEY_SKIPPED,
    KEY_WRITER_ID,
    AppendRequirement,
)
from lakesink.formats.iceberg.table import AppendResult, CommitOutcome, IcebergTable, snapshot_infos
from lakesink.protocol.conflicts import ConflictStrategy, Operation
from lakesink.protocol.instant import Action, Instant, InstantTime
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets
from lakesink.settings import Settings, parse_kv

if TYPE_CHECKING:
    import pyarrow as pa

    from lakesink.formats.iceberg.rowdelta import RowDelta
    from lakesink.formats.iceberg.upsert import BucketRewrite

log = logging.getLogger(__name__)

__all__ = [
    "VTTS_KEY",
    "IcebergFormat",
    "IcebergView",
    "catalog_settings_for",
    "dead_letter_coordinates_of",
    "dead_letter_identifier",
    "iceberg_identifier",
    "iceberg_partition_fields",
    "open_dead_letter_table",
    "open_iceberg_table",
    "open_keyed_table",
]


def _revealed(value: object) -> str | None:
    if value is None:
        return None
    reveal = getattr(value, "reveal", None)
    return str(reveal()) if callable(reveal) else str(value)


def catalog_settings_for(settings: Settings, *, create: bool = True) -> CatalogSettings:
    """The catalog of `settings`: `iceberg.catalog.*` with `table.path` as the warehouse and the
    `storage.*` settings to reach it. `create=False`: a missing SQLite catalog is an error
    (readers, status, audit)."""
    if settings.table.format != "iceberg":
        raise ConfigError(f"table.format={settings.table.format}: this needs table.format=iceberg")
    return CatalogSettings(
        warehouse=settings.table.path,
        kind=settings.iceberg.catalog_kind,
        uri=_revealed(settings.iceberg.catalog_uri),
        name=settings.iceberg.catalog_name,
        create=create,
        storage=settings.storage,
        properties=parse_kv(_revealed(settings.iceberg.catalog_properties)),
    )


def iceberg_identifier(settings: Settings) -> tuple[str, ...]:
    """`iceberg.namespace` . `table.name` as a catalog identifier."""
    namespace = tuple(p for p in settings.iceberg.namespace.split(".") if p)
    return (*namespace, settings.table.name)


def iceberg_partition_fields(settings: Settings) -> tuple[PartitionFieldSetting, ...]:
    """`iceberg.partition.spec`, or identity fields of `table.partition.by`."""
    texts: Sequence[str] = settings.iceberg.partition_spec or settings.table.partition_by
    return parse_partition_spec(texts)


def open_iceberg_table(
    settings: Settings, rows: pa.Schema | None = None, *, create: bool = True
) -> IcebergTable:
    """The Iceberg table of `settings`, created on first use from the decoded `rows` schema and the
    partition fields when `create` (TableNotFoundError otherwise)."""
    catalog = open_catalog(catalog_settings_for(settings, create=create))
    return IcebergTable.open(
        catalog,
        iceberg_identifier(settings),
        rows,
        iceberg_partition_fields(settings),
        create=create,
        evolution=settings.table.evolution,
        aliases=column_aliases(settings),
    )


def column_aliases(settings: Settings) -> dict[str, tuple[str, ...]]:
    """The source names schema.field.mapping renamed columns from, by column path: aliases in
    the name mapping of the tables lakesink creates (name_mapping.py)."""
    from lakesink.kafka.field_mapping import FieldMapping

    return FieldMapping(settings.table.field_mapping).aliases()


def open_keyed_table(settings: Settings, rows: pa.Schema) -> IcebergTable:
    """The table of keys of `settings` (write.operation upsert or cdc), created on first use from
    the decoded `rows` with the record key as identifier fields (required columns), a bucket
    partition field on a key column (`keyed_partition_fields`) and lakesink's properties. An
    existing table must be a table of keys with the same key, ordering and buckets (ConfigError
    naming both). Its schema is not evolved by the batches (schema.evolution is not applied)."""
    import pyarrow as pa

    from lakesink.formats.iceberg.keyed import (
        check_layout,
        keyed_partition_fields,
        keyed_properties,
        layout_of,
        required_keys,
    )
    from lakesink.protocol.mutation import CHANGE_COLUMNS

    mutation = settings.mutation
    key = tuple(settings.table.record_key_fields)
    ordering = mutation.ordering_column
    configured = iceberg_partition_fields(settings)
    # a change stream's operation and unavailable columns are never table columns
    columns = [f for f in rows if f.name not in CHANGE_COLUMNS]
    table = IcebergTable.open(
        open_catalog(catalog_settings_for(settings)),
        iceberg_identifier(settings),
        required_keys(pa.schema(columns), key),
        keyed_partition_fields(configured, key, mutation.bucket_count),
        properties=keyed_properties(ordering, settings.iceberg.write_mode),
        identifier_fields=key,
        aliases=column_aliases(settings),
    )
    layout = layout_of(table.pyiceberg.metadata, table.name)
    if layout is None:
        raise ConfigError(
            f"write.operation={mutation.operation}, but Iceberg table {table.name} was created "
            "for appends (it has no record key): write another table.name, or set "
            "write.operation=append"
        )
    check_layout(layout, key, ordering, configured, mutation.bucket_count, table.name)
    if layout.mode != settings.iceberg.write_mode:
        raise ConfigError(
            f"iceberg.write.mode={settings.iceberg.write_mode}, but table {table.name} was "
            f"created {layout.mode}: a table keeps the mode it was created with"
        )
    return table


DEAD_LETTER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def dead_letter_identifier(settings: Settings) -> tuple[str, ...]:
    """`iceberg.namespace` . `errors.deadletter.table`: with table.format=iceberg the dead-letter
    table is a table of the same catalog, named by the key (ConfigError for a path or an
    invalid name)."""
    name = str(settings.dead_letters.table or "")
    if not DEAD_LETTER_NAME.fullmatch(name):
        raise ConfigError(
            f"errors.deadletter.table={name!r}: with table.format=iceberg it names the "
            "dead-letter table in iceberg.namespace of the same catalog (letters, digits and "
            "_, e.g. events_dead_letters), not a path"
        )
    return (*iceberg_identifier(settings)[:-1], name)


def open_dead_letter_table(
    settings: Settings, rows: pa.Schema | None = None, *, create: bool = True
) -> IcebergTable:
    """The Iceberg dead-letter table of `settings` (unpartitioned), created on first use from the
    dead-letter `rows` schema when `create`."""
    catalog = open_catalog(catalog_settings_for(settings, create=create))
    return IcebergTable.open(catalog, dead_letter_identifier(settings), rows, (), create=create)


def dead_letter_coordinates_of(settings: Settings) -> list[tuple[str, int, int]]:
    """The Kafka coordinates of the records in the Iceberg dead-letter table, one per row
    (sorted; none if it or its catalog does not exist yet)."""
    from lakesink.errors import TableNotFoundError
    from lakesink.formats.iceberg.errors import CatalogNotFoundError

    try:
        table = open_dead_letter_table(settings, create=False)
    except (CatalogNotFoundError, TableNotFoundError):
        return []
    rows = (
        table.pyiceberg.scan(selected_fields=("kafka_topic", "kafka_partition", "kafka_offset"))
        .to_arrow()
        .to_pydict()
    )
    return sorted(
        zip(rows["kafka_topic"], rows["kafka_partition"], rows["kafka_offset"], strict=True)
    )


def committed_offsets_of(settings: Settings) -> WriterOffsets:
    """The configured writer's committed offsets in the configured Iceberg table (from the
    current snapshot's lineage); empty when the table or its catalog does not exist yet."""
    from lakesink.errors import TableNotFoundError
    from lakesink.formats.iceberg.errors import CatalogNotFoundError

    try:
        table = open_iceberg_table(settings, create=False)
    except (CatalogNotFoundError, TableNotFoundError):
        return WriterOffsets.empty()
    return table.committed_offsets(settings.writer_id)


def iceberg_table_names(settings: Settings) -> list[str]:
    """The names of the catalog's tables in iceberg.namespace (`settings`' table.path is the
    warehouse); none when the catalog or the namespace does not exist yet."""
    from pyiceberg.exceptions import NoSuchNamespaceError

    from lakesink.formats.iceberg.errors import CatalogNotFoundError

    try:
        catalog = open_catalog(catalog_settings_for(settings, create=False))
    except CatalogNotFoundError:
        return []
    namespace = tuple(p for p in settings.iceberg.namespace.split(".") if p)
    try:
        identifiers = catalog.list_tables(namespace)
    except NoSuchNamespaceError:
        return []
    return sorted(ident[-1] for ident in identifiers)


VTTS_KEY = "lakesink.vtts_ms"
"""The batch's valid-through timestamp (ms) in the commit metadata's extra map (Iceberg)."""


_TRANSACTION_ID = re.compile(r"(\d{17})-")


def _transaction_ms(summary: Mapping[str, str]) -> int:
    """The transaction id (ms) a snapshot's commit id starts with (`IcebergFormat.commit_id`);
    0 for a snapshot without one (a backfill's or another engine's commit)."""
    found = _TRANSACTION_ID.match(summary.get(KEY_COMMIT_ID, ""))
    if found is None:
        return 0
    try:
        return InstantTime(found.group(1)).to_epoch_ms()
    except CorruptTableError:  # 17 digits, not a date: no id of lakesink's
        return 0


def _ranges(metadata: TableChange) -> tuple[OffsetRange, ...]:
    """The ranges a commit ingested, from its metadata (`writer_state.RANGES_KEY`)."""
    raw = json.loads(metadata.extra.get(keys.RANGES_KEY, "[]"))
    return tuple(OffsetRange(TopicPartition.parse(k), s, e) for k, s, e in raw)


def _ranges_summary(metadata: TableChange) -> dict[str, str]:
    """A table of keys' commit records the ranges it ingested (and the spans it passed over),
    compact: its rows cannot tell (a later version of a key replaces them), and the fold audit
    must know every range the writer committed."""
    out = {KEY_RANGES: _compact(metadata.extra.get(keys.RANGES_KEY, "[]"))}
    if keys.SKIPPED_KEY in metadata.extra:
        out[KEY_SKIPPED] = _compact(metadata.extra[keys.SKIPPED_KEY])
    return out


def _compact(text: str) -> str:
    return json.dumps(json.loads(text), separators=(",", ":"))


class IcebergView:
    """The Iceberg table at its refreshed metadata: the requirements read the writer's offsets
    in the current lineage. Appends never conflict with each other; a writer without a lock
    proves it alive by its incarnation (`claimed`: the writer id and the incarnation it
    claimed), which must still be the table's."""

    def __init__(self, table: IcebergTable, claimed: tuple[str, int] | None = None) -> None:
        self.table = table
        self.claimed = claimed

    def committed_offsets(self, writer_id: str) -> WriterOffsets:
        return self.table.committed_offsets(writer_id)

    def backfill_committed(self, backfill_id: str) -> bool:
        return self.table.backfill_snapshot(backfill_id) is not None

    def check_conflicts(self, operation: Operation, strategy: ConflictStrategy) -> None:
        """Fast appends add files and remove none: no operation conflicts with them."""

    def check_alive(self, control: CommitControl, instant_time: InstantTime) -> None:
        """No lock, no heartbeat: FencedError when a newer incarnation of the writer id
        started (the catalog checks it again inside the commit)."""
        if self.claimed is not None:
            self.table.check_incarnation(*self.claimed)


class IcebergFormat:
    """`TableFormat` over an `IcebergTable`: one fast append per transaction through the
    catalog's optimistic commit, with the writer's offsets requirement checked by the catalog
    (`IcebergTable.commit_append`). The transaction id (instant time) leads the snapshot's
    commit id, so `is_published` finds the commit after a restart. After `claim`, every
    publish also requires the writer's claimed incarnation to be the table's (zombie fencing)."""

    def __init__(self, table: IcebergTable, *, clock_ms: Callable[[], int] | None = None) -> None:
        self.table = table
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._files: dict[str, list[DataFileDescription]] = {}
        self._last_issued = 0  # ms of the newest transaction id handed out
        self.claimed: tuple[str, int] | None = None  # (writer id, incarnation) after claim()
        # The writer whose transactions this format commits (set by its coordinator): two
        # writers may begin in the same millisecond, so a transaction id alone does not say
        # whose snapshot it is.
        self.writer_id: str | None = None
        self._field_ids: tuple[int, Mapping[str, int]] | None = None  # (schema id, ids)
        self._plans: dict[str, PlannedEvolution] = {}  # transaction id -> its schema change
        # transaction id -> the files a batch of a table of keys replaces (its overwrite)
        self._rewrites: dict[str, BucketRewrite | RowDelta] = {}
        # transaction id -> the tasks' reports it was staged from (a pending entry keeps them)
        self._rewrite_reports: dict[str, tuple[dict[str, Any], ...]] = {}

    def plan_evolution(
        self, instant_time: InstantTime, mode: EvolutionMode | None
    ) -> PlannedEvolution | None:
        """The schema change of the transaction's batch (rows of the schema the table was
        opened with), planned before its tasks write; its commit makes it with the append."""
        if mode != "add-and-widen" or self.table.rows is None:
            return None
        plan = self.table.plan_evolution(self.table.rows, mode)
        if plan is not None:
            self._plans[instant_time.value] = plan
        return plan

    def planned_evolution(self, instant_time: InstantTime) -> PlannedEvolution | None:
        return self._plans.get(instant_time.value)

    def claim(self, writer_id: str) -> int:
        """Claim the next incarnation of `writer_id` in the table (fencing older ones)."""
        n = self.table.claim_incarnation(writer_id)
        self.claimed = (writer_id, n)
        self.writer_id = writer_id
        return n

    def in_flight_files(self) -> list[str]:
        """The data files of this writer's transactions begun and not yet finished or rolled
        back: orphan removal must spare them."""
        # copies first: the services' thread (table.services.run=beside) asks while the batch's
        # thread adds to them
        rewrites, written = list(self._rewrites.values()), list(self._files.values())
        deletes = [d.path for r in rewrites for d in list(getattr(r, "deletes", ()))]
        return [f.path for files in written for f in list(files)] + deletes

    @property
    def name(self) -> str:
        return self.table.name

    def lock(self, control: CommitControl) -> AbstractContextManager[object] | None:
        """None: the catalog's compare-and-swap of the metadata is the fence."""
        return None

    def start_heartbeat(self, control: CommitControl, instant_time: InstantTime) -> None:
        """Nothing: nobody rolls back an Iceberg commit in flight (its files are orphans)."""

    def stop_heartbeat(self, control: CommitControl, instant_time: InstantTime) -> None:
        """Nothing beats (`start_heartbeat`)."""

    @staticmethod
    def commit_id(instant_time: InstantTime, engine_commit_id: str) -> str:
        """The snapshot's commit id: the transaction id, then the engine's commit id."""
        return f"{instant_time.value}-{engine_commit_id}"

    def next_instant_time(self, control: CommitControl) -> InstantTime:
        """Past the newest snapshot and past every id handed out before: with
        commit.mode=async a batch begins before the previous one's snapshot exists, and the
        ids are the pending store's epochs (strictly increasing per writer).

        Also past every transaction id a snapshot's commit id carries: a snapshot's time is the
        committing process's clock when it committed, which may be behind the id it carries
        (the id came from this writer's clock, e.g. on another host, or before a clock step).
        A restarted writer (`_last_issued` is 0 again) must still never begin the id of one
        of its published transactions again: `is_published` would take that snapshot for the
        new transaction, and the pending store's epochs would go back."""
        snaps, _ = snapshot_infos(self.table.pyiceberg.metadata)
        latest = max(
            (max(s.timestamp_ms, _transaction_ms(s.summary)) for s in snaps.values()), default=0
        )
        ms = max(self._clock_ms(), latest + 1, self._last_issued + 1)
        self._last_issued = ms
        return InstantTime.from_epoch_ms(ms)

    def begin(self, action: Action, instant_time: InstantTime, *, requested_content: bytes) -> None:
        """Nothing durable: data files no snapshot references are orphans."""
        if action is not Action.COMMIT:
            raise CommitError(f"table {self.name}: Iceberg commits only append ({action.value})")
        self._files.setdefault(instant_time.value, [])

    def add_files(self, instant_time: InstantTime, files: Sequence[DataFileDescription]) -> None:
        """The data files the tasks of `instant_time` reported (before `stage`)."""
        self._files.setdefault(instant_time.value, []).extend(files)

    def stage_rewrite(
        self, instant_time: InstantTime, extras: Sequence[Mapping[str, object]]
    ) -> None:
        """A batch of a table of keys: the files its tasks replace and the buckets they read
        (their `WriteStatus.extra`), which its commit removes and checks."""
        from lakesink.formats.iceberg.keyed import MERGE_ON_READ, layout_of
        from lakesink.formats.iceberg.keyed_writer import BUCKETS_KEY
        from lakesink.formats.iceberg.rowdelta import DELETES_KEY
        from lakesink.formats.iceberg.upsert import REPLACED_KEY, BucketRewrite

        layout = layout_of(self.table.pyiceberg.metadata, self.name)
        if layout is None:
            raise CommitError(
                f"table {self.name} commit {instant_time}: tasks rewrote buckets of a table "
                "that is not a table of keys"
            )
        self._rewrite_reports[instant_time.value] = tuple(
            {k: e[k] for k in (BUCKETS_KEY, REPLACED_KEY, DELETES_KEY) if k in e} for e in extras
        )
        if layout.mode == MERGE_ON_READ:  # position deletes and new files: one row delta
            from lakesink.formats.iceberg.rowdelta import RowDelta

            self._rewrites[instant_time.value] = RowDelta.from_extras(layout, extras)
            return
        self._rewrites[instant_time.value] = BucketRewrite.from_extras(layout, extras)

    def rewrite_reports(self, instant_time: InstantTime) -> tuple[dict[str, Any], ...]:
        """The tasks' reports a batch of a table of keys was staged from (`stage_rewrite`):
        what its pending entry keeps (commit.mode=async); empty for an append."""
        return self._rewrite_reports.get(instant_time.value, ())

    def restore_rewrite(
        self, instant_time: InstantTime, reports: Sequence[Mapping[str, Any]]
    ) -> None:
        """The rewrite of a batch of a table of keys pre-committed by an earlier process (from
        its pending entry), its position-delete files checked to exist."""
        self.stage_rewrite(instant_time, reports)
        deletes = getattr(self._rewrites[instant_time.value], "deletes", ())
        self._check_exist(instant_time, [d.path for d in deletes])

    def check_rewrite(self, instant_time: InstantTime) -> None:
        """CommitConflictError when a bucket the batch rewrote changed since its tasks read it
        (on the table's newest metadata); nothing for an append. Checked again inside the
        commit; commit.mode=async checks it before the batch is pre-committed, while the batch
        can still be written again."""
        rewrite = self._rewrites.get(instant_time.value)
        if rewrite is not None:
            self.table.refresh()
            rewrite.check(self.table.pyiceberg)

    def files(self, instant_time: InstantTime) -> list[DataFileDescription]:
        return list(self._files.get(instant_time.value, ()))

    def restore_files(
        self, instant_time: InstantTime, files: Sequence[DataFileDescription]
    ) -> None:
        """The data files of a commit pre-committed by an earlier process (from its pending
        entry), each checked to exist: a snapshot must never reference a missing file."""
        self._check_exist(instant_time, [f.path for f in files])
        self._files[instant_time.value] = list(files)

    def stage(self, instant_time: InstantTime, files: Collection[str]) -> set[str]:
        """The reported files are exactly the described ones, and each exists. Files of failed
        task attempts carry other names and stay unreferenced (orphan removal takes them)."""
        described = {f.path for f in self._files.get(instant_time.value, ())}
        kept = set(files)
        if kept != described:
            raise CommitError(
                f"table {self.name} commit {instant_time}: reported files and data file "
                f"descriptions differ ({sorted(kept ^ described)[:3]})"
            )
        self._check_exist(instant_time, kept)
        return kept

    def _check_exist(self, instant_time: InstantTime, paths: Collection[str]) -> None:
        io = self.table.pyiceberg.io
        for path in sorted(paths):
            if not io.new_input(path).exists():
                raise CorruptTableError(
                    f"table {self.name} commit {instant_time}: written file {path} is missing"
                )

    def view(self, instant_time: InstantTime) -> IcebergView:
        self.table.refresh()
        return IcebergView(self.table, self.claimed)

    def is_published(self, instant_time: InstantTime, commit_id: str = "") -> bool:
        """Whether a snapshot carries this transaction: its exact commit id when `commit_id` is
        given, else its transaction id from this writer (`writer_id`, when set). Transaction
        ids are milliseconds: two writers, or two processes of one writer, may begin in the
        same one, and another's snapshot is not this transaction's."""
        snaps, _ = snapshot_infos(self.table.pyiceberg.metadata)
        if commit_id:
            full = self.commit_id(instant_time, commit_id)
            return any(s.summary.get(KEY_COMMIT_ID) == full for s in snaps.values())
        prefix = f"{instant_time.value}-"
        return any(
            s.summary.get(KEY_COMMIT_ID, "").startswith(prefix)
            and (self.writer_id is None or s.summary.get(KEY_WRITER_ID) == self.writer_id)
            for s in snaps.values()
        )

    def prepare_publish(
        self, action: Action, instant_time: InstantTime, metadata: TableChange
    ) -> None:
        """Nothing to prepare: the append is built inside the catalog's commit."""

    def publish(
        self, action: Action, instant_time: InstantTime, metadata: TableChange
    ) -> AppendResult:
        """One fast append with the writer's summary; the catalog checks that the writer's
        offsets are still the batch's start offsets."""
        requirement = AppendRequirement(
            metadata.extra[keys.WRITER_ID_KEY],
            self.commit_id(instant_time, metadata.extra.get(keys.COMMIT_ID_KEY, "")),
            _ranges(metadata),
        )
        vtts = metadata.extra.get(VTTS_KEY)
        writer_id = requirement.writer_id
        own = self.claimed[1] if self.claimed is not None and self.claimed[0] == writer_id else None
        lost = metadata.extra.get(keys.LOST_KEY)
        extra = {KEY_LOST: lost} if lost else {}
        if MUTATIONS_PROPERTY in self.table.pyiceberg.metadata.properties:
            extra.update(_ranges_summary(metadata))  # what the fold audit folds
        result = self.table.commit_append(
            self.files(instant_time),
            requirement,
            int(vtts) if vtts else None,
            incarnation=own,
            extra_summary=extra or None,
            schema=schema_from_text(metadata.schema.text),  # a batch that evolves the table
            rewrite=self._rewrites.get(instant_time.value),  # a batch of a table of keys
        )
        if result.outcome is CommitOutcome.REPLAYED:
            raise CommitError(
                f"table {self.name} commit {instant_time}: its ranges were committed by "
                "another commit meanwhile; nothing was appended"
            )
        return result

    def commit_landed(self, instant_time: InstantTime, commit_id: str) -> bool:
        self.table.refresh()
        return self.is_published(instant_time, commit_id)

    def published_record(self, instant_time: InstantTime) -> InstantTime:
        return instant_time

    def complete(self, action: Action, instant_time: InstantTime, content: bytes) -> object:
        raise CommitError(f"table {self.name}: only Hudi tables complete non-data instants")

    def finish(self, instant_time: InstantTime) -> None:
        self._files.pop(instant_time.value, None)
        self._plans.pop(instant_time.value, None)
        self._rewrites.pop(instant_time.value, None)
        self._rewrite_reports.pop(instant_time.value, None)

    def rollback(self, instant_time: InstantTime) -> bool:
        """Delete the batch's data files (never those of a commit that landed)."""
        self.table.refresh()
        self._plans.pop(instant_time.value, None)
        rewrite = self._rewrites.pop(instant_time.value, None)  # replaced files stay: still live
        self._rewrite_reports.pop(instant_time.value, None)
        # a merge-on-read batch's own position-delete files go with its data files
        files = [*self._files.pop(instant_time.value, []), *getattr(rewrite, "deletes", ())]
        if self.is_published(instant_time):
            return False
        self.table.abort(files)
        return bool(files)

    def roll_back_pending(self, instant: Instant) -> None:
        raise CommitError(f"table {self.name}: only Hudi tables have pending instants")

    def delete_side_files(self, keys: Sequence[str]) -> None:
        """Nothing: the writer keeps no files beside an Iceberg commit."""

    def committed_offsets(self, writer_id: str) -> WriterOffsets:
        self.table.refresh()
        return self.table.committed_offsets(writer_id)

    def schema(self) -> str | None:
        return self.table.pyiceberg.schema().model_dump_json()

    def field_ids(self) -> Mapping[str, int]:
        """The table's field ids by column name (nested ones dotted), of its current schema
        as last loaded (computed once per schema)."""
        from pyiceberg.schema import index_by_name

        schema = self.table.pyiceberg.schema()
        if self._field_ids is None or self._field_ids[0] != schema.schema_id:
            self._field_ids = (schema.schema_id, MappingProxyType(index_by_name(schema)))
        return self._field_ids[1]


if TYPE_CHECKING:  # mypy proves the Iceberg side implements the engine's format interface
    from lakesink.engine.format import TableFormat, TableView

    _FORMAT: type[TableFormat] = IcebergFormat
    _VIEW: type[TableView] = IcebergView
