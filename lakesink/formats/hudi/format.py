"""The Hudi table (formats/hudi/table/) as a `TableFormat` of the commit engine: instants on the
timeline, markers reconciled before publishing, rollback by markers, the writer's state in
the commit metadata's extra map (lakesink.formats.hudi.writer_state)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from lakesink.engine.change import TableChange
from lakesink.engine.format import CommitControl
from lakesink.errors import CommitError, CommitStateUnknownError, CorruptTableError
from lakesink.formats.hudi import writer_state
from lakesink.formats.hudi.conflicts import MtimeCache, check_operation
from lakesink.formats.hudi.control import CommitControl as HudiControl
from lakesink.formats.hudi.control import hudi_control
from lakesink.formats.hudi.instants import complete_instant
from lakesink.formats.hudi.table.archive import is_archived_completed
from lakesink.formats.hudi.table.delta_upsert import delta_writes
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.markers import delete_markers_soon, marked_files, marker_key
from lakesink.formats.hudi.table.merge_on_read import encode_delta_commit
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.rollback import delete_leftovers, rollback
from lakesink.formats.hudi.table.timeline import EncodedCommit, Timeline, encode_commit
from lakesink.protocol.conflicts import ConflictStrategy, Operation
from lakesink.protocol.instant import Action, Instant, InstantTime, State
from lakesink.protocol.offsets import WriterOffsets
from lakesink.storage import ObjectExistsError, Storage, StorageError

log = logging.getLogger(__name__)


_HEAD_THREADS = 16


def _missing(storage: Storage, keys: list[str]) -> list[str]:
    """The `keys` that do not exist. On an object store the HEADs go out in parallel threads
    (a HEAD is a round trip; hundreds per commit at hundreds of Kafka partitions); locally each
    is one stat."""
    if storage.is_local or len(keys) < 2:
        return [k for k in keys if not storage.exists(k)]
    with ThreadPoolExecutor(min(_HEAD_THREADS, len(keys)), "lakesink-head") as pool:
        found = list(pool.map(storage.exists, keys))
    return [k for k, there in zip(keys, found, strict=True) if not there]


class HudiView:
    """The Hudi table under the lock: one timeline snapshot, read when the view was made."""

    def __init__(
        self,
        table: HudiTable,
        timeline: Timeline,
        instant_time: InstantTime,
        narrow: Callable[[CommitControl], HudiControl] = hudi_control,
        mtimes: MtimeCache | None = None,
        began_on: Timeline | None = None,
    ) -> None:
        self.table = table
        self.timeline = timeline
        self.instant_time = instant_time
        self._narrow = narrow  # the engine's control as Hudi's (`HudiFormat._hudi`)
        self._mtimes = mtimes  # completed files' write times read before (conflicts)
        # the snapshot the instant began on, when it began in this transaction: what completed
        # there is not concurrent with it (conflicts.concurrent_operations)
        self._began_on = began_on

    def committed_offsets(self, writer_id: str) -> WriterOffsets:
        return writer_state.committed_offsets(self.table, writer_id, self.timeline)

    def backfill_committed(self, backfill_id: str) -> bool:
        return writer_state.backfill_committed(self.table, backfill_id, self.timeline)

    def check_conflicts(self, operation: Operation, strategy: ConflictStrategy) -> None:
        check_operation(
            self.table,
            operation,
            strategy,
            timeline=self.timeline,
            mtimes=self._mtimes,
            began_on=self._began_on,
        )

    def check_alive(self, control: CommitControl, instant_time: InstantTime) -> None:
        self._narrow(control).check_alive(self.table, instant_time)


class HudiFormat:
    """`TableFormat` over a `HudiTable`. The timeline is listed once per lock hold: under the
    lock at begin, `next_instant_time` and `begin` share one snapshot; at commit, `view`, the
    requirements, `is_published` and `publish` share the view's. Nothing is reused across lock
    holds: another writer may add instants in between."""

    def __init__(
        self,
        table: HudiTable,
        control: HudiControl | None = None,
        *,
        mtimes: MtimeCache | None = None,
        on_begin: Callable[[InstantTime, Timeline], None] | None = None,
    ) -> None:
        self.table = table
        # told the timeline an instant began on (listed under the lock): the coordinator hands
        # what its tasks need of it (the latest schema) to them, so no task lists it again
        self.on_begin = on_begin
        # Hudi's control of the writer, when the format is made for one (a coordinator's):
        # the engine hands it back to every call, so no call narrows it at runtime
        self.control = control
        # the write times of completed timeline files, kept by the writer across its
        # transactions: each conflict check compares with every instant of the last minute
        self.mtimes = mtimes
        self._view: HudiView | None = None
        # the snapshot `next_instant_time` listed under the lock, for the `begin` that follows
        self._begin_snapshot: Timeline | None = None
        # the instant `begin` wrote and the snapshot it was listed on (for the conflict check)
        self._began: tuple[InstantTime, Timeline] | None = None
        # the completed file `prepare_publish` encoded before the lock, for `publish` (with the
        # change it encodes: `publish` uses it for that very change only)
        self._encoded: tuple[TableChange, EncodedCommit] | None = None
        # the marker keys `stage` listed, for `finish` to delete without listing them again
        self._markers: tuple[InstantTime, list[str]] | None = None

    @property
    def name(self) -> str:
        return self.table.config.name

    def _hudi(self, control: CommitControl) -> HudiControl:
        """The engine's `control` as Hudi's: the format's own when it is that one, else
        checked at runtime (another format's control is a bug: InternalError)."""
        own = self.control
        return own if control is own and own is not None else hudi_control(control)

    def lock(self, control: CommitControl) -> AbstractContextManager[object]:
        lock: AbstractContextManager[object] = self._hudi(control).locked(self.table)
        return lock

    def start_heartbeat(self, control: CommitControl, instant_time: InstantTime) -> None:
        self._hudi(control).start_heartbeat(self.table, instant_time)

    def stop_heartbeat(self, control: CommitControl, instant_time: InstantTime) -> None:
        self._hudi(control).stop_heartbeat(self.table, instant_time)

    def next_instant_time(self, control: CommitControl) -> InstantTime:
        # called under the lock, right before `begin` (TableTransaction.begin_locked)
        snapshot = self.table.timeline()
        if self.table.config.table_type == "MERGE_ON_READ" and snapshot.inflight_or_requested(
            Action.COMPACTION
        ):
            # A compaction left pending by a crash is finished (never rolled back, Hudi's rule)
            # before anything begins: its base files are the slices new log files must join.
            from lakesink.formats.hudi.services.compaction import finish_compactions_locked

            finish_compactions_locked(self.table, self._hudi(control))
            snapshot = self.table.timeline()
        self._begin_snapshot = snapshot
        return self._hudi(control).next_instant_time(self.table, self._begin_snapshot)

    def begin(self, action: Action, instant_time: InstantTime, *, requested_content: bytes) -> None:
        snapshot, self._begin_snapshot = self._begin_snapshot, None
        if snapshot is not None:  # listed under this lock hold: still complete
            snapshot.begin(
                action, instant_time, requested_content=requested_content, snapshot_is_fresh=True
            )
        else:
            snapshot = self.table.timeline()
            snapshot.begin(action, instant_time, requested_content=requested_content)
        self._began = (instant_time, snapshot)
        if self.on_begin is not None:
            self.on_begin(instant_time, snapshot)

    def stage(self, instant_time: InstantTime, files: Collection[str]) -> set[str]:
        """Delete files of failed or duplicate task attempts (marked but in no accepted status)
        BEFORE publishing: hudi-rs would read them as part of the instant."""
        t = instant_time
        storage = self.table.storage
        kept = set(files)
        keys = storage.list_keys(marker_key(t))
        self._markers = (t, keys)
        marked = set(marked_files(t, keys))
        missing = kept - marked
        if missing:
            raise CommitError(
                f"instant {t}: files {sorted(missing)[:3]} are in write statuses but have no marker"
            )
        for rel in sorted(marked - kept):
            log.info("table %s instant %s: deleting orphan file %s", self.table.config.name, t, rel)
            storage.delete(rel)
        for rel in _missing(storage, sorted(kept)):
            raise CorruptTableError(f"instant {t}: written file {rel} is missing on storage")
        return kept

    def view(self, instant_time: InstantTime) -> HudiView:
        began = self._began
        self._view = HudiView(
            self.table,
            self.table.timeline(),
            instant_time,
            self._hudi,
            self.mtimes,
            began_on=began[1] if began is not None and began[0] == instant_time else None,
        )
        return self._view

    def _fresh_view(self, instant_time: InstantTime) -> HudiView | None:
        """The view just taken for this instant under the lock, once (then it is stale)."""
        view, self._view = self._view, None
        return view if view is not None and view.instant_time == instant_time else None

    def is_published(self, instant_time: InstantTime, commit_id: str = "") -> bool:
        # a Hudi instant time is unique on its timeline: `commit_id` adds nothing
        view = self._view
        fresh = view is not None and view.instant_time == instant_time
        timeline = view.timeline if view is not None and fresh else self.table.timeline()
        existing = timeline.get(instant_time)
        return (existing is not None and existing.is_completed) or (
            existing is None and is_archived_completed(self.table.storage, instant_time)
        )

    def publish(
        self,
        action: Action,
        instant_time: InstantTime,
        change: TableChange,
    ) -> Instant:
        view = self._fresh_view(instant_time)
        timeline = view.timeline if view is not None else self.table.timeline()
        instant = Instant(instant_time, action, State.INFLIGHT)
        prepared, self._encoded = self._encoded, None
        encoded = prepared[1] if prepared is not None and prepared[0] is change else None
        if encoded is None and action is Action.DELTA_COMMIT:  # the log files' stats
            encoded = self._encode(instant, change)
        metadata = encoded.metadata if encoded is not None else CommitMetadata.of(change)
        try:
            # Under the lock: the view's snapshot is fresh. The markers stay: `finish` deletes
            # them after the lock is released (nothing reads a completed instant's markers).
            return timeline.publish(
                instant,
                metadata,
                snapshot_is_fresh=view is not None,
                encoded=encoded,
                delete_markers=False,
            )
        except ObjectExistsError:
            raise
        except StorageError as e:
            if not e.retriable:
                raise
            raise CommitStateUnknownError(
                f"publish of instant {instant_time} on {self.table.uri}: the store did not "
                f"answer whether it landed ({e})"
            ) from e

    def prepare_publish(
        self, action: Action, instant_time: InstantTime, change: TableChange
    ) -> None:
        """Encode the completed file before the lock is taken (`publish` then only writes
        it): the encoding depends on nothing the lock protects."""
        instant = Instant(instant_time, action, State.INFLIGHT)
        self._encoded = (change, self._encode(instant, change))

    def _encode(self, instant: Instant, change: TableChange) -> EncodedCommit:
        """The completed file of `instant`: a deltacommit's log files get the write stats of
        Hudi's HoodieDeltaWriteStat (their slice's base file and log files)."""
        metadata = CommitMetadata.of(change)
        if instant.action is Action.DELTA_COMMIT:
            deltas = delta_writes(self.table, metadata.writes)
            return encode_delta_commit(self.table.layout, instant, metadata, deltas)
        return encode_commit(self.table.layout, instant, metadata)

    def commit_landed(self, instant_time: InstantTime, commit_id: str) -> bool:
        timeline = self.table.timeline()
        done = timeline.get(instant_time)
        if done is None or not done.is_completed:
            return False
        if not commit_id:
            return True
        return timeline.commit_metadata(done).extra.get(writer_state.COMMIT_ID_KEY) == commit_id

    def published_record(self, instant_time: InstantTime) -> Instant | None:
        return self.table.timeline().get(instant_time)

    def complete(self, action: Action, instant_time: InstantTime, content: bytes) -> Instant:
        return complete_instant(self.table, Instant(instant_time, action, State.INFLIGHT), content)

    def finish(self, instant_time: InstantTime) -> None:
        # After the lock, in the background: a crash before they are gone leaves the markers of
        # a completed instant, which nothing reads; the writer's next start deletes them
        # (`delete_completed_markers`).
        listed, self._markers = self._markers, None
        keys = listed[1] if listed is not None and listed[0] == instant_time else None
        delete_markers_soon(self.table.storage, instant_time.value, keys)

    def rollback(self, instant_time: InstantTime) -> bool:
        """True when a pending instant was rolled back (False: it was gone already, and
        any files it left are deleted)."""
        rolled = False
        for instant in self.table.timeline().inflight_or_requested():
            if instant.time == instant_time:
                rollback(self.table, instant)
                rolled = True
        if self.table.timeline().get(instant_time) is None:
            delete_leftovers(self.table, instant_time)  # rolled back under us: files are garbage
        return rolled

    def roll_back_pending(self, instant: Instant) -> None:
        rollback(self.table, instant)

    def delete_side_files(self, keys: Sequence[str]) -> None:
        if keys:
            self.table.storage.delete_many(list(keys))

    def committed_offsets(self, writer_id: str) -> WriterOffsets:
        return writer_state.committed_offsets(self.table, writer_id)

    def schema(self) -> str | None:
        return self.table.timeline().latest_schema()


if TYPE_CHECKING:  # mypy proves the Hudi side implements the engine's format interface
    from lakesink.engine.format import TableFormat, TableView

    _FORMAT: type[TableFormat] = HudiFormat
    _VIEW: type[TableView] = HudiView
