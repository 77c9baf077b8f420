"""Commits that land only on the snapshot their caller checked: the append for a catalog that
cannot run lakesink's offsets requirement, the overwrite and row delta of a table of keys, the
application of position deletes.

pyiceberg retries a commit the catalog refused by moving its snapshot onto the new head of
`main`, which would skip what the caller checked on the old head (the writer's offsets, the
buckets' files). These commits require `main` not to have moved and run without that retry: a
refused commit raises, its manifests are deleted, and the caller plans again on fresh metadata.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyiceberg.table import Transaction

__all__ = ["commit_on_base", "commit_unretried", "require_main_unmoved"]


def require_main_unmoved(tx: Transaction) -> None:
    """Stage in `tx` the requirement that `main` is still the snapshot of `tx`'s metadata (the
    catalog refuses the commit otherwise, CommitFailedException)."""
    from pyiceberg.table.refs import MAIN_BRANCH
    from pyiceberg.table.update import AssertRefSnapshotId

    main = tx.table_metadata.refs.get(MAIN_BRANCH)
    base = AssertRefSnapshotId.model_validate(
        {"ref": MAIN_BRANCH, "snapshot-id": main.snapshot_id if main is not None else None}
    )
    tx._stage((), (base,))


def commit_unretried(tx: Transaction) -> None:
    """Commit `tx` without pyiceberg's retry (it runs only for a transaction with snapshot
    producers, so they are taken out); the manifests of a refused commit are deleted."""
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    producers = list(getattr(tx, "_snapshot_producers", ()))
    tx._snapshot_producers = []
    try:
        tx.commit_transaction()
    except (CommitFailedException, ValidationException):
        for p in producers:
            p._clean_all_uncommitted()
        raise


def commit_on_base(tx: Transaction) -> None:
    """Commit `tx`, refused by the catalog when `main` moved since its metadata was read: the
    caller plans again."""
    require_main_unmoved(tx)
    commit_unretried(tx)
