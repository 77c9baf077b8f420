"""lakesink.faults' pauses: a process told to pause at a point marks that it reached it and
waits for its go file; a contender for a held table lock passes `waiting-for-lock`. Threads
and files only; no sleeps as synchronisation."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from lakesink.faults import crash_point, pause_point
from lakesink.formats.hudi.concurrency.lock import FileLockProvider


@pytest.fixture
def pause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LAKESINK_PAUSE_AT", "after-write,waiting-for-lock")
    monkeypatch.setenv("LAKESINK_PAUSE_DIR", str(tmp_path))
    monkeypatch.delenv("LAKESINK_CRASH_AT", raising=False)
    return tmp_path


def test_a_point_not_named_passes_without_a_mark(pause: Path) -> None:
    pause_point("after-publish")
    crash_point("before-begin")
    assert list(pause.iterdir()) == []


def test_no_pause_without_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAKESINK_PAUSE_AT", raising=False)
    monkeypatch.setenv("LAKESINK_PAUSE_DIR", str(tmp_path))
    pause_point("after-write")
    assert list(tmp_path.iterdir()) == []


def test_a_crash_point_named_waits_for_its_go_file_after_marking_it_was_reached(
    pause: Path,
) -> None:
    passed = threading.Event()

    def run() -> None:
        crash_point("after-write")
        passed.set()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    while not (pause / "after-write.reached").exists():
        assert worker.is_alive()
    # it waits for the go file (the pause's own timeout is 120 s)
    assert not passed.is_set() and worker.is_alive()
    (pause / "after-write.go").touch()
    worker.join(timeout=30)
    assert passed.is_set()


def test_a_contender_for_a_held_lock_passes_waiting_for_lock(pause: Path) -> None:
    (pause / "waiting-for-lock.go").touch()  # mark only
    table = pause / "table"
    holder = FileLockProvider(table, "holder", auto_renew=False).acquire(timeout_s=0)
    holder_provider = FileLockProvider(table, "holder", auto_renew=False)

    def released_while_waiting(_s: float) -> None:  # the contender's wait: the holder lets go
        assert (pause / "waiting-for-lock.reached").exists()
        holder_provider.release(holder)

    contender = FileLockProvider(table, "contender", auto_renew=False)
    contender.sleep = released_while_waiting
    lease = contender.acquire(timeout_s=60)
    assert lease.owner == "contender"
    contender.release(lease)
