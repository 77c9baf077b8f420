"""Table services run inline by a writer every N commits (`table.services.inline.every.commits`):
clean, cluster and archive, in the configured order, each its own instant under the table lock.
A merge-on-read table first compacts, every `table.compaction.every.commits` deltacommits, then
runs clean and archive every N deltacommits; clustering is skipped there (a merge-on-read
table's file groups are its buckets: compaction rewrites them).

The hook runs after a commit was published: a failing service is logged and never fails the
commit (the batch is already in the table); the next run tries again. With a runner
(`table.services.run=beside`) the hook only decides that the services are due (and records the
run, as inline) and hands the run to the runner's thread: the next batch does not wait for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from lakesink.engine.services import ServicesRunner
from lakesink.errors import ConfigError, LakesinkError
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.instants import SERVICES_DIR
from lakesink.formats.hudi.services.archival import ArchivePolicy, ArchiveResult, archive
from lakesink.formats.hudi.services.clean import CleanResult, RetainPolicy, clean
from lakesink.formats.hudi.services.clustering import ClusteringOptions, ClusteringResult, cluster
from lakesink.formats.hudi.services.compaction import (
    CompactionResult,
    compact,
    deltacommits_since_compaction,
    pending_compactions,
)
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.timeline import Timeline
from lakesink.protocol.conflicts import strategy_named
from lakesink.protocol.instant import Action, InstantTime
from lakesink.settings import Settings

log = logging.getLogger(__name__)

LAST_RUN_FILE = SERVICES_DIR / "inline-last-run"
SERVICE_NAMES = ("clean", "cluster", "archive")


@dataclass
class InlineResult:
    """What one inline run did."""

    clean: CleanResult | None = None
    clustering: ClusteringResult | None = None
    archive: ArchiveResult | None = None
    compaction: CompactionResult | None = None
    errors: list[str] = field(default_factory=list)


def retain_policy(settings: Settings) -> RetainPolicy:
    return RetainPolicy(
        settings.services.clean_retain_commits, settings.services.clean_retain_hours
    )


def clustering_options(settings: Settings) -> ClusteringOptions:
    return ClusteringOptions(
        small_file_bytes=settings.services.clustering_small_file_bytes,
        target_file_bytes=settings.table.target_file_size_bytes,
        min_files=settings.services.clustering_min_files,
        max_bytes=settings.services.clustering_max_bytes,
        tier_ratio=settings.services.clustering_tier_ratio,
    )


def archive_policy(settings: Settings) -> ArchivePolicy:
    try:
        return ArchivePolicy(
            settings.services.archive_min_instants,
            settings.services.archive_max_instants,
            settings.services.archive_pack_files,
            settings.services.archive_pack_fan_in,
            compaction_every_commits=settings.mutation.compaction_every_commits,
        )
    except ValueError as e:
        raise ConfigError(f"table.services.archive.*: {e}") from e


def run_inline_services(
    table: HudiTable,
    settings: Settings,
    control: CommitControl,
    *,
    which: tuple[str, ...] | None = None,
) -> InlineResult:
    """Run the configured services once, in order; each failure is recorded, not raised."""
    result = InlineResult()
    for name in which if which is not None else tuple(settings.services.inline):
        if name == "cluster" and table.config.table_type == "MERGE_ON_READ":
            continue  # refused on merge-on-read tables (see clustering.cluster)
        try:
            if name == "clean":
                result.clean = clean(table, control, retain_policy(settings))
            elif name == "cluster":
                strategy = strategy_named(settings.services.conflict_strategy)
                result.clustering = cluster(table, control, clustering_options(settings), strategy)
            elif name == "archive":
                result.archive = archive(table, control, archive_policy(settings))
            else:
                raise ConfigError(
                    f"table.services.inline names {name!r}; valid: {', '.join(SERVICE_NAMES)}"
                )
        except Exception as e:  # a service must never fail the writer's published commit
            log.warning(
                "table %s: inline %s failed (will retry after the next commits): %s",
                table.config.name,
                name,
                e,
            )
            result.errors.append(f"{name}: {e}")
    return result


def _last_run(table: HudiTable) -> InstantTime | None:
    try:
        return InstantTime(table.storage.read(str(LAST_RUN_FILE)).decode().strip())
    except (OSError, LakesinkError, UnicodeDecodeError):
        return None


class LastRun:
    """The last inline run a writer knows: read from the table once, then kept as the writer
    writes it (one GET per commit less). A run by another writer on the same table is not
    seen: this writer counts from its own, so it may run the services once more per N commits."""

    def __init__(self) -> None:
        self._value: InstantTime | None = None
        self._read = False

    def get(self, table: HudiTable) -> InstantTime | None:
        if not self._read:
            self._value, self._read = _last_run(table), True
        return self._value

    def set(self, t: InstantTime) -> None:
        self._value, self._read = t, True


def commits_since_last_run(
    table: HudiTable,
    begun_on: Timeline | None = None,
    last_run: LastRun | None = None,
) -> int:
    """Commits (deltacommits on a merge-on-read table) completed since the last inline run.
    `begun_on`: the timeline the commit just published began on (listed under the lock): its
    completed commits and this one are counted, with no LIST of its own."""
    last = last_run.get(table) if last_run is not None else _last_run(table)
    action = Action.DELTA_COMMIT if table.config.table_type == "MERGE_ON_READ" else Action.COMMIT
    timeline = begun_on if begun_on is not None else table.timeline()
    done = sum(1 for i in timeline.completed(action) if last is None or i.time > last)
    return done + (1 if begun_on is not None else 0)


def after_commit(
    table: HudiTable,
    settings: Settings,
    control: CommitControl,
    instant_time: InstantTime,
    *,
    begun_on: Timeline | None = None,
    last_run: LastRun | None = None,
    runner: ServicesRunner | None = None,
) -> InlineResult | None:
    """After the writer published `instant_time`: run the services when N commits passed since
    the last run (`commits_since_last_run`); with a `runner`, hand the run to its thread (None
    returned). Never raises."""
    try:
        compacted = None
        if table.config.table_type == "MERGE_ON_READ":
            # compaction first: the slices it supersedes are the cleaner's to delete
            compacted = compact_inline(table, settings, control)
        every = settings.services.inline_every_commits
        if every <= 0 or commits_since_last_run(table, begun_on, last_run) < every:
            return compacted
        table.storage.write(str(LAST_RUN_FILE), instant_time.value.encode())
        if last_run is not None:
            last_run.set(instant_time)
        if runner is not None and compacted is None:  # beside the next batch (never on MOR)
            runner.submit("services", lambda: run_inline_services(table, settings, control))
            return None
        result = run_inline_services(table, settings, control)
        if compacted is not None:
            result.compaction = compacted.compaction
            result.errors[:0] = compacted.errors
        return result
    except Exception:  # never fail a published commit
        log.exception("table %s: inline services after %s failed", table.config.name, instant_time)
        return None


def compact_inline(table: HudiTable, settings: Settings, control: CommitControl) -> InlineResult:
    """A merge-on-read table after a deltacommit: finish a pending compaction, or compact when
    table.compaction.every.commits deltacommits completed since the last compaction."""
    result = InlineResult()
    every = settings.mutation.compaction_every_commits
    try:
        if pending_compactions(table) or (
            every > 0 and deltacommits_since_compaction(table) >= every
        ):
            result.compaction = compact(table, control)
    except Exception as e:  # never fail the published deltacommit: the next one tries again
        log.warning("table %s: inline compaction failed (will retry): %s", table.config.name, e)
        result.errors.append(f"compact: {e}")
    return result


def inline_services_hook(
    table: HudiTable,
    settings: Settings,
    control: CommitControl,
    begun_on: Callable[[InstantTime], Timeline | None] | None = None,
    *,
    runner: ServicesRunner | None = None,
) -> Callable[[InstantTime], InlineResult | None]:
    """The post-commit hook a writer's commits run: `after_commit` with this table's config.
    `begun_on(t)`: the timeline instant `t` began on, when the writer kept it. `runner`: the
    services run on its thread, beside the next batch (`table.services.run=beside`)."""
    last_run = LastRun()

    def hook(instant_time: InstantTime) -> InlineResult | None:
        listed = begun_on(instant_time) if begun_on is not None else None
        return after_commit(
            table,
            settings,
            control,
            instant_time,
            begun_on=listed,
            last_run=last_run,
            runner=runner,
        )

    return hook
