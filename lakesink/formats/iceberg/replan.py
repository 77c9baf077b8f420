"""Maintenance commits that are planned again after losing to a concurrent commit, through the
engine's one retry loop (lakesink.engine.retry).

A rewrite's REPLACE and an expiry are not a `TableTransaction`'s unit: the transaction publishes
one change and re-checks its requirements on each retry, whereas these must be planned again on
the fresh metadata (other files to rewrite, other snapshots to expire) and, for a rewrite, write
new files. So each attempt plans and commits anew, and the engine's loop decides how often and
how long to wait: `LostToConcurrentCommitError` is the one failure it retries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lakesink.engine.retry import RetryPolicy, run_commit
from lakesink.formats.iceberg.errors import LostToConcurrentCommitError

T = TypeVar("T")

FIRST_BACKOFF_S = 0.2
MAX_BACKOFF_S = 2.0


def commit_replanned(
    attempt: Callable[[], T],
    *,
    attempts: int,
    what: str,
    sleep: Callable[[float], None],
) -> T:
    """Run `attempt` (plan on fresh metadata, then commit) until it lands, again after each
    `LostToConcurrentCommitError`, at most `attempts` times, waiting 0.2 s, then twice as long
    each time (at most 2 s); the last `LostToConcurrentCommitError` is raised."""
    policy = RetryPolicy(
        attempts=attempts,
        backoff_s=FIRST_BACKOFF_S,
        retry_on=(LostToConcurrentCommitError,),
    )
    return run_commit(
        attempt,
        resolve=lambda: None,  # a lost commit has a known outcome: nothing to look for
        policy=policy,
        what=what,
        sleep=lambda s: sleep(min(s, MAX_BACKOFF_S)),
    )
