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
    from pyiceberg.table import Table, Transaction
    from pyiceberg.table.metadata import TableMetadata

__all__ = ["commit_on_base", "commit_unretried", "require_main_unmoved", "transaction"]


def transaction(table: Table) -> Transaction:
    """A pyiceberg transaction on `table` whose metadata with the staged changes is computed
    once per change staged. pyiceberg's own recomputes it, with a deep copy of the whole
    metadata, every time a snapshot producer or requirement reads it (about twenty times per
    commit), so a commit's cost grew with every snapshot the table kept (issue 30)."""
    return _memo_transaction_type()(table)


def _memo_transaction_type() -> type[Transaction]:
    """The Transaction subclass of `transaction`, built on first use (pyiceberg is optional)."""
    global _MEMO_TRANSACTION
    if _MEMO_TRANSACTION is not None:
        return _MEMO_TRANSACTION
    from pyiceberg.table import Transaction

    class MemoTransaction(Transaction):
        _memo: tuple[object, object, TableMetadata] | None = None

        @property
        def table_metadata(self) -> TableMetadata:
            # the base metadata and the staged updates (an immutable tuple, replaced on every
            # stage) name the result; pyiceberg's metadata models are frozen, so one copy serves
            base, updates = self._table.metadata, self._updates
            memo = self._memo
            if memo is None or memo[0] is not base or memo[1] is not updates:
                memo = (base, updates, Transaction.table_metadata.fget(self))  # type: ignore[attr-defined]
                self._memo = memo
            return memo[2]

    _MEMO_TRANSACTION = MemoTransaction
    return MemoTransaction


_MEMO_TRANSACTION: type[Transaction] | None = None


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
