"""The commit coordinator over an Iceberg table: the engine's `Coordinator` (begin_batch,
precommit/commit, abort, start/recover) with the table's format an `IcebergFormat`. Nothing
durable precedes a commit (no intents, no instants), so recovery has nothing to roll back:
data files of a batch that never committed are orphans for orphan removal.
Tasks report their data file descriptions in `WriteStatus.extra[FILES_KEY]`, and the maximum
record timestamp they read in `WriteStatus.extra[MAX_TS_KEY]` (for the snapshot's VTTS).

With commit.mode=async (lakesink.engine.async_commit) a prepared commit carries the data file
descriptions (`PreparedCommit.data_files`) and, for a table of keys, the tasks' reports of what
its snapshot replaces (`PreparedCommit.rewrite`) into the pending store, so that a later process
publishes it: the snapshot's commit id starts with the batch's transaction id, so a publish
that landed before a crash is recognised and not repeated, and the offsets requirement guards
every publish.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from lakesink.engine.coordinator import BatchOutcome, Coordinator, PreparedCommit
from lakesink.engine.evolution import EvolutionMode
from lakesink.engine.format import CommitControl
from lakesink.engine.requirements import OffsetsUnchanged, Requirement, WriterStillLive
from lakesink.engine.schema import TableSchema
from lakesink.engine.transaction import PostCommitHook, TableTransaction
from lakesink.formats.iceberg.datafiles import FILES_KEY, MAX_TS_KEY, DataFileDescription
from lakesink.formats.iceberg.format import VTTS_KEY, IcebergFormat
from lakesink.formats.iceberg.keyed_writer import BUCKETS_KEY
from lakesink.formats.iceberg.snapshots import valid_through
from lakesink.metrics import IngestionMetrics
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets
from lakesink.protocol.write_status import WriteStatus

log = logging.getLogger(__name__)

__all__ = ["FILES_KEY", "MAX_TS_KEY", "IcebergCoordinator"]


class CatalogControl:
    """An Iceberg writer's concurrency control: nothing of its own (the catalog's commit is
    the fence, its incarnation is checked by the format)."""

    def __init__(self, writer_id: str) -> None:
        self._writer_id = writer_id

    @property
    def writer_id(self) -> str:
        return self._writer_id


class IcebergCoordinator(Coordinator):
    """One writer on one Iceberg table, through the commit engine (`IcebergFormat`)."""

    format: IcebergFormat

    def __init__(
        self,
        table_format: IcebergFormat,
        writer_id: str,
        *,
        query_id: str = "",
        control: CommitControl | None = None,
        allow_data_loss: bool = False,
        topic_ids: Callable[[Iterable[str]], Mapping[str, str]] | None = None,
        metrics: IngestionMetrics | None = None,
        post_commit: Sequence[PostCommitHook] = (),
        publish_delay_s: float = 0.0,
    ) -> None:
        super().__init__(
            table_format,
            writer_id,
            query_id=query_id,
            control=control or CatalogControl(writer_id),
            publish_delay_s=publish_delay_s,
            allow_data_loss=allow_data_loss,
            topic_ids=topic_ids,
            metrics=metrics,
            post_commit=post_commit,
        )
        table_format.writer_id = writer_id  # its transactions are this writer's
        self.incarnation: int | None = None  # claimed by start()
        # schema.evolution of a writer's main table (its batches evolve the schema); None: never
        self.schema_evolution: EvolutionMode | None = None

    # --- start-up: claim the writer id; nothing to roll back --------------------------------
    def start(self, keep: frozenset[InstantTime] = frozenset()) -> None:
        """Claim the next incarnation of this writer id in the table (older incarnations, e.g.
        a driver thought dead, can no longer commit), then recover (nothing to roll back)."""
        self.incarnation = self.format.claim(self.writer_id)
        self.recover(keep)

    # --- the batch ---------------------------------------------------------------------------
    def _write_intent(self, t: InstantTime, batch_id: int, ranges: Sequence[object]) -> None:
        """No intent: a batch that never committed leaves only unreferenced data files."""

    def _stage(self, tx: TableTransaction, statuses: Sequence[WriteStatus]) -> set[str]:
        described = [
            DataFileDescription.from_json(d) for s in statuses for d in s.extra.get(FILES_KEY, ())
        ]
        self.format.add_files(tx.instant_time, described)
        rewrites = [s.extra for s in statuses if BUCKETS_KEY in s.extra]
        if rewrites:  # a batch of a table of keys: its commit replaces the buckets' files
            self.format.stage_rewrite(tx.instant_time, rewrites)
        return tx.stage({f.path for s in statuses for f in s.files})

    def _format_extra(
        self, next_offsets: WriterOffsets, statuses: Sequence[WriteStatus]
    ) -> dict[str, str]:
        newest: dict[TopicPartition, int | None] = {}
        for s in statuses:
            for key, ms in (s.extra.get(MAX_TS_KEY) or {}).items():
                tp = TopicPartition.parse(key)
                newest[tp] = max(int(ms), newest.get(tp) or int(ms))
        vtts = valid_through(newest, next_offsets.next_offsets)
        return {VTTS_KEY: str(vtts)} if vtts is not None else {}

    def _requirements(self, prepared: PreparedCommit) -> tuple[Requirement, ...]:
        """The writer's incarnation still the table's and its offsets unchanged (read from the
        refreshed metadata; the catalog checks both again inside its commit). Appends conflict
        with nothing; no lock to hold."""
        t = prepared.instant_time
        return (
            WriterStillLive(self.control, t),
            OffsetsUnchanged(self.writer_id, prepared.base_offsets, t),
        )

    # --- two phases (commit.mode=async) -----------------------------------------------------
    def precommit(
        self,
        instant_time: InstantTime,
        batch_id: int,
        ranges: Sequence[OffsetRange],
        statuses: Sequence[WriteStatus],
        schema: TableSchema,
        *,
        lost: Sequence[OffsetRange] = (),
    ) -> PreparedCommit:
        """The engine's pre-commit, with the table's field ids in the schema and the data
        file descriptions the snapshot will add (the pending entry must hold them: the
        format keeps them in this process only)."""
        schema = TableSchema.of(schema).with_field_ids(self.format.field_ids())
        plan = self.format.planned_evolution(instant_time)
        if plan is not None:  # the commit carries the evolved schema (a pending entry too)
            schema = TableSchema(plan.text(), schema.arrow, schema.field_ids)
        prepared = super().precommit(instant_time, batch_id, ranges, statuses, schema, lost=lost)
        described = tuple(d.to_json() for d in self.format.files(instant_time))
        rewrite = self.format.rewrite_reports(instant_time)
        return replace(prepared, data_files=described, rewrite=rewrite)

    def check_precommit(self, prepared: PreparedCommit) -> None:
        """A batch of a table of keys: CommitConflictError when a bucket it rewrote changed
        since its tasks read it (another writer or a rewrite committed it). Before the pending
        entry, the batch is still written again (the sink's conflict retry); once pending, it
        could only be published or dropped."""
        self.format.check_rewrite(prepared.instant_time)

    def commit(self, prepared: PreparedCommit, *, run_hooks: bool = True) -> BatchOutcome:
        """The engine's commit. A batch this process did not begin (a Pending epoch of an
        earlier process, at recovery) gets its data files back from the prepared commit."""
        t = prepared.instant_time
        if self.batch_state(t) is None:
            self.format.restore_files(
                t, [DataFileDescription.from_json(d) for d in prepared.data_files]
            )
            if prepared.rewrite:  # a batch of a table of keys: what its snapshot replaces
                self.format.restore_rewrite(t, prepared.rewrite)
        outcome = super().commit(prepared, run_hooks=run_hooks)
        self.format.finish(t)  # also when the snapshot was there already (nothing published)
        return outcome
