"""Maintenance of lakesink's Iceberg tables, each action one catalog commit (Iceberg's own
procedure names): `expire-snapshots`, `rewrite-data-files`, `remove-orphan-files`.

- expire-snapshots: snapshots older than the retention go, except the current one and each
  writer's newest commit (its offsets stay readable: recovery needs them);
- rewrite-data-files: small data files of a partition are rewritten into target-size files in
  one REPLACE snapshot (summary `lakesink.maintenance=rewrite-data-files`); a rewrite that lost a
  file to a concurrent delete or rewrite is planned again on fresh metadata, concurrent appends
  never conflict with it and stay in the table;
- remove-orphan-files: files under the table's location that nothing references and that are
  older than a safety window (default 3 days, as Iceberg's) are deleted; files of an in-flight
  batch are younger than the window or named by it, and never deleted.

Defaults come from the `table.services.*` keys that the Hudi services use:
`table.services.clean.retain.hours` (expire older than; 5 days, Iceberg's default, when unset),
`table.services.orphans.retain.hours` (the orphan safety window), `table.services.clustering.
small.file.bytes` and `.min.files` (rewrite threshold) and `table.target.file.size.bytes`
(rewrite target). Inline, after every N commits (`table.services.inline.every.commits`, on by
default), the writer's post-commit hook (`iceberg_maintenance_hook`) runs what
`table.services.inline` names:
Iceberg's names, or the Hudi services' (`clean` = expire-snapshots then remove-orphan-files,
`cluster` = rewrite-data-files; `archive` has no Iceberg counterpart and is skipped). On a
merge-on-read table of keys, `iceberg.services.rewrite.delete.files` also runs rewrite-data-files
(which applies the position deletes first) after any commit that leaves that many delete files
live: each batch reads its buckets' delete files, so their number, not the commits counted,
drives its cost. Inline,
orphan removal also spares the files of the writer's own batches in flight, whatever their age.
An action that fails or keeps losing to concurrent commits is logged and given up until the next
run: it never fails the batch it follows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from lakesink.engine.service_process import ServiceProcess
from lakesink.engine.services import ServicesRunner
from lakesink.errors import CommitError, ConfigError
from lakesink.formats.iceberg.errors import LostToConcurrentCommitError
from lakesink.formats.iceberg.replan import commit_replanned
from lakesink.formats.iceberg.rewrite import RewriteOptions, plan_rewrite, replace_files
from lakesink.formats.iceberg.snapshots import KEY_LAYOUT, KEY_MAINTENANCE, LAYOUT
from lakesink.protocol.instant import InstantTime
from lakesink.settings import Settings

if TYPE_CHECKING:
    from lakesink.formats.iceberg.table import AppendResult, IcebergTable

log = logging.getLogger(__name__)

__all__ = [
    "ACTIONS",
    "ExpireResult",
    "IcebergMaintenanceOptions",
    "MaintenanceRun",
    "OrphanResult",
    "RewriteResult",
    "expire_snapshots",
    "iceberg_maintenance_hook",
    "inline_actions",
    "live_delete_files",
    "remove_orphan_files",
    "rewrite_data_files",
    "run_iceberg_maintenance",
]

EXPIRE = "expire-snapshots"
REWRITE = "rewrite-data-files"
ORPHANS = "remove-orphan-files"
ACTIONS = (EXPIRE, REWRITE, ORPHANS)
_HUDI_NAMES = {"clean": (EXPIRE, ORPHANS), "cluster": (REWRITE,), "archive": ()}
DEFAULT_EXPIRE_HOURS = 5 * 24.0
DEFAULT_ORPHAN_HOURS = 3 * 24.0


@dataclass(frozen=True, slots=True)
class IcebergMaintenanceOptions:
    """What the maintenance actions keep, take and write."""

    expire_older_than_hours: float = DEFAULT_EXPIRE_HOURS
    """Snapshots older than this many hours are expired (each writer's newest kept)."""
    rewrite: RewriteOptions = field(
        default_factory=lambda: RewriteOptions(100 * 1024 * 1024, 128 * 1024 * 1024)
    )
    """Which small files are rewritten and into which size."""
    orphan_older_than_hours: float = DEFAULT_ORPHAN_HOURS
    """Unreferenced files younger than this safety window are kept (in-flight batches)."""

    def __post_init__(self) -> None:
        for name in ("expire_older_than_hours", "orphan_older_than_hours"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be >= 0 hours, got {getattr(self, name)}")

    @classmethod
    def from_settings(cls, settings: Settings) -> IcebergMaintenanceOptions:
        """The defaults of the `table.services.*` keys and `table.target.file.size.bytes`."""
        hours = settings.services.clean_retain_hours
        return cls(
            expire_older_than_hours=float(hours) if hours is not None else DEFAULT_EXPIRE_HOURS,
            orphan_older_than_hours=float(settings.services.orphans_retain_hours),
            rewrite=RewriteOptions(
                small_file_bytes=settings.services.clustering_small_file_bytes,
                target_file_bytes=settings.table.target_file_size_bytes,
                min_files=max(2, settings.services.clustering_min_files),
                tier_ratio=settings.services.clustering_tier_ratio,
            ),
        )


@dataclass(frozen=True, slots=True)
class ExpireResult:
    """The snapshots one expiry removed."""

    expired: tuple[int, ...]
    retained: int


@dataclass(frozen=True, slots=True)
class RewriteResult:
    """What one rewrite replaced: its snapshot (None: nothing to do), files and rows."""

    snapshot_id: int | None
    files_before: int
    files_after: int
    rows: int
    attempts: int
    removed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class OrphanResult:
    """The orphan files one run deleted."""

    deleted: tuple[str, ...]


def expire_snapshots(
    table: IcebergTable, older_than_hours: float, *, now_ms: int | None = None
) -> ExpireResult:
    """Expire the table's snapshots older than `older_than_hours`, keeping the current one and
    each writer's newest commit; one catalog commit (retried on a concurrent commit)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    cutoff = now - int(older_than_hours * 3_600_000)
    expired = table.expire_snapshots(
        cutoff, summary={KEY_MAINTENANCE: EXPIRE, "older-than-ms": str(cutoff)}
    )
    return ExpireResult(tuple(expired), len(table.pyiceberg.metadata.snapshots))


def rewrite_data_files(
    table: IcebergTable,
    options: RewriteOptions,
    *,
    max_attempts: int = 5,
    sleep: Callable[[float], None] = time.sleep,
) -> RewriteResult:
    """Rewrite the table's small data files into target-size ones in one REPLACE snapshot.

    Planned on fresh metadata; when a file it replaces was deleted or rewritten concurrently,
    its new files are deleted and it plans again (lakesink.formats.iceberg.replan: up to
    `max_attempts`; CommitError after)."""
    attempts = 0

    def attempt() -> RewriteResult:
        nonlocal attempts
        attempts += 1
        return _rewrite_once(table, options, attempts)

    try:
        return commit_replanned(
            attempt, attempts=max_attempts, what=f"table {table.name}: {REWRITE}", sleep=sleep
        )
    except LostToConcurrentCommitError as e:
        log.warning(
            "table %s: rewrite-data-files gave up after losing to concurrent commits %d times; "
            "nothing was replaced (the rows are untouched)", table.name, max_attempts,
        )  # fmt: skip
        raise CommitError(
            f"table {table.name}: rewrite-data-files lost to concurrent commits {max_attempts} "
            "times; run it again"
        ) from e


def _rewrite_once(table: IcebergTable, options: RewriteOptions, attempt: int) -> RewriteResult:
    """One attempt of `rewrite_data_files`: plan on fresh metadata, rewrite, commit."""
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    table.refresh()
    summary = {
        KEY_LAYOUT: LAYOUT,
        KEY_MAINTENANCE: REWRITE,
        "lakesink.rewrite.small-file-bytes": str(options.small_file_bytes),
        "lakesink.rewrite.target-file-bytes": str(options.target_file_bytes),
    }
    applied = _apply_deletes(table, options, summary)
    groups = plan_rewrite(table.pyiceberg, options)
    if not groups:
        if applied is not None:
            return replace(applied, attempts=attempt)
        log.info("table %s: rewrite-data-files: nothing to do", table.name)
        return RewriteResult(None, 0, 0, 0, attempt)
    before = sum(len(g.files) for g in groups)
    try:
        out = replace_files(table.pyiceberg, groups, options, summary)
    except (ValidationException, CommitFailedException) as e:
        log.info(
            "table %s: rewrite-data-files lost to a concurrent commit (%s); planning again",
            table.name,
            str(e).splitlines()[0] if str(e) else type(e).__name__,
        )
        raise LostToConcurrentCommitError(
            f"table {table.name}: rewrite-data-files lost to a concurrent commit"
        ) from e
    table.refresh()
    log.info(
        "table %s: rewrite-data-files replaced %d files by %d (%d rows) in snapshot %s",
        table.name, before, len(out.added), out.rows, out.snapshot_id,
    )  # fmt: skip
    if applied is not None:  # both: the deletes' snapshot, then the small files'
        return RewriteResult(
            out.snapshot_id,
            applied.files_before + before,
            applied.files_after + len(out.added),
            applied.rows + out.rows,
            attempt,
            applied.removed + out.removed,
            applied.added + out.added,
        )
    return RewriteResult(
        out.snapshot_id, before, len(out.added), out.rows, attempt, out.removed, out.added
    )


def _apply_deletes(
    table: IcebergTable, options: RewriteOptions, summary: dict[str, str]
) -> RewriteResult | None:
    """A merge-on-read table's position deletes applied first (lakesink.formats.iceberg.
    rowdelta): the data files with deletes rewritten without the deleted rows, one REPLACE
    snapshot; None when no data file has deletes."""
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    from lakesink.formats.iceberg.rowdelta import apply_position_deletes

    try:
        out = apply_position_deletes(
            table.pyiceberg,
            {**summary, "lakesink.rewrite.applies": "position-deletes"},
            options.target_file_bytes,
        )
    except (ValidationException, CommitFailedException) as e:
        raise LostToConcurrentCommitError(
            f"table {table.name}: applying position deletes lost to a concurrent commit"
        ) from e
    if out is None:
        return None
    table.refresh()
    log.info(
        "table %s: rewrite-data-files applied %d delete files to %d data files (%d rows) in "
        "snapshot %s", table.name, out.delete_files, out.data_files, out.rows, out.snapshot_id,
    )  # fmt: skip
    return RewriteResult(
        out.snapshot_id, out.data_files, len(out.added), out.rows, 0, out.removed, out.added
    )


def remove_orphan_files(
    table: IcebergTable,
    older_than_hours: float,
    *,
    in_flight: Sequence[str] = (),
    now: float | None = None,
    storage_options: object = None,
) -> OrphanResult:
    """Delete unreferenced files older than the safety window (never one in `in_flight`)."""
    deleted = table.remove_orphan_files(
        older_than_hours * 3600.0, now=now, storage_options=storage_options, in_flight=in_flight
    )
    return OrphanResult(tuple(deleted))


@dataclass
class MaintenanceRun:
    """What one run of several actions did; a failed action is recorded, not raised."""

    expire: ExpireResult | None = None
    rewrite: RewriteResult | None = None
    orphans: OrphanResult | None = None
    errors: list[str] = field(default_factory=list)


def inline_actions(names: Sequence[str]) -> tuple[str, ...]:
    """The Iceberg actions that `table.services.inline`'s names stand for, in order."""
    out: list[str] = []
    for name in names:
        mapped = (name,) if name in ACTIONS else _HUDI_NAMES.get(name)
        if mapped is None:
            valid = ", ".join((*ACTIONS, *_HUDI_NAMES))
            raise ConfigError(f"table.services.inline names {name!r}; valid: {valid}")
        out.extend(a for a in mapped if a not in out)
    return tuple(out)


def run_iceberg_maintenance(
    table: IcebergTable,
    options: IcebergMaintenanceOptions,
    which: Sequence[str] = ACTIONS,
    *,
    storage_options: object = None,
    in_flight: Callable[[], Collection[str]] | None = None,
) -> MaintenanceRun:
    """Run the named actions once, in order (rewrite before expiry and orphans is the useful
    order: the files it replaced become unreferenced once their snapshots expire). Orphan
    removal spares what `in_flight()` names when it runs (data files of batches in flight)."""
    run = MaintenanceRun()
    for action in inline_actions(which):
        try:
            if action == EXPIRE:
                run.expire = expire_snapshots(table, options.expire_older_than_hours)
            elif action == REWRITE:
                run.rewrite = rewrite_data_files(table, options.rewrite)
            else:
                run.orphans = remove_orphan_files(
                    table,
                    options.orphan_older_than_hours,
                    storage_options=storage_options,
                    in_flight=tuple(in_flight()) if in_flight is not None else (),
                )
        except Exception as e:  # inline maintenance must never fail a published commit
            log.warning(
                "table %s: %s failed, given up until the next run: %s", table.name, action, e
            )
            run.errors.append(f"{action}: {e}")
    return run


def iceberg_maintenance_hook(
    table: IcebergTable,
    settings: Settings,
    *,
    in_flight: Callable[[], Collection[str]] | None = None,
    runner: ServicesRunner | None = None,
) -> Callable[[AppendResult | InstantTime], MaintenanceRun | None]:
    """The post-commit hook for inline maintenance: after every `table.services.inline.every.
    commits` commits that landed (counted in this process), run `table.services.inline`'s
    actions. The engine calls it with the instant time of a commit it published; called with
    an `IcebergTable` commit result, only a new snapshot counts (not a replay). `in_flight`:
    the data files of the writer's batches in flight (orphan removal spares them). `runner`
    (`table.services.run=beside`): its thread hands the actions to a process of their own
    (`ServiceProcess`, which opens the table of `settings`: pyiceberg's pure-Python work on a
    thread of the driver held the interpreter's lock the batches' commits need), beside the
    next batch; the catalog orders their commits and the writer's as it does any two
    processes'. A run with remove-orphan-files under
    a window of less than `BESIDE_MIN_ORPHAN_HOURS` stays in the hook, whole (the files a
    batch's tasks are writing are known to nobody until they report: the window is what
    spares them). Never raises; None when nothing ran or the run was handed over."""
    from lakesink.formats.iceberg.table import CommitOutcome

    every = settings.services.inline_every_commits
    which = inline_actions(tuple(settings.services.inline))
    deletes_at = settings.iceberg.rewrite_delete_files
    options = IcebergMaintenanceOptions.from_settings(settings)
    storage = settings.storage
    count = 0
    orphans_before = options.orphan_older_than_hours < BESIDE_MIN_ORPHAN_HOURS
    orphans_every_s = settings.services.orphans_every_hours * 3600.0
    orphans_last: float | None = None  # when this process last ran (or handed over) them
    process = ServiceProcess(f"table {table.name}") if runner is not None else None

    def beside(actions: Sequence[str]) -> MaintenanceRun:
        assert process is not None
        spared = tuple(in_flight()) if in_flight is not None else ()
        return process.call(run_maintenance_here, settings, tuple(actions), spared)

    def run(actions: Sequence[str]) -> MaintenanceRun | None:
        if runner is None or (orphans_before and ORPHANS in inline_actions(actions)):
            # all of them, in their order: orphan removal after the expiry it follows
            return run_here(actions)
        # one job of each kind waits at most: the later run covers both
        runner.submit(f"iceberg {','.join(actions)}", lambda: beside(actions))
        return None

    def run_here(actions: Sequence[str]) -> MaintenanceRun | None:
        try:
            done = run_iceberg_maintenance(
                table, options, actions, storage_options=storage, in_flight=in_flight
            )
        except Exception:  # never fail a published commit
            log.exception("table %s: inline maintenance failed", table.name)
            return None
        _log_run(table.name, "inline maintenance", actions, done)
        return done

    def due_actions() -> tuple[str, ...]:
        """`which`, less remove-orphan-files while it ran within table.services.orphans.every.
        hours."""
        nonlocal orphans_last
        if ORPHANS not in which:
            return which
        now = time.monotonic()
        if orphans_last is not None and now - orphans_last < orphans_every_s:
            return tuple(a for a in which if a != ORPHANS)
        orphans_last = now
        return which

    def hook(result: AppendResult | InstantTime) -> MaintenanceRun | None:
        nonlocal count
        landed = isinstance(result, InstantTime) or result.outcome is CommitOutcome.COMMITTED
        if not landed:
            return None
        done, due = None, False
        if every > 0:
            count += 1
            if count >= every:
                count, due = 0, True
                actions = due_actions()
                done = run(actions) if actions else None
        if deletes_at <= 0 or (
            due and (done is not None or runner is not None) and REWRITE in which
        ):
            return done  # no trigger, or the scheduled run applied the deletes (or gave up)
        deletes = live_delete_files(table)
        if deletes is not None and deletes >= deletes_at:
            log.info(
                "table %s: %d position-delete files live (iceberg.services.rewrite.delete."
                "files=%d): applying them", table.name, deletes, deletes_at,
            )  # fmt: skip
            return run((REWRITE,))
        return done

    return hook


_here: tuple[Settings, IcebergTable] | None = None
"""The table the services' process opened last, with the settings it was opened from."""


def run_maintenance_here(
    settings: Settings, actions: Sequence[str], in_flight: Collection[str]
) -> MaintenanceRun:
    """`actions` on the Iceberg table of `settings`, in the services' process of its writer
    (`table.services.run=beside`; `ServiceProcess`): the table is opened once and refreshed
    for each run; its commits meet the writer's at the catalog, as two processes' do.
    `in_flight`: the writer's batches' data files when the run was handed over."""
    from lakesink.formats.iceberg.format import open_iceberg_table

    global _here
    if _here is not None and _here[0] == settings:
        table = _here[1]
        table.refresh()
    else:
        table = open_iceberg_table(settings, create=False)
        _here = (settings, table)
    done = run_iceberg_maintenance(
        table,
        IcebergMaintenanceOptions.from_settings(settings),
        actions,
        storage_options=settings.storage,
        in_flight=lambda: in_flight,
    )
    _log_run(table.name, "maintenance beside the batches", actions, done)
    return done


def _log_run(table: str, what: str, actions: Sequence[str], done: MaintenanceRun) -> None:
    given_up = f" ({len(done.errors)} given up: {'; '.join(done.errors)})" if done.errors else ""
    log.info("table %s: %s ran %s%s", table, what, ", ".join(actions), given_up)


BESIDE_MIN_ORPHAN_HOURS = 1.0
"""remove-orphan-files runs beside the batches only with a window at least this long: a batch
takes seconds, a window of an hour spares its files by a wide margin."""


def live_delete_files(table: IcebergTable) -> int | None:
    """The delete files the table's current snapshot keeps live, from its summary's totals
    (None when it has no snapshot or the summary no total: another engine's)."""
    snapshot = table.pyiceberg.current_snapshot()
    total = snapshot.summary.get("total-delete-files") if snapshot and snapshot.summary else None
    try:
        return int(total) if total is not None else None
    except ValueError:
        return None
