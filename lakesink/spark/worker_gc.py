"""Keep PySpark's per-task `gc.collect()` cheap in reused Python workers.

A reused PySpark worker runs `gc.collect()` after every task. With pyarrow, pandas, pyspark and
confluent-kafka imported that is a full traversal of ~80k objects (0.07-0.2 s) per task and per
Python UDF, which measured as most of a worker's CPU in steady state (benchmarks/README.md).
`freeze_worker_heap()` moves the objects alive at the start of a task (modules, classes,
functions) into the permanent generation, which the collector skips. Only a process's first few
tasks freeze, so the few objects of those tasks that die later in a reference cycle are the
bound of what is never reclaimed; everything else is freed by reference counting as usual.
"""

from __future__ import annotations

import gc

FREEZING_TASKS = 3
"""How many tasks of one worker process freeze the heap (later imports land in the first few)."""

_frozen_tasks = 0


def freeze_worker_heap() -> None:
    """Call at the start of a task; does nothing outside a Spark task (driver, unit tests)."""
    global _frozen_tasks
    if _frozen_tasks >= FREEZING_TASKS:
        return
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return
    _frozen_tasks += 1
    gc.collect()
    gc.freeze()
