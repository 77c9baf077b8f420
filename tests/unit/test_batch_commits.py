"""A batch's tables committed concurrently (lakesink.spark.batch): the first table alone, then
the others on a bounded pool of driver threads. Fake coordinators (pure logic, no storage):
the commits really overlap, the crash points between the tables are deterministic, and a
failure in one table's commit aborts exactly the tables that did not commit."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, cast

import pytest

from lakesink.engine.coordinator import BatchOutcome, Coordinator
from lakesink.engine.schema import TableSchema
from lakesink.protocol.commit import Verdict
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import WriteStatus
from lakesink.spark import batch as batch_module
from lakesink.spark.batch import BatchTable, BatchTables

RANGES = [OffsetRange(TopicPartition("events", 0), 0, 10)]
SCHEMA = cast(TableSchema, object())


class FakeCoordinator:
    """One table's commit: `hold(name)` runs inside it (to meet the others, or to fail)."""

    def __init__(self, name: str, log: list[str], hold: Any = None, durable: bool = False):
        self.name = name
        self.writer_id = "w"
        self.log = log
        self.hold = hold
        self.durable = durable

    def complete_batch(
        self,
        instant: InstantTime,
        batch_id: int,
        ranges: Sequence[OffsetRange],
        statuses: Sequence[WriteStatus],
        schema: TableSchema,
        *,
        lost: Sequence[OffsetRange] = (),
    ) -> BatchOutcome:
        self.log.append(f"start {self.name}")
        if self.hold is not None:
            self.hold(self.name)
        self.log.append(f"commit {self.name}")
        return BatchOutcome(batch_id, Verdict.PUBLISH, instant, records=1)

    def is_precommitted(self, instant: InstantTime) -> bool:
        return self.durable

    def abort(self, instant: InstantTime) -> None:
        self.log.append(f"abort {self.name}")


def _tables(
    names: Sequence[str], log: list[str], hold: Any = None, **kw: Any
) -> tuple[BatchTables, dict[str, InstantTime]]:
    tables = [
        BatchTable(n, cast(Coordinator, FakeCoordinator(n, log, hold, n in kw.get("durable", ()))))
        for n in names
    ]
    instants = {n: InstantTime(f"2026112800000{i:04d}") for i, n in enumerate(names)}
    return BatchTables(tables, parallelism=kw.get("parallelism", 8)), instants


def _commit(tables: BatchTables, instants: dict[str, InstantTime]) -> dict[str, BatchOutcome]:
    return tables.commit(7, RANGES, instants, {}, lambda role, written: SCHEMA)


def test_the_tables_after_the_first_commit_at_once_and_the_crash_points_fall_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[str] = []
    # the three later commits can pass only if all three run at the same time
    meet = threading.Barrier(3, timeout=10)
    tables, instants = _tables(
        ["dead", "a", "b", "c"], log, lambda name: name != "dead" and meet.wait()
    )
    monkeypatch.setattr(batch_module, "crash_point", lambda point: log.append(point))
    outcomes = _commit(tables, instants)
    assert sorted(outcomes) == ["a", "b", "c", "dead"]
    assert log[:4] == ["before-table-commits", "start dead", "commit dead", "between-table-commits"]
    assert log[-1] == "after-table-commits"
    later = log[4:-1]
    assert sorted(later) == sorted(f"{s} {n}" for s in ("start", "commit") for n in "abc")
    assert all(e.startswith("start") for e in later[:3])  # all three began before any ended


def test_one_at_a_time_in_order_with_parallelism_1(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    tables, instants = _tables(["dead", "a", "b"], log, parallelism=1)
    monkeypatch.setattr(batch_module, "crash_point", lambda point: log.append(point))
    _commit(tables, instants)
    assert log == [
        "before-table-commits",
        *("start dead", "commit dead"),
        "between-table-commits",
        *("start a", "commit a", "start b", "commit b"),
        "after-table-commits",
    ]


def test_a_table_with_nothing_to_commit_is_skipped_and_the_points_still_fall(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[str] = []
    tables, instants = _tables(["dead", "a", "b"], log)
    monkeypatch.setattr(batch_module, "crash_point", lambda point: log.append(point))
    outcomes = tables.commit(
        7, RANGES, {"dead": None, "a": instants["a"], "b": None}, {}, lambda r, w: SCHEMA
    )
    assert list(outcomes) == ["a"]
    assert log == [
        "before-table-commits",
        "between-table-commits",
        *("start a", "commit a"),
        "after-table-commits",
    ]


def test_a_failed_table_is_aborted_and_raised_the_others_stay_committed() -> None:
    log: list[str] = []
    meet = threading.Barrier(3, timeout=10)

    def hold(name: str) -> None:
        if name == "dead":
            return
        meet.wait()  # a, b and c all running
        if name == "b":
            raise RuntimeError("b's commit failed")

    tables, instants = _tables(["dead", "a", "b", "c"], log, hold)
    with pytest.raises(RuntimeError, match="b's commit failed"):
        _commit(tables, instants)
    assert sorted(e for e in log if not e.startswith("start")) == [
        "abort b",
        "commit a",
        "commit c",
        "commit dead",
    ]


def test_after_a_failure_the_commits_not_started_are_aborted_and_never_run() -> None:
    log: list[str] = []

    def hold(name: str) -> None:
        if name == "b":
            raise RuntimeError("b's commit failed")

    # one at a time after the first: a commits, b fails, c and d never start
    tables, instants = _tables(["dead", "a", "b", "c", "d"], log, hold, parallelism=1)
    with pytest.raises(RuntimeError, match="b's commit failed"):
        _commit(tables, instants)
    assert [e for e in log if not e.startswith("start")] == [
        "commit dead",
        "commit a",
        "abort b",
        "abort c",
        "abort d",
    ]
    # on a pool of two: the first failure cancels the commits not started
    log.clear()
    meet = threading.Barrier(2, timeout=10)

    def pair(name: str) -> None:
        if name in ("a", "b"):
            meet.wait()  # a and b together: c and d wait for a free thread
        if name == "b":
            raise RuntimeError("b's commit failed")

    tables, instants = _tables(["dead", "a", "b", "c", "d"], log, pair, parallelism=2)
    with pytest.raises(RuntimeError, match="b's commit failed"):
        _commit(tables, instants)
    committed = {e.split()[1] for e in log if e.startswith("commit")}
    aborted = {e.split()[1] for e in log if e.startswith("abort")}
    # every table either committed or aborted, never both; b aborted; a committed
    assert committed | aborted == {"dead", "a", "b", "c", "d"} and not committed & aborted
    assert "b" in aborted and {"dead", "a"} <= committed
    # a commit cancelled was never started
    assert {e.split()[1] for e in log if e.startswith("start")} == committed | {"b"}


def test_the_first_table_failing_aborts_every_table_and_commits_none() -> None:
    log: list[str] = []

    def hold(name: str) -> None:
        if name == "dead":
            raise RuntimeError("the dead letters' commit failed")

    tables, instants = _tables(["dead", "a", "b"], log, hold)
    with pytest.raises(RuntimeError, match="dead letters"):
        _commit(tables, instants)
    assert [e for e in log if not e.startswith("start")] == ["abort dead", "abort a", "abort b"]


def test_a_durably_precommitted_table_that_fails_is_not_aborted() -> None:
    """Async mode: a table pre-committed to the pending store is its committer's to publish."""
    log: list[str] = []

    def hold(name: str) -> None:
        if name == "rows":
            raise RuntimeError("the committer failed")

    tables, instants = _tables(["dead", "rows"], log, hold, durable={"rows"})
    with pytest.raises(RuntimeError, match="the committer failed"):
        _commit(tables, instants)
    assert [e for e in log if not e.startswith("start")] == ["commit dead"]


def test_parallelism_below_1_is_refused() -> None:
    with pytest.raises(ValueError, match=r"commit\.tables\.parallelism"):
        _tables(["a"], [], parallelism=0)
