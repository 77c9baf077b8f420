"""Heartbeats of inflight instants and writer incarnations (fencing), with a fake clock."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from lakesink.errors import ConfigError, FencedError, HeartbeatExpiredError
from lakesink.formats.hudi.concurrency.heartbeat import (
    HEARTBEAT_DIR,
    WRITERS_DIR,
    Heartbeat,
    claim_writer,
    heartbeat_expired,
    last_heartbeat,
)

T = "20250101000000123"


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def beat_once(tmp_path: Path, clock: FakeClock, **kw: float) -> Heartbeat:
    hb = Heartbeat(tmp_path, T, writer_id="w1", interval_s=10, tolerance_s=60, clock=clock, **kw)
    hb.beat()
    return hb


def test_beat_writes_hudi_heartbeat_file_with_mtime_of_the_beat(tmp_path: Path) -> None:
    clock = FakeClock()
    beat_once(tmp_path, clock)
    path = tmp_path / HEARTBEAT_DIR / T
    assert json.loads(path.read_text())["writer_id"] == "w1"
    assert last_heartbeat(tmp_path, T) == clock.now
    assert sorted(p.name for p in path.parent.iterdir()) == [T]  # no temp files beside it


def test_heartbeat_expires_only_after_the_tolerance(tmp_path: Path) -> None:
    clock = FakeClock()
    beat_once(tmp_path, clock)
    assert not heartbeat_expired(tmp_path, T, 60, now=clock.now + 60)
    assert heartbeat_expired(tmp_path, T, 60, now=clock.now + 60.5)


def test_missing_heartbeat_counts_as_expired(tmp_path: Path) -> None:
    assert heartbeat_expired(tmp_path, T, 60, now=0)
    assert last_heartbeat(tmp_path, T) is None


def test_writer_aborts_before_others_may_roll_it_back(tmp_path: Path) -> None:
    clock = FakeClock()
    hb = beat_once(tmp_path, clock)
    clock.now += 49
    hb.check()
    clock.now += 2  # 51 s without a beat: tolerance 60 minus margin 10 exceeded
    assert hb.is_expired()
    with pytest.raises(HeartbeatExpiredError, match=T):
        hb.check()
    assert not heartbeat_expired(tmp_path, T, 60, now=clock.now)  # others still wait
    hb.beat()
    hb.check()


def test_removed_heartbeat_file_makes_check_fail(tmp_path: Path) -> None:
    clock = FakeClock()
    hb = beat_once(tmp_path, clock)
    (tmp_path / HEARTBEAT_DIR / T).unlink()  # a lazy rollback took the instant
    with pytest.raises(HeartbeatExpiredError, match="rolled back"):
        hb.check()


def test_never_started_heartbeat_is_expired(tmp_path: Path) -> None:
    hb = Heartbeat(tmp_path, T, interval_s=1, tolerance_s=3, clock=FakeClock())
    assert hb.is_expired()


def test_invalid_intervals_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="exceed"):
        Heartbeat(tmp_path, T, interval_s=10, tolerance_s=10)


def test_thread_keeps_beating_and_stop_deletes(tmp_path: Path) -> None:
    hb = Heartbeat(tmp_path, T, interval_s=0.02, tolerance_s=1).start()
    try:
        first = hb.last_success
        deadline = time.monotonic() + 5
        while hb.last_success == first and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hb.last_success != first
        hb.check()
    finally:
        hb.stop(delete=True)
    assert not (tmp_path / HEARTBEAT_DIR / T).exists()


def test_claim_writer_increments_and_fences_older_incarnations(tmp_path: Path) -> None:
    first = claim_writer(tmp_path, "writer-a")
    first.check()
    second = claim_writer(tmp_path, "writer-a")
    assert (first.incarnation, second.incarnation) == (1, 2)
    second.check()
    with pytest.raises(FencedError, match="incarnation 1 is fenced: incarnation 2"):
        first.check()
    assert json.loads((tmp_path / WRITERS_DIR / "writer-a.json").read_text())["incarnation"] == 2
    other = claim_writer(tmp_path, "writer-b")
    assert other.incarnation == 1 and other.is_current()
    second.check()


def test_concurrent_claims_get_unique_incarnations(tmp_path: Path) -> None:
    got: list[int] = []
    lock = threading.Lock()

    def claim() -> None:
        for _ in range(10):
            n = claim_writer(tmp_path, "w").incarnation
            with lock:
                got.append(n)

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 41))


@pytest.mark.parametrize("bad", ["", ".hidden", "a/b", "x" * 200, "a b"])
def test_invalid_writer_id_is_a_config_error(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError, match="writer id"):
        claim_writer(tmp_path, bad)


def test_default_margin_tolerates_a_late_beat_when_tolerance_is_tight(tmp_path: Path) -> None:
    clock = FakeClock()
    hb = Heartbeat(tmp_path, T, interval_s=10, tolerance_s=20, clock=clock)
    hb.beat()
    clock.now += 12  # the next beat is 2 s late
    hb.check()
    clock.now += 4  # 16 s: margin 5 s before others may roll back after 20 s
    with pytest.raises(HeartbeatExpiredError):
        hb.check()
