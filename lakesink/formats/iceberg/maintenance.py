"""Orphan files of an Iceberg table: what its retained metadata references, and the removal of
everything else under its location that is older than a safety window.

Files of failed task attempts, of commits that did not land, and of snapshots that expiry
removed are referenced by nothing. A file younger than the window may belong to a batch that is
being written or committed right now, so it is always spared.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from lakesink.storage import ObjectStoreOptions, open_storage

if TYPE_CHECKING:
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

__all__ = ["referenced_files", "remove_orphans"]


def _norm(path: str) -> str:
    """A location without its scheme's authority quirks: `file:/x`, `file:///x` and `/x` alike."""
    if path.startswith("file:"):
        path = path[len("file:") :]
        while path.startswith("//"):
            path = path[1:]
    if path.startswith("s3a://"):
        path = "s3://" + path[len("s3a://") :]
    return path


def referenced_files(table: Table) -> set[str]:
    """Every file the table's current metadata reaches: the metadata file and those in its
    log, manifest lists, manifests and data/delete files of every retained snapshot, and
    statistics files."""
    meta = table.metadata
    io = table.io
    out: set[str] = {table.metadata_location}
    out.update(entry.metadata_file for entry in meta.metadata_log)
    out.update(s.statistics_path for s in meta.statistics)
    out.update(s.statistics_path for s in meta.partition_statistics)
    seen_manifests: set[str] = set()
    for snapshot in meta.snapshots:
        out.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            out.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                out.add(entry.data_file.file_path)
    return {_norm(p) for p in out}


def _modified(storage: Any, key: str) -> float:
    """The object's modification time when the listing did not carry one; a vanished object
    counts as fresh (it is not deleted)."""
    head = storage.head(key)
    return float("inf") if head is None or not head.modified else float(head.modified)


def remove_orphans(
    location: str,
    keep: set[str],
    *,
    older_than_s: float,
    now: float,
    storage_options: ObjectStoreOptions | dict[str, Any] | None = None,
    in_flight: Iterable[str] = (),
    recheck: Callable[[], set[str]] | None = None,
) -> list[str]:
    """Delete every file under `location` that is not in `keep` (normalised locations), not
    named by an in-flight batch (`in_flight`) and was last modified more than `older_than_s`
    seconds before `now`. `recheck`, called after the listing, returns what the table references
    then: a batch that committed while the listing ran keeps its files. Returns what it
    deleted."""
    if older_than_s < 0:
        raise ValueError(f"older_than_s must be >= 0, got {older_than_s}")
    spared = {_norm(p) for p in in_flight}
    root = location.rstrip("/")
    storage = open_storage(root, storage_options)
    prefix = _norm(root)
    doomed: list[str] = []
    for meta in storage.list_prefix(""):
        full = prefix + "/" + meta.key
        if full in keep or full in spared:
            continue
        modified = meta.modified or _modified(storage, meta.key)
        if modified > now - older_than_s:
            continue
        doomed.append(meta.key)
    if doomed and recheck is not None:
        now_kept = recheck()
        doomed = [k for k in doomed if prefix + "/" + k not in now_kept]
    storage.delete_many(doomed)
    if doomed:
        log.info("table at %s: removed %d orphan files", storage.uri, len(doomed))
    return [prefix + "/" + k for k in doomed]
