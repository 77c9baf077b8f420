"""The conflict check of an instant this process began: an instant completed in the snapshot
it began on (and, by its times, before it) is not concurrent, and no write time is asked for;
one that completed after that snapshot, or whose times say it may have, still is."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakesink.formats.hudi import conflicts
from lakesink.formats.hudi.conflicts import concurrent_operations
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.protocol.instant import Action, InstantTime


def _commit(table: HudiTable, t: InstantTime, completion: InstantTime | None = None) -> None:
    inflight = table.timeline().begin(Action.COMMIT, t)
    table.timeline().publish(inflight, CommitMetadata("INSERT", (), {}, "", {}), completion)


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The timeline files whose write time the check asked for (a HEAD each on a store)."""
    out: list[str] = []
    real = conflicts._mtime

    def spy(timeline, instant):  # type: ignore[no-untyped-def]
        out.append(str(instant))
        return real(timeline, instant)

    monkeypatch.setattr(conflicts, "_mtime", spy)
    return out


def test_an_instant_completed_before_the_begin_snapshot_is_not_concurrent_and_costs_no_head(
    tmp_path: Path, asked: list[str]
) -> None:
    table = HudiTable.create(tmp_path / "t", TableConfig("t", ("kafka_offset",), ()))
    now = InstantTime.from_epoch_ms(1_800_000_000_000)
    _commit(table, now)  # the previous batch, completed a moment ago
    began = InstantTime.from_epoch_ms(1_800_000_000_100)
    snapshot = table.timeline()  # listed under the lock, then the requested file written
    snapshot.begin(Action.COMMIT, began, snapshot_is_fresh=True)
    assert concurrent_operations(table, began, began_on=snapshot) == []
    assert asked == []
    # without the snapshot: the write times are compared (the previous commit is recent)
    assert concurrent_operations(table, began) == []
    assert asked


def test_what_completed_after_the_snapshot_or_by_its_times_after_the_begin_stays_concurrent(
    tmp_path: Path, asked: list[str]
) -> None:
    table = HudiTable.create(tmp_path / "t", TableConfig("t", ("kafka_offset",), ()))
    base = 1_800_000_000_000
    # completed before the snapshot, but its completion time is not before `began` (a clock
    # ahead of ours): its times say it may be concurrent, and they win
    ahead = InstantTime.from_epoch_ms(base)
    _commit(table, ahead, completion=InstantTime.from_epoch_ms(base + 500))
    began = InstantTime.from_epoch_ms(base + 100)
    snapshot = table.timeline()
    snapshot.begin(Action.COMMIT, began, snapshot_is_fresh=True)
    # another writer's commit, requested before `began` and completed after the snapshot
    late = InstantTime.from_epoch_ms(base + 50)
    _commit(table, late, completion=InstantTime.from_epoch_ms(base + 80))
    found = {op.instant_time for op in concurrent_operations(table, began, began_on=snapshot)}
    assert found == {ahead, late}


@pytest.mark.parametrize("locked", [False, True], ids=["plain", "locked"])
def test_a_new_instant_begins_after_every_completion_time_not_only_every_instant_time(
    tmp_path: Path, locked: bool
) -> None:
    """A compaction finished right before a batch began completes in the same millisecond the
    batch's instant would take: that instant must come after the completion time, or the check
    takes the compaction for a concurrent commit (a flaky conflict in one of ten runs)."""
    from lakesink.formats.hudi.concurrency.instant_time import InstantTimeGenerator
    from lakesink.formats.hudi.control import CommitControl, LockedCommitControl

    table = HudiTable.create(tmp_path / "t", TableConfig("t", ("kafka_offset",), ()))
    clock_ms = 1_800_000_000_000
    done = InstantTime.from_epoch_ms(clock_ms + 7)  # completed "now", later than its own time
    _commit(table, InstantTime.from_epoch_ms(clock_ms - 10), completion=done)
    if locked:
        control: CommitControl = LockedCommitControl(str(table.base_path))
        control.generator = InstantTimeGenerator(lambda: clock_ms)
    else:
        control = CommitControl(clock_ms=lambda: clock_ms)
    with control.locked(table):
        began = control.next_instant_time(table)
    assert began > done
    snapshot = table.timeline()
    snapshot.begin(Action.COMMIT, began, snapshot_is_fresh=True)
    assert concurrent_operations(table, began, began_on=snapshot) == []
