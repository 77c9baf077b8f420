"""The pending-commit store of the decoupled (two-phase) commit (seeds 001 and 004).

One row per (writer id, epoch), as seed 001's `pending_sink_state`:

    writer_id text, epoch bigint, status Pending | Aborted | Committed,
    metadata bytes (the serialised write statuses, offsets and instant time),
    created_at, updated_at, primary key (writer_id, epoch)

`pre_commit` makes an epoch Pending and is durable when it returns; a committer publishes
Pending epochs in order and marks them Committed; recovery aborts the dirty ones. Backends:
`SqlitePendingCommitStore` (embedded default) and `PostgresPendingCommitStore` (clusters);
`lakesink.engine.pending.factory.make_pending_store` builds the one that the configuration names.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from lakesink.errors import ConfigError, PendingStoreError
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.offsets import WriterOffsets
from lakesink.protocol.write_status import WriteStatus

StoreKind = Literal["sqlite", "postgres"]
STORE_KINDS: tuple[StoreKind, ...] = ("sqlite", "postgres")
DEFAULT_TABLE = "lakesink_pending_commits"
_TABLE_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class PendingStatus(enum.Enum):
    """Where an epoch stands: Pending (durable, not yet in the table), Committed, or Aborted."""

    PENDING = "Pending"
    ABORTED = "Aborted"
    COMMITTED = "Committed"


class PendingStoreUnavailableError(PendingStoreError):
    """The store could not be reached. Retry later: every store call is idempotent."""

    retriable = True


class PendingEntryConflictError(PendingStoreError):
    """The call contradicts what the store holds (other content for an epoch, an abort of a
    committed epoch, an unknown epoch). Retrying the same call cannot help."""

    retriable = False


@dataclass(frozen=True, slots=True)
class PendingEntry:
    """One epoch of one writer in the pending-commit store."""

    writer_id: str
    epoch: int
    status: PendingStatus
    metadata: bytes
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class PendingCommit:
    """What a Pending epoch needs to be published later: the instant, its write statuses and
    the writer's offsets after it. `to_bytes` is deterministic, so a replay is idempotent."""

    instant_time: InstantTime
    statuses: tuple[WriteStatus, ...]
    offsets: WriterOffsets
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        doc = {
            "version": 1,
            "instant_time": self.instant_time.value,
            "statuses": [s.to_json() for s in self.statuses],
            "offsets": self.offsets.to_json(),
            "extra": dict(self.extra),
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> PendingCommit:
        try:
            doc = json.loads(data)
            return cls(
                instant_time=InstantTime(doc["instant_time"]),
                statuses=tuple(WriteStatus.from_json(s) for s in doc["statuses"]),
                offsets=WriterOffsets.from_json(doc["offsets"]),
                extra=doc.get("extra", {}),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise PendingEntryConflictError(
                f"pending-commit metadata cannot be decoded ({e}); the entry is corrupted"
            ) from e


class PendingCommitStore(Protocol):
    """Durable two-phase commit state. Every method raises PendingStoreUnavailableError when the
    store cannot be reached, and PendingEntryConflictError when the call contradicts it."""

    def pre_commit(self, writer_id: str, epoch: int, metadata: bytes) -> bool:
        """Record `epoch` as Pending with `metadata`, durably before returning. True if it was
        recorded now; False if the same content was already there (a replay). Other content for
        a Pending or Committed epoch is a conflict; an Aborted epoch is replaced (Pending again)."""
        ...

    def mark_committed(self, writer_id: str, epoch: int) -> None:
        """Pending -> Committed (Committed stays). Aborted or unknown epochs: conflict."""
        ...

    def mark_aborted(self, writer_id: str, epoch: int) -> None:
        """Pending -> Aborted (Aborted stays). Committed or unknown epochs: conflict."""
        ...

    def abort_pending_above(self, writer_id: str, epoch: int) -> list[int]:
        """Abort every Pending epoch greater than `epoch` (recovery: dirty epochs)."""
        ...

    def pending(self, writer_id: str) -> list[PendingEntry]:
        """The Pending epochs of a writer, oldest first."""
        ...

    def get(self, writer_id: str, epoch: int) -> PendingEntry | None: ...

    def latest_committed_epoch(self, writer_id: str) -> int | None: ...

    def count_pending(self, writer_id: str) -> int: ...

    def prune_committed(self, writer_id: str, keep_last: int) -> int:
        """Delete settled rows (Committed, Aborted) older than the `keep_last` newest Committed
        epochs; Pending rows are never deleted. Returns the number of rows deleted."""
        ...

    def close(self) -> None: ...


def check_table_name(table: str) -> str:
    if not _TABLE_RE.match(table):
        raise ConfigError(
            f"pending-commit table name {table!r} is not valid: use lower-case letters, digits "
            "and '_', starting with a letter or '_'"
        )
    return table


def check_epoch(epoch: int) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise PendingEntryConflictError(f"epoch must be a non-negative integer, got {epoch!r}")
    return epoch


def decide_pre_commit(
    writer_id: str, epoch: int, existing: tuple[PendingStatus, bytes] | None, metadata: bytes
) -> Literal["insert", "replace", "same"]:
    """What `pre_commit` does given the row already stored (shared by the backends)."""
    if existing is None:
        return "insert"
    status, stored = existing
    if status is PendingStatus.ABORTED:
        return "replace"
    if bytes(stored) == bytes(metadata):
        return "same"
    raise PendingEntryConflictError(
        f"epoch {epoch} of writer {writer_id!r} is already {status.value} with other metadata; "
        "an epoch's content must not change (replayed batch with new files? check the table "
        "for the epoch's commit before pre-committing again)"
    )


def check_transition(
    writer_id: str, epoch: int, current: PendingStatus | None, target: PendingStatus
) -> bool:
    """True if the row must change to `target`; False if it already is; conflict otherwise."""
    if current is None:
        raise PendingEntryConflictError(
            f"epoch {epoch} of writer {writer_id!r} is not in the pending-commit store; "
            "pre_commit it first"
        )
    if current is target:
        return False
    if current is PendingStatus.PENDING:
        return True
    raise PendingEntryConflictError(
        f"epoch {epoch} of writer {writer_id!r} is {current.value}; it cannot become {target.value}"
    )


def epochs_to_prune(rows: Iterable[tuple[int, PendingStatus]], keep_last: int) -> list[int]:
    """Settled epochs older than the `keep_last` newest Committed ones."""
    if keep_last < 0:
        raise ConfigError(f"keep_last must be >= 0, got {keep_last}")
    rows = sorted(rows)
    committed = [e for e, s in rows if s is PendingStatus.COMMITTED]
    if len(committed) <= keep_last:
        return []
    floor = committed[-keep_last] if keep_last else committed[-1] + 1
    return [e for e, s in rows if e < floor and s is not PendingStatus.PENDING]


__all__ = [
    "DEFAULT_TABLE",
    "STORE_KINDS",
    "PendingCommit",
    "PendingCommitStore",
    "PendingEntry",
    "PendingEntryConflictError",
    "PendingStatus",
    "PendingStoreUnavailableError",
    "StoreKind",
]
