"""Unit tests of how a writer's inline services count the commits since their last run without
a request of their own per commit: on the timeline the commit began on (listed under the lock),
plus the commit itself, with the last run read from the table once and then kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakesink.formats.hudi.services import inline
from lakesink.formats.hudi.services.inline import LAST_RUN_FILE, LastRun, commits_since_last_run
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.timeline import Timeline
from lakesink.protocol.instant import Action, InstantTime

BASE_MS = 1_780_000_000_000


def _commit(table: HudiTable, n: int) -> tuple[InstantTime, Timeline]:
    """Commit number `n`; its instant time and the timeline it began on."""
    t = InstantTime.from_epoch_ms(BASE_MS + 1000 * n)
    began_on = table.timeline()
    inflight = began_on.begin(Action.COMMIT, t)
    table.timeline().publish(inflight, CommitMetadata("INSERT", (), {}, "", {}))
    return t, began_on


@pytest.fixture
def table(tmp_path: Path) -> HudiTable:
    return HudiTable.create(tmp_path / "t", TableConfig("t", ("id",), (), version=8))


def test_the_count_on_the_begin_timeline_equals_a_fresh_listing(table: HudiTable) -> None:
    for n in range(3):
        _, began_on = _commit(table, n)
        assert commits_since_last_run(table, began_on) == commits_since_last_run(table) == n + 1
    # after a run at the second commit, only the third counts
    table.storage.write(
        str(LAST_RUN_FILE), InstantTime.from_epoch_ms(BASE_MS + 1000).value.encode()
    )
    _, began_on = _commit(table, 3)
    assert commits_since_last_run(table, began_on) == commits_since_last_run(table) == 2


def test_the_last_run_is_read_once_then_kept_as_the_writer_writes_it(
    table: HudiTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    real = inline._last_run

    def counted(t: HudiTable) -> InstantTime | None:
        reads.append(t.uri)
        return real(t)

    monkeypatch.setattr(inline, "_last_run", counted)
    last_run = LastRun()
    counts = []
    for n in range(4):
        t, began_on = _commit(table, n)
        counts.append(commits_since_last_run(table, began_on, last_run))
        if n == 1:
            last_run.set(t)  # the writer ran its services after its second commit
    assert counts == [1, 2, 1, 2]
    assert len(reads) == 1
