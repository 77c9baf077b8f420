"""The task side of a table format: what a Spark task writes into one table, whatever the format.

The driver gets a `TaskTarget` from the format's plugin (`FormatPlugin.task_target`) and pickles
it into the tasks; each task attempt opens it (`open`) and feeds the writer its Arrow batches.
What is Spark's (the task context, retries, per-topic counts) stays in lakesink.spark; this
module imports nothing of the formats, so the task path loads only the format it writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import pyarrow as pa

    from lakesink.protocol.write_status import FileWrite


@dataclass(frozen=True, slots=True)
class TaskAttempt:
    """One attempt of a Spark task: its partition, stage and attempt numbers, and its name
    (`stage.partition.attempt` in Spark, unique outside it)."""

    partition: int
    stage: int
    number: int
    name: str


class TableWriter(Protocol):
    """One task attempt's writer on one table."""

    def write(self, batch: pa.RecordBatch) -> None:
        """Write `batch` (rows of the table, non-empty)."""
        ...

    def close(self) -> tuple[list[FileWrite], dict[str, Any]]:
        """Finish the files; the files written and the format's `WriteStatus.extra`."""
        ...


class TaskTarget(Protocol):
    """Where tasks write on one table for one instant: made on the driver, pickled into the
    tasks (small: no open table, no client)."""

    @property
    def instant_time(self) -> str:
        """The instant (Hudi) or transaction (Iceberg) the files belong to."""
        ...

    def open(self, attempt: TaskAttempt) -> TableWriter:
        """The writer of this task attempt (its files carry names of the attempt's own)."""
        ...


@runtime_checkable
class KeyedTaskTarget(TaskTarget, Protocol):
    """A target whose rows must reach their writer grouped: every row of one group (Hudi: one
    file group, a partition's bucket) in one task, since that task rewrites the group's file.
    The Spark side shuffles the rows by `group_ids` before handing them to `open`'s writer."""

    def group_ids(self, batch: pa.RecordBatch) -> pa.Array:
        """The group of each row of `batch` (int32, the same for every row of a group, in
        every task and attempt)."""
        ...


@runtime_checkable
class FoldingTaskTarget(KeyedTaskTarget, Protocol):
    """A keyed target whose writer folds each group's rows by key under lakesink's ordering
    rule (`lakesink.engine.fold`): a read task may hand on only the versions that fold can need
    (`prefold_mask`), which cuts the rows shuffled when a batch repeats its keys."""

    @property
    def fold_key(self) -> tuple[tuple[str, ...], str | None]:
        """The key columns and the ordering column (None: none) the writer folds by."""
        ...
