"""Crash injection for the exactly-once tests: `LAKESINK_CRASH_AT=<point>` kills this process
with SIGKILL when execution reaches that point (no cleanup, no `finally`, like a power cut).

Points, in commit order: before-begin, after-begin, after-write, after-reconcile,
after-precommit (commit.mode=async), after-publish, during-rollback, during-recovery (async);
and during-archival (after archival moved its first instant; table services only).
A merge-on-read table's compaction (inline or `lakesink table compact`): compaction-requested
(its plan written), compaction-inflight (marked inflight, nothing written),
compaction-slice-written (after each new base file) and compaction-written (every base file
written, before its commit).
A batch of several tables (a dead-letter table, or many tables) commits the first table (the
dead letters, else the first by name) alone, then the others concurrently (lakesink.spark.batch):
before-table-commits (every table's files written, none committed), between-table-commits
(once per batch: the first table committed, no other's commit begun) and after-table-commits
(all committed — in async mode the main table pre-committed — before Spark records the batch).
`LAKESINK_CRASH_AFTER_BATCHES=N` lets N batches pass first (N passes of the point: the points
inside one table's commit are passed once per table that commits).
"""

from __future__ import annotations

import os
import signal
import threading

# The steps of one table's commit (and of its recovery and services)
TABLE_STEP_POINTS = (
    "before-begin",
    "after-begin",
    "after-write",
    "after-reconcile",
    "after-precommit",
    "after-publish",
    "during-rollback",
    "during-recovery",
    "during-archival",
)
# The steps of a merge-on-read table's compaction, in order
COMPACTION_CRASH_POINTS = (
    "compaction-requested",
    "compaction-inflight",
    "compaction-slice-written",
    "compaction-written",
)
# The points around the commits of a batch's tables (a dead-letter table, or many tables)
TABLE_CRASH_POINTS = ("before-table-commits", "between-table-commits", "after-table-commits")
CRASH_POINTS = TABLE_STEP_POINTS + COMPACTION_CRASH_POINTS + TABLE_CRASH_POINTS
# One table's commit steps in sync mode
SYNC_CRASH_POINTS = tuple(
    p
    for p in TABLE_STEP_POINTS
    if p not in ("after-precommit", "during-recovery", "during-archival")
)
_seen: dict[str, int] = {}
_seen_lock = threading.Lock()  # tables commit on several threads


def crash_point(point: str) -> None:
    """Die here if the environment asks for it (a test-only hook; no effect otherwise)."""
    if os.environ.get("LAKESINK_CRASH_AT") != point:
        return
    with _seen_lock:
        _seen[point] = passes = _seen.get(point, 0) + 1
    if passes > int(os.environ.get("LAKESINK_CRASH_AFTER_BATCHES", "0")):
        os.kill(os.getpid(), signal.SIGKILL)


def task_fault(attempt_number: int) -> None:
    """`LAKESINK_FAIL_TASK_ATTEMPTS=N` fails every sink task's attempts numbered below N, after it
    has written files: Spark retries the task and the failed attempts leave orphan files."""
    if attempt_number < int(os.environ.get("LAKESINK_FAIL_TASK_ATTEMPTS", "0")):
        raise RuntimeError(f"lakesink test fault: failing task attempt {attempt_number}")
