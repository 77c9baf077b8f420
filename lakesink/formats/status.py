"""The format-neutral half of `lakesink status`: what each format's status (its plugin's
`status`) shares, and the pending-commit store of a configuration, which the ingestion
(spark/pipeline.py) opens too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakesink.engine.pending.store import PendingCommitStore
    from lakesink.settings import CommitSettings


def pending_store_for(commit: CommitSettings) -> PendingCommitStore:
    """The pending-commit store that `commit.pending.store` names, for this table."""
    from lakesink.engine.pending.factory import make_pending_store

    path = commit.pending_store_path
    if commit.pending_store == "sqlite":
        path.parent.mkdir(parents=True, exist_ok=True)
    return make_pending_store(commit.pending_store, path=str(path), dsn=commit.postgres_dsn)


def add_pending(commit: CommitSettings, out: dict[str, Any]) -> None:
    """With `commit.mode=async`, the writer's pending epochs and commit lag as `out["pending"]`."""
    if commit.mode != "async":
        return
    from lakesink.engine.async_commit import pending_summary

    store = pending_store_for(commit)
    try:
        out["pending"] = pending_summary(store, commit.writer_id)
    finally:
        store.close()


def print_head(st: dict[str, Any]) -> None:
    """The writer, its partitions (committed, high watermark, lag) and its pending epochs."""
    from lakesink.console import say, table

    say(f"writer {st['writer_id']}")
    rows = [
        [p["partition"], p["committed"], p["high_watermark"], p["lag"]] for p in st["partitions"]
    ]
    say(table(["partition", "committed", "high watermark", "lag"], rows))
    if "pending" in st:
        p = st["pending"]
        lag = "-" if p["commit_lag_s"] is None else f"{p['commit_lag_s']:.1f}s"
        say(
            f"async commit: {len(p['pending_epochs'])} pending epochs, commit lag {lag}, "
            f"last committed epoch {p['latest_committed_epoch']}"
        )
