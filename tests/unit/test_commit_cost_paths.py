"""The cheaper commit paths keep their guarantees: markers deleted after the lock (and a crash
in between cleaned at the next start), timeline loads that update only new files' instants, a
late lease release that frees nothing, the completed file encoded before the lock."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lakesink.engine import coordinator as coordinator_module
from lakesink.engine.transaction import TableTransaction
from lakesink.formats.hudi.concurrency.lock import LOCK_DIR, FileLockProvider
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.coordinator import HudiCoordinator
from lakesink.formats.hudi.format import HudiFormat
from lakesink.formats.hudi.table import timeline as timeline_module
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.files import base_file_name, new_file_id
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.markers import (
    create_marker,
    list_marked_files,
    wait_for_marker_deletions,
)
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.timeline import Timeline
from lakesink.formats.hudi.writer_state import OFFSETS_KEY, WRITER_ID_KEY
from lakesink.protocol.instant import Action, Instant, InstantTime, State
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets
from lakesink.protocol.write_status import FileWrite, WriteStatus

SCHEMA = json.dumps({"type": "record", "name": "r", "fields": [{"name": "x", "type": "long"}]})


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class Died(Exception):
    """The writer process dying at a crash point."""


def _table(tmp_path: Path) -> HudiTable:
    return HudiTable.create(tmp_path / "t", TableConfig("t", ("x",), (), version=8))


def _statuses(table: HudiTable, t: InstantTime, ranges: list[OffsetRange]) -> list[WriteStatus]:
    """One base file with its marker per range, as the tasks write them."""
    out = []
    for r in ranges:
        fid = new_file_id()
        f = FileWrite("", fid, base_file_name(fid, f"{r.partition.partition}-1-0", t), 1, 1)
        create_marker(table.base_path, t, "", f.path)
        (table.base_path / f.path).touch()
        out.append(WriteStatus(t.value, f"0.{r.partition.partition}.0", r, (f,), 1, 1))
    return out


def _first_batch(table: HudiTable) -> tuple[HudiCoordinator, list[OffsetRange], InstantTime]:
    """Writer "w" started on `table`, its batch 0 of three partitions begun."""
    ranges = [OffsetRange(TopicPartition("t", p), 0, 10) for p in range(3)]
    coordinator = HudiCoordinator(table, "w", control=CommitControl())
    coordinator.start()
    t = coordinator.begin_batch(0, ranges)
    assert t is not None
    return coordinator, ranges, t


def test_markers_outlive_the_publish_and_a_crash_before_their_deletion_is_cleaned_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _table(tmp_path)
    first, ranges, t = _first_batch(table)
    statuses = _statuses(table, t, ranges)

    def die_after_publish(point: str) -> None:
        if point == "after-publish":
            raise Died(point)

    monkeypatch.setattr(coordinator_module, "crash_point", die_after_publish)
    with pytest.raises(Died):
        first.complete_batch(t, 0, ranges, statuses, schema=SCHEMA)
    monkeypatch.undo()
    done = table.timeline().get(t)
    assert done is not None and done.is_completed
    # the publish left the markers: they go after the lock, which the crash never reached
    assert len(list_marked_files(table.base_path, t)) == len(ranges)

    # another writer's pending instant, with markers that its rollback will need
    other = TableTransaction(HudiFormat(table), CommitControl(), writer_id="other")
    pending = other.begin()
    _statuses(table, pending, [OffsetRange(TopicPartition("u", 0), 0, 1)])

    second = HudiCoordinator(table, "w", control=CommitControl())
    second.start()
    assert list_marked_files(table.base_path, t) == []
    assert len(list_marked_files(table.base_path, pending)) == 1
    assert second.committed == WriterOffsets({r.partition: r.end for r in ranges})

    # and a batch that is not interrupted has its markers deleted in the background
    nxt = [OffsetRange(r.partition, r.end, r.end + 5) for r in ranges]
    t2 = second.begin_batch(1, nxt)
    assert t2 is not None
    outcome = second.complete_batch(t2, 1, nxt, _statuses(table, t2, nxt), schema=SCHEMA)
    assert outcome.files == len(nxt)
    assert wait_for_marker_deletions(timeout_s=30)
    assert list_marked_files(table.base_path, t2) == []


_EXIT_RIGHT_AFTER_COMMIT = """
import sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.coordinator import HudiCoordinator
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.formats.hudi.table import markers
from lakesink.formats.hudi.table.hudi_table import HudiTable
from unit.test_commit_cost_paths import SCHEMA, _statuses, _table

slow_delete = markers.delete_markers
markers.delete_markers = lambda *a: (time.sleep(1.0), slow_delete(*a))[1]
table = _table(Path({work!r}))
coordinator = HudiCoordinator(table, "w", control=CommitControl())
coordinator.start()
ranges = [OffsetRange(TopicPartition("t", p), 0, 10) for p in range(20)]
t = coordinator.begin_batch(0, ranges)
coordinator.complete_batch(t, 0, ranges, _statuses(table, t, ranges), schema=SCHEMA)
print(t.value)
"""


def test_a_process_that_exits_right_after_a_commit_still_deletes_its_markers(
    tmp_path: Path,
) -> None:
    # the deletion runs in a background thread (and here takes a second): the exit waits for it
    tests = str(Path(__file__).resolve().parents[1])
    child = subprocess.run(
        [sys.executable, "-c", _EXIT_RIGHT_AFTER_COMMIT.format(tests=tests, work=str(tmp_path))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    t = child.stdout.strip().splitlines()[-1]
    table = HudiTable.open(tmp_path / "t")
    done = table.timeline().get(InstantTime(t))
    assert done is not None and done.is_completed
    assert list_marked_files(table.base_path, t) == []
    assert not (table.base_path / ".hoodie/.temp" / t).exists()


def test_a_forked_child_deletes_its_markers_with_a_deleter_of_its_own(tmp_path: Path) -> None:
    # the parent's deleter thread exists: a child forked now must not queue work to it
    table = _table(tmp_path)
    coordinator, ranges, t = _first_batch(table)
    coordinator.complete_batch(t, 0, ranges, _statuses(table, t, ranges), schema=SCHEMA)
    assert wait_for_marker_deletions(timeout_s=30)
    pid = os.fork()
    if pid == 0:  # the child: one more batch, its markers deleted by its own thread
        code = 1
        try:
            nxt = [OffsetRange(r.partition, r.end, r.end + 5) for r in ranges]
            t2 = coordinator.begin_batch(1, nxt)
            assert t2 is not None
            coordinator.complete_batch(t2, 1, nxt, _statuses(table, t2, nxt), schema=SCHEMA)
            gone = wait_for_marker_deletions(timeout_s=30)
            code = 0 if gone and list_marked_files(table.base_path, t2) == [] else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while (waited := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if waited[0] == 0:  # a child stuck on a lock its parent's thread held: fail, never hang
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child did not finish its batch within 60 s")
    assert os.waitstatus_to_exitcode(waited[1]) == 0


def _metadata(t: InstantTime) -> CommitMetadata:
    fid = new_file_id()
    return CommitMetadata(
        "INSERT",
        (FileWrite("", fid, base_file_name(fid, "0-1-0", t), 1, 1),),
        schema=SCHEMA,
        extra={WRITER_ID_KEY: "w", OFFSETS_KEY: "{}"},
    )


def _full_load(table: HudiTable, monkeypatch: pytest.MonkeyPatch) -> Timeline:
    """The timeline read without any earlier load to build on."""
    with monkeypatch.context() as m:
        m.setattr(timeline_module, "_LOADED", {})
        return Timeline.load(table.storage, table.layout)


def test_timeline_loads_that_add_to_the_last_one_equal_a_full_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _table(tmp_path)
    rng = random.Random(7)
    base = 1_700_000_000_000
    begun: list[Instant] = []
    for step in range(40):
        tl = table.timeline()  # builds on the previous load where it can
        full = _full_load(table, monkeypatch)
        assert tl.instants == full.instants
        assert all(tl.get(i.time) == i for i in full.instants)
        assert tl.get(InstantTime.from_epoch_ms(base - 1)) is None
        action = rng.random()
        pending = [i for i in begun if tl.get(i.time) == i]
        if action < 0.5 or not pending:
            # a new instant: its files sort after every other (the usual commit step)
            t = InstantTime.from_epoch_ms(base + 1000 * step)
            begun.append(tl.begin(Action.COMMIT, t))
        elif action < 0.8:
            # an older pending instant completes: a file that sorts among the old ones
            inst = rng.choice(pending)
            tl.publish(inst, _metadata(inst.time))
        else:
            # an older pending instant is rolled back: files removed
            inst = rng.choice(pending)
            tl.remove_pending(inst)
    states = {i.state for i in table.timeline().instants}
    assert states == {State.INFLIGHT, State.COMPLETED}  # both kinds of change were made


def test_a_release_after_a_takeover_does_not_free_the_new_holders_lock(tmp_path: Path) -> None:
    clock = FakeClock()

    def provider(owner: str) -> FileLockProvider:
        return FileLockProvider(
            tmp_path, owner, lease_s=30, auto_renew=False, clock=clock, sleep=clock.sleep
        )

    a = provider("a")
    stalled = a.acquire(0)
    clock.now += 31  # a stalls past its lease
    b = provider("b")
    taken = b.acquire(0)
    assert taken.seq == stalled.seq + 1
    a.release(stalled)  # late, without looking for newer leases
    assert (tmp_path / LOCK_DIR / f"{stalled.seq:012d}.released").exists()
    taken.check()
    assert provider("c").try_acquire() is None  # b still holds the lock
    b.release(taken)
    assert provider("c").try_acquire() is not None


class LockedControl(CommitControl):
    """No other writer, but a lock whose holding is visible to the test."""

    def __init__(self) -> None:
        super().__init__()
        self.held = False

    @contextlib.contextmanager
    def locked(self, table: HudiTable) -> Iterator[None]:
        self.held = True
        try:
            yield
        finally:
            self.held = False


def test_the_completed_file_is_encoded_before_the_lock_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _table(tmp_path)
    control = LockedControl()
    tx = TableTransaction(HudiFormat(table), control, writer_id="w")
    t = tx.begin()
    fid = new_file_id()
    f = FileWrite("", fid, base_file_name(fid, "0-1-0", t), 1, 1)
    create_marker(table.base_path, t, "", f.path)
    (table.base_path / f.path).touch()
    tx.stage({f.path})
    md = CommitMetadata("INSERT", (f,), schema=SCHEMA, extra={WRITER_ID_KEY: "w"})
    encode = CommitMetadata.encode
    under_lock: list[bool] = []

    def recording_encode(*args: Any) -> bytes:
        under_lock.append(control.held)
        return encode(*args)

    monkeypatch.setattr(CommitMetadata, "encode", staticmethod(recording_encode))
    result = tx.commit(md)
    assert result.published and result.instant is not None
    assert under_lock == [False]  # encoded once, before the lock
    monkeypatch.undo()
    timeline_module._METADATA.clear()  # read the file itself back, not what the publish kept
    assert table.timeline().commit_metadata(result.instant).writes == (f,)
