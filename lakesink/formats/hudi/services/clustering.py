"""Clustering: rewrite the small base files of a partition into files of the target size, as a
`replacecommit` that replaces their file groups.

Rows keep their `_hoodie_commit_time` and `_hoodie_commit_seqno`, so an incremental reader does
not read them again. The plan is scheduled under the table lock: it never includes a file group
another pending clustering plans to rewrite, its instant gets a heartbeat, and the plan is stored
beside the timeline (`.hoodie/.lakesink/services/clustering/<instant>.json`) so that concurrent
writers can check conflicts against it. The rewrite happens without the lock; the commit takes
the lock again and asks the conflict strategy (`lakesink.protocol.conflicts`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lakesink.engine.requirements import NoConflicts, WriterStillLive
from lakesink.engine.schema import TableSchema
from lakesink.engine.tiers import tiered_selection
from lakesink.engine.transaction import TableTransaction, TxState
from lakesink.errors import LakesinkError, UnsupportedTableError
from lakesink.faults import pause_point
from lakesink.formats.hudi.conflicts import (
    CLUSTERING_PLANS,
    concurrent_operations,
    pending_clustering_groups,
)
from lakesink.formats.hudi.control import SERVICES_WRITER_ID, CommitControl
from lakesink.formats.hudi.format import HudiFormat
from lakesink.formats.hudi.instants import plan_path, write_json
from lakesink.formats.hudi.table.file_group import FileSlice
from lakesink.formats.hudi.table.files import write_token
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.plans import PlannedSlice, clustering_plan_bytes
from lakesink.formats.hudi.table.view import FileSystemView
from lakesink.formats.hudi.table.writer import DEFAULT_TARGET_FILE_SIZE, BaseFileWriter
from lakesink.formats.hudi.writer_state import WRITER_ID_KEY
from lakesink.protocol.conflicts import (
    ConflictStrategy,
    FileGroupId,
    FileGroupOverlap,
    Operation,
    OperationKind,
    Phase,
)
from lakesink.protocol.instant import Action, Instant, InstantTime
from lakesink.settings import DEFAULT_CLUSTERING_MAX_BYTES

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClusteringOptions:
    """Which files a clustering rewrites and into what."""

    small_file_bytes: int = 100 * 1024 * 1024
    """Base files smaller than this are rewritten."""
    target_file_bytes: int = DEFAULT_TARGET_FILE_SIZE
    """Output files roll over at about this size."""
    min_files: int = 2
    """A partition is clustered only with at least this many small files."""
    max_bytes: int = DEFAULT_CLUSTERING_MAX_BYTES
    """At most this many bytes of small files per partition, the oldest first (they are read
    into memory at once; past 2 GiB of rows Arrow's string arrays overflow)."""
    partitions: tuple[str, ...] | None = None
    """Only these partitions (None: all)."""
    tier_ratio: int = 0
    """Only files of one size tier together, a tier once it has this many (`engine.tiers`);
    0: every small file of a partition (a clustering by hand)."""


@dataclass(frozen=True, slots=True)
class ClusteringPlan:
    """The small file slices one replacecommit rewrites, by partition."""

    instant_time: InstantTime
    slices: Mapping[str, tuple[FileSlice, ...]]

    @property
    def file_groups(self) -> frozenset[FileGroupId]:
        return frozenset((s.partition_path, s.file_id) for ss in self.slices.values() for s in ss)

    @property
    def file_count(self) -> int:
        return sum(len(ss) for ss in self.slices.values())

    def without(self, groups: frozenset[FileGroupId], min_files: int) -> ClusteringPlan:
        kept = {
            p: tuple(s for s in ss if (s.partition_path, s.file_id) not in groups)
            for p, ss in self.slices.items()
        }
        return ClusteringPlan(
            self.instant_time, {p: ss for p, ss in kept.items() if len(ss) >= min_files}
        )


@dataclass(frozen=True, slots=True)
class ClusteringResult:
    instant: Instant | None
    files_before: int = 0
    files_after: int = 0
    rows: int = 0
    skipped: frozenset[FileGroupId] = field(default_factory=frozenset)


class _NothingLeft(LakesinkError):
    """Every planned file group was skipped: the clustering is rolled back, not an error."""


def choose_slices(
    latest: Sequence[FileSlice],
    excluded: frozenset[FileGroupId],
    options: ClusteringOptions,
) -> dict[str, tuple[FileSlice, ...]]:
    """Pure: the small slices per partition worth rewriting (of the tiers due, with a tier
    ratio), the oldest first, as many as fit in `options.max_bytes` (at least one: a single
    file over the cap is read alone)."""
    by_partition: dict[str, list[FileSlice]] = {}
    for s in latest:
        if options.partitions is not None and s.partition_path not in options.partitions:
            continue
        if (
            s.partition_path,
            s.file_id,
        ) in excluded or s.file_size_bytes >= options.small_file_bytes:
            continue
        by_partition.setdefault(s.partition_path, []).append(s)
    chosen: dict[str, tuple[FileSlice, ...]] = {}
    for p, ss in sorted(by_partition.items()):
        taken: list[FileSlice] = []
        total = 0
        oldest_first = sorted(ss, key=lambda s: (s.instant_time, s.file_id))
        due = tiered_selection(
            [s.file_size_bytes for s in oldest_first],
            target=options.target_file_bytes,
            ratio=options.tier_ratio,
            min_files=options.min_files,
        )
        for s in (oldest_first[i] for i in due):
            if taken and total + s.file_size_bytes > options.max_bytes:
                break
            taken.append(s)
            total += s.file_size_bytes
        if len(taken) >= options.min_files:
            chosen[p] = tuple(taken)
    return chosen


def schedule_clustering(
    table: HudiTable, control: CommitControl, options: ClusteringOptions
) -> ClusteringPlan | None:
    """Under the lock: choose the slices, begin the replacecommit with a heartbeat, store the
    plan. None when no partition has enough small files, and always for a table with a bucket
    index: a bucket's file id is its address (writers find a key's file group by the bucket
    number in its id), so its file groups are never rewritten into others."""
    if table.config.bucket_count is not None:
        log.info(
            "table %s: no clustering: its file groups are the buckets of its bucket index",
            table.config.name,
        )
        return None
    tx = TableTransaction(
        HudiFormat(table), control, writer_id=SERVICES_WRITER_ID, action=Action.REPLACE_COMMIT
    )
    with tx.locked():
        timeline = table.timeline()
        excluded: set[FileGroupId] = set()
        for inst in timeline.inflight_or_requested(Action.REPLACE_COMMIT):
            excluded |= pending_clustering_groups(table, inst.time)
        latest = FileSystemView(table, timeline=timeline).latest_base_files()
        chosen = choose_slices(latest, frozenset(excluded), options)
        if not chosen:
            return None

        def store_plan(t: InstantTime) -> None:
            planned = ClusteringPlan(t, chosen)
            write_json(
                table,
                plan_path(table, CLUSTERING_PLANS, t),
                {
                    "file_groups": sorted(planned.file_groups),
                    "files": [s.path for s in _all(planned)],
                },
            )

        t = tx.begin_locked(
            requested_content=_java_plan(table, chosen),
            intent=store_plan,
        )
        plan = ClusteringPlan(t, chosen)
    log.info(
        "table %s: scheduled clustering %s of %d small files in %d partitions",
        table.config.name,
        t,
        plan.file_count,
        len(chosen),
    )
    return plan


def _java_plan(table: HudiTable, chosen: Mapping[str, Sequence[FileSlice]]) -> bytes:
    """The plan as Hudi's `HoodieRequestedReplaceMetadata`, for Java Hudi writers."""
    groups = {
        p: [PlannedSlice(s.partition_path, s.file_id, f"{table.uri}/{s.path}") for s in slices]
        for p, slices in chosen.items()
    }
    return clustering_plan_bytes(groups, {"lakesink.clustering": "true"})


def _all(plan: ClusteringPlan) -> list[FileSlice]:
    return [s for ss in plan.slices.values() for s in ss]


def _read_rows(table: HudiTable, slices: Sequence[FileSlice]) -> pa.Table:
    fs, root = table.storage.arrow()
    parts = [pq.read_table(f"{root}/{s.path}", filesystem=fs, partitioning=None) for s in slices]
    rows = pa.concat_tables(parts, promote_options="default")
    order = pc.sort_indices(
        rows,
        sort_keys=[("_hoodie_commit_time", "ascending"), ("_hoodie_commit_seqno", "ascending")],
    )
    return rows.take(order)


def execute_clustering(
    table: HudiTable,
    control: CommitControl,
    plan: ClusteringPlan,
    options: ClusteringOptions,
    strategy: ConflictStrategy | None = None,
) -> ClusteringResult:
    """Rewrite the planned slices and publish the replacecommit; on any failure (a conflict
    included) roll the instant back so nothing of it stays visible, and re-raise."""
    rules: ConflictStrategy = strategy or FileGroupOverlap()
    t = plan.instant_time
    tx = TableTransaction.resume(
        HudiFormat(table),
        control,
        t,
        writer_id=SERVICES_WRITER_ID,
        action=Action.REPLACE_COMMIT,
        state=TxState.ACTIVE,
    )
    skip: frozenset[FileGroupId] = frozenset()
    try:
        with tx:  # on any failure (a conflict included) rolled back, nothing of it visible
            planned = Operation(t, OperationKind.CLUSTERING, replaced=plan.file_groups)
            skip = rules.clustering_skips(planned, concurrent_operations(table, t))
            work = plan.without(skip, options.min_files) if skip else plan
            if not work.slices:
                raise _NothingLeft(f"every planned file group of clustering {t} was skipped")
            writes = []
            rows = 0
            schema = ""
            for partition, slices in work.slices.items():
                writer = BaseFileWriter(
                    table,
                    partition,
                    t,
                    write_token(0, 0, 0),
                    target_file_size_bytes=options.target_file_bytes,
                    preserve_commit_time=True,
                )
                data = _read_rows(table, slices)
                writer.write(data)
                writes.extend(writer.close())
                rows += data.num_rows
                schema = schema or (writer.avro_schema or "")
            replaced: dict[str, list[str]] = {}
            for s in _all(work):
                replaced.setdefault(s.partition_path, []).append(s.file_id)
            ours = Operation(
                t,
                OperationKind.CLUSTERING,
                written=frozenset((w.partition_path, w.file_id) for w in writes),
                replaced=work.file_groups,
                phase=Phase.PENDING,
                writer=SERVICES_WRITER_ID,
            )
            metadata = CommitMetadata(
                operation_type="CLUSTER",
                writes=tuple(writes),
                replaced_file_ids={p: tuple(ids) for p, ids in replaced.items()},
                schema=TableSchema.from_text(schema or (tx.format.schema() or "")),
                extra={WRITER_ID_KEY: SERVICES_WRITER_ID},
            )
            pause_point("clustering-written")  # a test-only hook: a batch commits meanwhile
            done = tx.commit(metadata, (WriterStillLive(control, t), NoConflicts(ours, rules)))
    except _NothingLeft:
        return ClusteringResult(None, skipped=skip)
    finally:
        table.storage.delete(plan_path(table, CLUSTERING_PLANS, t))
    log.info(
        "table %s: clustering %s rewrote %d files into %d (%d rows)",
        table.config.name,
        t,
        work.file_count,
        len(writes),
        rows,
    )
    return ClusteringResult(done.instant, work.file_count, len(writes), rows, skip)


def refuse_merge_on_read(table: HudiTable) -> None:
    """Clustering rewrites base files only: on a merge-on-read table it would drop the rows of
    the slices' log files. Compaction is the way to rewrite such a table's slices."""
    if table.config.table_type == "MERGE_ON_READ":
        raise UnsupportedTableError(
            f"table {table.uri} is merge-on-read: lakesink does not cluster it; "
            "`lakesink table compact` rewrites its file slices into new base files"
        )


def cluster(
    table: HudiTable,
    control: CommitControl,
    options: ClusteringOptions | None = None,
    strategy: ConflictStrategy | None = None,
) -> ClusteringResult:
    """Schedule and run one clustering; an instant of None when there was nothing to do.
    UnsupportedTableError for a merge-on-read table (see `refuse_merge_on_read`)."""
    refuse_merge_on_read(table)
    options = options or ClusteringOptions()
    plan = schedule_clustering(table, control, options)
    if plan is None:
        return ClusteringResult(None)
    return execute_clustering(table, control, plan, options, strategy)
