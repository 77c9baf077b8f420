"""The one retry loop of a publish, sorting failures as pyiceberg's `commit_transaction` and
Iceberg kafka-connect's committer do:

- the outcome is known and it failed for good (`retriable` False): raised at once;
- the outcome is unknown (`CommitStateUnknownError`: the request may or may not have landed,
  e.g. an object store whose response was lost): resolved by re-reading the table — if the
  commit is there it succeeded, else the publish is tried again;
- a retriable failure (`retriable` True) of a kind the policy names in `retry_on`: tried
  again, up to `attempts`, with a short backoff; then raised. Other retriable failures are
  raised for the caller to retry the whole unit (Spark retries the batch; a CommitError
  leaves nothing visible). A publish names none: the conditional create either landed, did
  not, or its outcome is unknown.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from lakesink.errors import CommitStateUnknownError, LakesinkError

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a publish is tried and how long to wait in between (doubling)."""

    attempts: int = 3
    backoff_s: float = 0.05
    retry_on: tuple[type[LakesinkError], ...] = ()

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, not {self.attempts}")


DEFAULT_RETRY = RetryPolicy()


def run_commit(
    attempt: Callable[[], T],
    *,
    resolve: Callable[[], T | None],
    policy: RetryPolicy = DEFAULT_RETRY,
    what: str = "commit",
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run `attempt` until it succeeds. `resolve` re-reads the table after an unknown outcome:
    the result of the commit that landed, or None when it did not land. `sleep` waits out the
    backoff (tests pass a faster one)."""
    delay = policy.backoff_s
    for n in range(1, policy.attempts + 1):
        try:
            return attempt()
        except CommitStateUnknownError as e:
            landed = resolve()
            if landed is not None:
                log.info("%s: outcome was unknown (%s); the table shows it landed", what, e)
                return landed
            if n == policy.attempts:
                raise
            log.warning("%s: outcome unknown and not on the table (%s); trying again", what, e)
        except LakesinkError as e:
            if not (e.retriable and isinstance(e, policy.retry_on)) or n == policy.attempts:
                raise
            log.warning("%s failed (%s); attempt %d of %d", what, e, n + 1, policy.attempts)
        sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")  # pragma: no cover
