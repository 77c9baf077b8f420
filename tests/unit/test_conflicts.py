"""Conflict strategies as pure rules: a scenario table of operations, one comment per case."""

from __future__ import annotations

import pytest

from lakesink.errors import CommitConflictError
from lakesink.protocol.conflicts import (
    FileGroupOverlap,
    IngestionFirst,
    Operation,
    OperationKind,
    Phase,
    check,
    completed_since,
    strategy_named,
)
from lakesink.protocol.instant import InstantTime

ING, CLU = OperationKind.INGESTION, OperationKind.CLUSTERING
DONE, PENDING = Phase.COMPLETED, Phase.PENDING


def t(n: int) -> InstantTime:
    return InstantTime(f"20260101000000{n:03d}")


def op(n: int, kind: OperationKind, w: str = "", r: str = "", phase: Phase = DONE) -> Operation:
    groups = lambda s: frozenset(("p", x) for x in s.split(",") if x)  # noqa: E731
    return Operation(t(n), kind, groups(w), groups(r), phase)


CASES = [
    # (strategy, ours, concurrent, conflicts?)
    # appends write new file groups: never a conflict with any other append
    (FileGroupOverlap(), op(1, ING, "a"), [op(2, ING, "b")], False),
    # two ingestions updating the same file group: the later commit fails
    (FileGroupOverlap(), op(1, ING, "a"), [op(2, ING, "a")], True),
    # an ingestion updating a group a completed clustering replaced fails (default)
    (FileGroupOverlap(), op(1, ING, "a"), [op(2, CLU, "x", "a")], True),
    # default: an ingestion yields to a clustering already scheduled on its group
    (FileGroupOverlap(), op(1, ING, "a"), [op(2, CLU, "", "a", PENDING)], True),
    # default: a clustering ignores pending ingestions (they will fail against it)
    (FileGroupOverlap(), op(1, CLU, "x", "a"), [op(2, ING, "a", "", PENDING)], False),
    # clustering vs clustering on the same group: the later fails
    (FileGroupOverlap(), op(1, CLU, "x", "a"), [op(2, CLU, "y", "a")], True),
    # clustering of other groups than a concurrent append: both commit
    (FileGroupOverlap(), op(1, CLU, "x", "a,b"), [op(2, ING, "c")], False),
    # ingestion-first: an ingestion never aborts for a pending clustering
    (IngestionFirst(), op(1, ING, "a"), [op(2, CLU, "", "a", PENDING)], False),
    # ingestion-first: a clustering aborts when an ingestion writes its groups now
    (IngestionFirst(), op(1, CLU, "x", "a"), [op(2, ING, "a", "", PENDING)], True),
    # ingestion-first: a clustering aborts for an ingestion completed since it began
    (IngestionFirst(), op(1, CLU, "x", "a"), [op(2, ING, "a")], True),
    # ingestion-first: ingestions still fail against each other on the same group
    (IngestionFirst(), op(1, ING, "a"), [op(2, ING, "a")], True),
    # an instant never conflicts with itself
    (FileGroupOverlap(), op(1, ING, "a"), [op(1, ING, "a")], False),
]


@pytest.mark.parametrize(("strategy", "ours", "concurrent", "expected"), CASES)
def test_strategy_scenarios(
    strategy: FileGroupOverlap | IngestionFirst,
    ours: Operation,
    concurrent: list[Operation],
    expected: bool,
) -> None:
    assert bool(strategy.conflicts(ours, concurrent)) is expected
    if expected:
        with pytest.raises(CommitConflictError, match="p/a"):
            check(strategy, ours, concurrent)
    else:
        check(strategy, ours, concurrent)


def test_ingestion_first_clustering_skips_groups_written_after_its_plan() -> None:
    plan = op(1, CLU, "", "a,b,c")
    concurrent = [op(2, ING, "b"), op(3, ING, "c", "", PENDING), op(4, ING, "z")]
    assert IngestionFirst().clustering_skips(plan, concurrent) == {("p", "b"), ("p", "c")}
    assert FileGroupOverlap().clustering_skips(plan, concurrent) == frozenset()


def test_completed_since_uses_request_then_completion_time() -> None:
    assert completed_since(t(5), t(6), None)  # requested after we began
    assert not completed_since(t(5), t(4), None)  # layout 1: decided by file times elsewhere
    assert completed_since(t(5), t(4), t(7))  # began before, completed after
    assert not completed_since(t(5), t(3), t(4))


def test_strategy_named_rejects_unknown_names() -> None:
    assert strategy_named("ingestion-first").name == "ingestion-first"
    with pytest.raises(ValueError, match="file-group"):
        strategy_named("last-writer-wins")
