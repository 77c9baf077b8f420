"""The table services keys (table.services.*): clean, orphan files, clustering, archival,
inline runs, the conflict rule."""

from __future__ import annotations

from lakesink.config.parsers import (
    Key,
    choice,
    non_negative_float,
    non_negative_int,
    optional_positive_float,
    optional_positive_int,
    positive_int,
    str_list,
)
from lakesink.settings import DEFAULT_CLUSTERING_MAX_BYTES, DEFAULT_CLUSTERING_TIER_RATIO

DEFAULT_INLINE_EVERY_COMMITS = 10
"""Inline services are on by default (a streaming writer otherwise leaves many small files and a
growing timeline), every 10 commits: often enough to bound both, rarely enough that their cost
spreads over many commits."""

DEFAULT_ORPHANS_EVERY_HOURS = 1.0
"""Inline orphan removal at most hourly: against a 3-day window an hour's delay is nothing, and
each run lists the table and reads every retained snapshot's manifests (inline every 10
commits over five minutes at ~90,000 records/s it held batches up to 3 s: p99 4.16 s against
0.97 s without it, benchmarks/README.md, session 10)."""

SMALL_FILE_FRACTION = 0.75
"""Unset `table.services.clustering.small.file.bytes`: this fraction of the target file size."""


def small_file_bytes(configured: int | None, target_file_bytes: int) -> int:
    """The clustering threshold: the configured one, else a fraction of the target size (a
    file clustering wrote, near the target, must not count as small)."""
    return (
        configured
        if configured is not None
        else max(1, int(target_file_bytes * SMALL_FILE_FRACTION))
    )


def tier_ratio(v: object) -> int:
    n = non_negative_int(v)
    if n == 1:
        raise ValueError("expected 0 (no tiers) or a whole number of at least 2")
    return n


SERVICE_KEYS: tuple[Key, ...] = (
    Key(
        "table.services.clean.retain.commits",
        positive_int,
        30,
        "The cleaner keeps file versions needed by this many latest commits.",
    ),
    Key(
        "table.services.clean.retain.hours",
        optional_positive_float,
        None,
        "The cleaner also keeps file versions needed by commits of this many last hours.",
    ),
    Key(
        "table.services.orphans.retain.hours",
        non_negative_float,
        72.0,
        "Iceberg tables: remove-orphan-files (inline, in `clean`) keeps unreferenced files "
        "younger than this many hours, so files of batches other writers are still writing "
        "or committing survive: keep it longer than any writer's batch takes.",
    ),
    Key(
        "table.services.orphans.every.hours",
        non_negative_float,
        DEFAULT_ORPHANS_EVERY_HOURS,
        "Iceberg tables: inline remove-orphan-files runs at most once per this many hours in a "
        "writer process (its first due run always runs); 0: at every inline run. It reads "
        "every retained snapshot's manifests, a cost that grows with the table, while only "
        "files older than table.services.orphans.retain.hours (3 days) can go: more frequent "
        "runs find next to nothing new.",
    ),
    Key(
        "table.services.inline.every.commits",
        non_negative_int,
        DEFAULT_INLINE_EVERY_COMMITS,
        "Run table services (clean, cluster, archive) after every N commits of the writer's "
        "table (deltacommits on a merge-on-read table); 0 turns all of them off. Merge-on-read "
        "compaction is not one of them: it follows table.compaction.every.commits and runs "
        "first. Iceberg tables run their maintenance (table.services.inline) the same way.",
    ),
    Key(
        "table.services.inline",
        str_list,
        ("clean", "cluster", "archive"),
        "Which services run inline, in this order: clean, cluster, archive (a merge-on-read "
        "table skips cluster: compaction rewrites its file slices). Iceberg tables: "
        "clean = expire-snapshots then remove-orphan-files, cluster = rewrite-data-files "
        "(archive is skipped), or Iceberg's own action names.",
    ),
    Key(
        "table.services.run",
        choice("beside", "before"),
        "beside",
        "When the services table.services.inline names run once due: beside (default) on a "
        "thread of the writer's driver (an Iceberg table's in a process of their own, started "
        "by the writer) while the next batches go on, under the table lock and "
        "conflict rules a services command run beside the writer takes, so a long clustering "
        "or rewrite never holds fresh records back; or before: after the commit that made "
        "them due and before the next batch starts (deterministic, for tests). The services of "
        "tables of keys (write.operation upsert) and of Hudi merge-on-read tables, and an "
        "Iceberg run that includes remove-orphan-files under a "
        "table.services.orphans.retain.hours of less than 1, always run before.",
    ),
    Key(
        "table.services.clustering.small.file.bytes",
        optional_positive_int,
        None,
        "Clustering rewrites base files smaller than this (into table.target.file.size.bytes); "
        "unset: three quarters of table.target.file.size.bytes, so files clustering wrote, "
        "near the target size, are never rewritten again.",
    ),
    Key(
        "table.services.clustering.min.files",
        positive_int,
        2,
        "Clustering rewrites a partition only if it has at least this many small files.",
    ),
    Key(
        "table.services.clustering.tier.ratio",
        tier_ratio,
        DEFAULT_CLUSTERING_TIER_RATIO,
        "Inline clustering (Hudi) and rewrite-data-files (Iceberg) take a partition's small "
        "files by size tier, tiers this many times apart below table.target.file.size.bytes "
        "(and one tier for the smallest), a tier once it holds this many files (and "
        "table.services.clustering.min.files): under a stream a byte is then rewritten a few "
        "times, not once per run, and a partition keeps fewer than this many small files per "
        "tier between runs. 0: every small file of a partition at every run (the most "
        "compact table, the most rewriting). `lakesink table cluster` and `lakesink iceberg "
        "rewrite-data-files` take every small file.",
    ),
    Key(
        "table.services.clustering.max.bytes",
        positive_int,
        DEFAULT_CLUSTERING_MAX_BYTES,
        "One clustering rewrites at most this many bytes of small files per partition, the "
        "oldest first (the rest wait for the next run): it holds them in memory at once. Hudi "
        "tables.",
    ),
    Key(
        "table.services.archive.min.instants",
        positive_int,
        20,
        "Archival keeps at least this many completed instants in the active timeline. Time "
        "travel and incremental reads reach back to the oldest active instant; older instants "
        "are kept under .hoodie/.lakesink/archive/ (the audit still reads them).",
    ),
    Key(
        "table.services.archive.max.instants",
        positive_int,
        30,
        "Archival runs when the active timeline holds more completed instants than this. It "
        "waits for pending instants and for the cleaner to delete files hudi-rs would "
        "otherwise read (failed writes, replaced file groups).",
    ),
    Key(
        "table.services.archive.pack.files",
        positive_int,
        600,
        "Archival gathers the archived timeline files (3 per instant) into one Parquet pack "
        "under .hoodie/.lakesink/archive/timeline/ once this many are loose, so an old table's "
        "archive stays a few dozen files.",
    ),
    Key(
        "table.services.archive.pack.fan.in",
        positive_int,
        10,
        "Archival merges this many packs of one level into one pack of the next level "
        "(size-tiered); at least 2.",
    ),
    Key(
        "table.services.conflict.strategy",
        choice("file-group", "ingestion-first"),
        "file-group",
        "Conflict rule at commit: file-group overlap fails the later commit; ingestion-first "
        "lets ingestion win over clustering.",
    ),
)
