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

Pauses, for races between processes without sleeps: `LAKESINK_PAUSE_AT=<point>[,<point>...]`
and `LAKESINK_PAUSE_DIR=<dir>` make a process that reaches one of those points (a crash point,
or `waiting-for-lock`: a table lock it wants is held by another) write `<dir>/<point>.reached`
and wait until `<dir>/<point>.go` exists; a test orders two processes' steps with the files.
`clustering-written` (a pause point only): a Hudi clustering wrote its files and is about to
publish its replacecommit (a batch commits meanwhile when the services run beside the batches).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

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
# Points a process may pause at besides the crash points
PAUSE_ONLY_POINTS = ("waiting-for-lock",)
PAUSE_TIMEOUT_S = 120.0  # a test that never writes the go file fails, the process goes on
# One table's commit steps in sync mode
SYNC_CRASH_POINTS = tuple(
    p
    for p in TABLE_STEP_POINTS
    if p not in ("after-precommit", "during-recovery", "during-archival")
)
_seen: dict[str, int] = {}
_seen_lock = threading.Lock()  # tables commit on several threads


def pause_point(point: str) -> None:
    """Wait here if the environment asks for it (a test-only hook; no effect otherwise): mark
    `<LAKESINK_PAUSE_DIR>/<point>.reached`, then wait until `<point>.go` is there (at most
    `PAUSE_TIMEOUT_S`, then go on with a warning)."""
    if point not in os.environ.get("LAKESINK_PAUSE_AT", "").split(","):
        return
    folder = Path(os.environ["LAKESINK_PAUSE_DIR"])
    (folder / f"{point}.reached").touch()
    go = folder / f"{point}.go"
    deadline = time.monotonic() + PAUSE_TIMEOUT_S
    while not go.exists():
        if time.monotonic() > deadline:
            log.warning("pause at %s: no %s within %.0f s; going on", point, go, PAUSE_TIMEOUT_S)
            return
        time.sleep(0.02)


def crash_point(point: str) -> None:
    """Die here if the environment asks for it (a test-only hook; no effect otherwise); pause
    here first if it asks for that (`pause_point`)."""
    pause_point(point)
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
