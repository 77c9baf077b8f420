"""Conflict detection between concurrent writers of one table (seed 003), as pure logic.

An `Operation` is what one instant does to the table's file groups: the groups it writes and
the groups it replaces (a clustering's replacecommit). A `ConflictStrategy` decides, for the
instant about to commit, whether any concurrent operation — completed since it began, or still
pending (a scheduled clustering, an inflight ingestion known by its markers) — makes the commit
unsafe. Appends write new file groups, which nobody else can know, so they never conflict.

Strategies:
- `FileGroupOverlap` (default): any overlap with an operation completed since we began is a
  conflict; an ingestion also yields to a clustering already scheduled on its file groups.
- `IngestionFirst`: ingestion wins over clustering. An ingestion never aborts because of a
  pending clustering; a clustering aborts on overlap with any ingestion completed since it
  began or still inflight, and `clustering_skips` names the file groups a clustering must drop
  from its plan before it rewrites them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from lakesink.errors import CommitConflictError
from lakesink.protocol.instant import InstantTime

FileGroupId = tuple[str, str]
"""A file group: (partition path, file id)."""


class OperationKind(enum.Enum):
    """What an instant does: ingest rows (commit) or rewrite file groups (clustering)."""

    INGESTION = "ingestion"
    CLUSTERING = "clustering"


class Phase(enum.Enum):
    """Where a concurrent operation stands, seen from the committing instant."""

    COMPLETED = "completed"  # completed after the committing instant began
    PENDING = "pending"  # requested or inflight (a scheduled clustering, a running ingestion)


@dataclass(frozen=True, slots=True)
class Operation:
    """The file groups one instant writes and replaces."""

    instant_time: InstantTime
    kind: OperationKind
    written: frozenset[FileGroupId] = frozenset()
    replaced: frozenset[FileGroupId] = frozenset()
    phase: Phase = Phase.COMPLETED
    writer: str = ""

    @property
    def file_groups(self) -> frozenset[FileGroupId]:
        return self.written | self.replaced

    def overlap(self, other: Operation) -> frozenset[FileGroupId]:
        return self.file_groups & other.file_groups

    def __str__(self) -> str:
        who = f" of writer {self.writer}" if self.writer else ""
        return f"{self.kind.value} {self.instant_time} ({self.phase.value}){who}"


@dataclass(frozen=True, slots=True)
class Conflict:
    """`ours` cannot commit because of `theirs`, which touches `file_groups` too."""

    ours: Operation
    theirs: Operation
    file_groups: frozenset[FileGroupId] = field(default_factory=frozenset)

    def describe(self) -> str:
        sample = ", ".join(f"{p or '(root)'}/{f}" for p, f in sorted(self.file_groups)[:3])
        return f"{self.ours} touches file groups {sample} that {self.theirs} also touches"


class ConflictStrategy(Protocol):
    """Decides whether `ours` may commit given the concurrent operations."""

    @property
    def name(self) -> str:
        """How configuration names the strategy."""
        ...

    def conflicts(self, ours: Operation, concurrent: Sequence[Operation]) -> list[Conflict]:
        """The conflicts that forbid `ours` to commit (empty: commit)."""
        ...

    def clustering_skips(
        self, plan: Operation, concurrent: Sequence[Operation]
    ) -> frozenset[FileGroupId]:
        """File groups a clustering must drop from its plan before rewriting them."""
        ...


def _overlaps(
    ours: Operation, others: Iterable[Operation], wanted: Iterable[tuple[OperationKind, Phase]]
) -> list[Conflict]:
    kinds = set(wanted)
    out: list[Conflict] = []
    for other in others:
        if other.instant_time == ours.instant_time or (other.kind, other.phase) not in kinds:
            continue
        both = ours.overlap(other)
        if both:
            out.append(Conflict(ours, other, both))
    return out


_ANY_COMPLETED = [(k, Phase.COMPLETED) for k in OperationKind]


@dataclass(frozen=True, slots=True)
class FileGroupOverlap:
    """The default: overlapping file groups conflict; the later commit fails."""

    name: str = "file-group"

    def conflicts(self, ours: Operation, concurrent: Sequence[Operation]) -> list[Conflict]:
        wanted = list(_ANY_COMPLETED)
        if ours.kind is OperationKind.INGESTION:
            wanted.append((OperationKind.CLUSTERING, Phase.PENDING))
        return _overlaps(ours, concurrent, wanted)

    def clustering_skips(
        self, plan: Operation, concurrent: Sequence[Operation]
    ) -> frozenset[FileGroupId]:
        return frozenset()


@dataclass(frozen=True, slots=True)
class IngestionFirst:
    """Ingestion wins over clustering: only a clustering ever aborts for the other."""

    name: str = "ingestion-first"

    def conflicts(self, ours: Operation, concurrent: Sequence[Operation]) -> list[Conflict]:
        if ours.kind is OperationKind.INGESTION:
            return _overlaps(ours, concurrent, _ANY_COMPLETED)
        return _overlaps(
            ours, concurrent, [*_ANY_COMPLETED, (OperationKind.INGESTION, Phase.PENDING)]
        )

    def clustering_skips(
        self, plan: Operation, concurrent: Sequence[Operation]
    ) -> frozenset[FileGroupId]:
        """The planned groups that an ingestion wrote after the plan or is writing now."""
        touched: set[FileGroupId] = set()
        for other in concurrent:
            if other.kind is OperationKind.INGESTION and other.instant_time != plan.instant_time:
                touched |= other.file_groups & plan.replaced
        return frozenset(touched)


STRATEGIES: dict[str, ConflictStrategy] = {
    FileGroupOverlap().name: FileGroupOverlap(),
    IngestionFirst().name: IngestionFirst(),
}
"""The strategies by name (`table.services.conflict.strategy`)."""


def strategy_named(name: str) -> ConflictStrategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        valid = ", ".join(sorted(STRATEGIES))
        raise ValueError(f"conflict strategy {name!r} is not known; valid: {valid}") from None


def completed_since(
    began: InstantTime,
    instant_time: InstantTime,
    completion_time: InstantTime | None,
) -> bool:
    """Did an instant complete after an instant that began at `began`? Conservatively yes when
    it was requested later, or (layout 2) when its completion time is not before `began`."""
    if instant_time > began:
        return True
    return completion_time is not None and completion_time >= began


def check(strategy: ConflictStrategy, ours: Operation, concurrent: Sequence[Operation]) -> None:
    """Raise CommitConflictError naming the first conflict, if any."""
    found = strategy.conflicts(ours, concurrent)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise CommitConflictError(
            f"{found[0].describe()}{more}; {ours.instant_time} is not committed (strategy "
            f"{strategy.name}); nothing of it is visible, retry with a new instant"
        )
