"""The commit coordinator over a Hudi table: the engine's `Coordinator` with what a Hudi writer
keeps beside its instants. An instant is visible on the timeline from `begin`, so other
writers' lazy rollback must be told whose it is (an intent) and that it is durably
pre-committed (a mark); at start the writer claims its id (fencing older incarnations) and
rolls back its failed instants, and deletes markers a crash left after a publish.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence

from lakesink.engine.coordinator import Coordinator
from lakesink.engine.services import ServicesRunner
from lakesink.engine.transaction import PostCommitHook
from lakesink.formats.hudi import writer_state as keys
from lakesink.formats.hudi.conflicts import MtimeCache
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.format import HudiFormat
from lakesink.formats.hudi.recovery import (
    intent_key,
    is_precommitted,
    precommitted_key,
    recover_failed_writes,
)
from lakesink.formats.hudi.services.inline import inline_services_hook
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.markers import delete_completed_markers
from lakesink.formats.hudi.table.timeline import Timeline
from lakesink.metrics import IngestionMetrics
from lakesink.protocol.conflicts import ConflictStrategy, strategy_named
from lakesink.protocol.instant import Instant, InstantTime
from lakesink.protocol.offsets import OffsetRange, WriterOffsets
from lakesink.settings import SchemaEvolutionMode, Settings

__all__ = ["HudiCoordinator"]


_BEGUN_KEPT = 8  # instants whose begin timeline is kept (async commit overlaps batches)


class HudiCoordinator(Coordinator):
    """One writer on one Hudi table, through the commit engine (`HudiFormat`)."""

    control: CommitControl

    def __init__(
        self,
        table: HudiTable,
        writer_id: str,
        *,
        query_id: str = "",
        control: CommitControl,
        conflict_strategy: ConflictStrategy | None = None,
        publish_delay_s: float = 0.0,
        allow_data_loss: bool = False,
        topic_ids: Callable[[Iterable[str]], Mapping[str, str]] | None = None,
        metrics: IngestionMetrics | None = None,
        post_commit: Sequence[PostCommitHook] = (),
    ) -> None:
        # the write times of completed timeline files, for every transaction's conflict check
        self._mtimes = MtimeCache()
        super().__init__(
            HudiFormat(table, control, mtimes=self._mtimes),
            writer_id,
            query_id=query_id,
            control=control,
            conflict_strategy=conflict_strategy,
            publish_delay_s=publish_delay_s,
            allow_data_loss=allow_data_loss,
            topic_ids=topic_ids,
            metrics=metrics,
            post_commit=post_commit,
        )
        self.table = table
        # schema.evolution of a writer's main table (its tasks evolve the schema); None: never
        self.schema_evolution: SchemaEvolutionMode | None = None
        # The timeline recovery read, for the first `committed` after it (one LIST at start)
        self._recovered: Timeline | None = None
        # The timelines the last instants begun here began on (listed under the lock): the
        # batch's tasks are handed the schema (`task_schema`) and the inline services count
        # commits on it (`begun_on`), instead of listing the timeline again
        self._begun: dict[InstantTime, Timeline] = {}

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        table: HudiTable,
        control: CommitControl,
        *,
        query_id: str,
        publish_delay_s: float = 0.0,
        topic_ids: Callable[[Iterable[str]], Mapping[str, str]] | None = None,
        metrics: IngestionMetrics | None = None,
    ) -> HudiCoordinator:
        """The writer's coordinator of `table`, with the configured conflict rules and the
        inline table services as its post-commit hook."""
        coordinator = cls(
            table,
            settings.writer_id,
            query_id=query_id,
            control=control,
            conflict_strategy=strategy_named(settings.services.conflict_strategy),
            publish_delay_s=publish_delay_s,
            allow_data_loss=not settings.kafka.fail_on_data_loss,
            topic_ids=topic_ids,
            metrics=metrics,
        )
        if (
            settings.services.run == "beside"
            and table.config.bucket_count is None  # appends: they never conflict (seed 003)
            and table.config.table_type != "MERGE_ON_READ"  # compaction stays before
        ):
            coordinator.services = ServicesRunner(table.config.name, metrics=metrics)
        hook = inline_services_hook(
            table, settings, control, coordinator.begun_on, runner=coordinator.services
        )
        coordinator.post_commit = (hook,)
        return coordinator

    def _transaction_format(self) -> HudiFormat:
        """One per transaction: a `HudiFormat` keeps the timeline it listed under the lock
        between its calls, which a batch committed in the background must not share with
        the next batch's begin."""
        return HudiFormat(self.table, self.control, mtimes=self._mtimes, on_begin=self._on_begin)

    def _on_begin(self, t: InstantTime, timeline: Timeline) -> None:
        self._begun[t] = timeline
        while len(self._begun) > _BEGUN_KEPT:  # batches that never published
            del self._begun[min(self._begun)]

    def begun_on(self, t: InstantTime) -> Timeline | None:
        """The timeline instant `t` began on, when it began here (and was not asked for yet)."""
        return self._begun.pop(t, None)

    def task_schema(self, t: InstantTime) -> tuple[bool, str | None]:
        """(known, schema): the table's latest schema as of the timeline instant `t` began on,
        for the instant's tasks; (False, None) when `t` is not the instant last begun here (the
        tasks read it themselves). The commit metadata it comes from is the one this process
        published last (kept in memory): no request on the steady path."""
        begun = self._begun.get(t)
        if begun is None:
            return False, None
        return True, begun.latest_schema()

    def task_partitions(self, t: InstantTime) -> frozenset[str]:
        """The partitions whose `.hoodie_partition_metadata` exists for certain, for the tasks
        of instant `t`: those the latest completed data instant of the timeline `t` began on
        wrote into (its metadata is the one `task_schema` reads: no request). Empty when `t`
        did not begin here."""
        begun = self._begun.get(t)
        return begun.latest_written_partitions() if begun is not None else frozenset()

    def _side_files(self, t: InstantTime) -> list[str]:
        return [intent_key(t), precommitted_key(t)]

    # --- start-up ----------------------------------------------------------------------------
    def start(self, keep: frozenset[InstantTime] = frozenset()) -> None:
        """Claim this writer id (fencing older incarnations) and roll back its failed instants
        (except those in `keep`: pre-committed epochs the async committer publishes)."""
        self.control.claim(self.table, self.writer_id)
        self.recover(keep)

    def recover(self, keep: frozenset[InstantTime] = frozenset()) -> list[Instant]:
        """Roll back this writer's unfinished instants, and other writers' whose heartbeat
        expired — except those in `keep` and others' pre-committed ones (published later)."""
        timeline = self.table.timeline()
        rolled = recover_failed_writes(
            self.table,
            self.control,
            self.writer_id,
            keep=keep,
            metrics=self.metrics,
            crash=self._crash,
            timeline=timeline,
        )
        # A crash between a publish and the deletion of its markers (after the lock) left them
        delete_completed_markers(
            self.table.storage, lambda t: (i := timeline.get(t)) is not None and i.is_completed
        )
        # Rollbacks remove pending instants only: the completed commits this writer's offsets
        # come from are as that timeline shows them (the writer id is claimed: no other
        # incarnation completes one).
        self._committed, self._recovered = None, timeline
        return rolled

    @property
    def committed(self) -> WriterOffsets:
        if self._committed is None:
            timeline, self._recovered = self._recovered, None
            self._committed = keys.committed_offsets(self.table, self.writer_id, timeline)
        return self._committed

    def table_offsets(self) -> WriterOffsets:
        return keys.committed_offsets(self.table, self.writer_id)

    # --- pre-commit marks and intents --------------------------------------------------------
    def _write_precommitted_mark(self, t: InstantTime) -> None:
        """Tell other writers' lazy rollback that instant `t` is durably pre-committed: its owner
        publishes it at restart, so it must not be rolled back even if its heartbeat expires.
        Written before the batch's state moves to PRECOMMITTED, so that the state never says
        more than the mark."""
        self.table.storage.write(precommitted_key(t), b"")

    def is_precommitted(self, t: InstantTime) -> bool:
        """The mark on storage (also for a batch an earlier process pre-committed)."""
        return is_precommitted(self.table, t)

    def _write_intent(self, t: InstantTime, batch_id: int, ranges: Sequence[OffsetRange]) -> None:
        self.table.storage.write(
            intent_key(t),
            json.dumps(
                {
                    "writer_id": self.writer_id,
                    "query_id": self.query_id,
                    "batch_id": batch_id,
                    "ranges": [[r.partition.key(), r.start, r.end] for r in ranges],
                }
            ).encode(),
        )
