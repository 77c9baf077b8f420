"""Unit tests of a coordinator's start-up reads: recovery and the committed offsets share one
listing of the timeline, and the offsets stay right when recovery rolled something back."""

from __future__ import annotations

from pathlib import Path

import pytest
from integration.test_fencing import TABLE_CONFIG, config, write_batch

from lakesink.formats.hudi import writer_state
from lakesink.formats.hudi.control import WriterCommitControl
from lakesink.formats.hudi.coordinator import HudiCoordinator
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.timeline import Timeline
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets


def _coordinator(table: HudiTable, path: Path) -> HudiCoordinator:
    return HudiCoordinator(
        table, "w1", control=WriterCommitControl.for_writer(config(path, "w1").settings)
    )


def _commit(c: HudiCoordinator, table: HudiTable, batch: int, r: OffsetRange) -> WriterOffsets:
    t = c.begin_batch(batch, [r])
    assert t is not None
    statuses, schema = write_batch(table, t, [r])
    c.commit(c.precommit(t, batch, [r], statuses, schema))
    return writer_state.committed_offsets(table, "w1")


def _count_loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    loads: list[int] = []
    original = Timeline.load.__func__  # type: ignore[attr-defined]

    def counted(cls: type[Timeline], *args: object, **kwargs: object) -> Timeline:
        loads.append(1)
        return original(cls, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(Timeline, "load", classmethod(counted))
    return loads


@pytest.mark.parametrize("pending", [False, True], ids=["clean-stop", "crashed-mid-batch"])
def test_coordinator_restart_lists_the_timeline_once_and_knows_its_committed_offsets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pending: bool
) -> None:
    path = tmp_path / "t"
    table = HudiTable.create(path, TABLE_CONFIG)
    first = _coordinator(table, path)
    first.start()
    tp = TopicPartition("events", 0)
    expected = _commit(first, table, 0, OffsetRange(tp, 0, 5))
    assert expected.next_offsets == {tp: 5}
    if pending:  # a second batch written but never committed: recovery rolls it back
        r = OffsetRange(tp, 5, 9)
        t = first.begin_batch(1, [r])
        assert t is not None
        write_batch(table, t, [r])
        assert table.timeline().inflight_or_requested()
        first.control.stop_heartbeat(table, t)

    loads = _count_loads(monkeypatch)
    restarted = _coordinator(table, path)
    restarted.start()
    after_start = len(loads)
    assert restarted.committed == expected
    assert len(loads) == after_start, "the committed offsets listed the timeline again"
    if not pending:
        assert after_start == 1
    assert not table.timeline().inflight_or_requested()
