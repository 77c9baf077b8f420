"""Writer liveness and the standby's takeover rule, on a local table root with a fake
monotonic clock (the standby's own clock decides a lapse)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lakesink.config import build_config
from lakesink.engine.liveness import (
    ALIVE,
    STOPPED,
    LivenessRecord,
    LivenessWatch,
    WriterLiveness,
)
from lakesink.errors import ConfigError
from lakesink.storage import LocalStorage

KEY = ".hoodie/.lakesink/liveness/w1.json"


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def active(storage: LocalStorage) -> WriterLiveness:
    """An active writer that took the file; renewals by hand (no thread)."""
    live = WriterLiveness(storage, KEY, writer_id="w1", interval_s=1.0)
    live.storage.write(KEY, live._record(ALIVE))
    meta = storage.head(KEY)
    assert meta is not None
    live._etag = meta.etag
    return live


def watch(storage: LocalStorage, clock: FakeMonotonic, lapse_s: float = 4.0) -> LivenessWatch:
    return LivenessWatch(
        storage, KEY, writer_id="w1", interval_s=1.0, lapse_s=lapse_s, monotonic=clock
    )


def record(storage: LocalStorage) -> LivenessRecord:
    rec = LivenessRecord.parse(storage.read(KEY))
    assert rec is not None
    return rec


def test_a_renewing_writer_is_never_taken_over(tmp_path: Path) -> None:
    storage, clock = LocalStorage(tmp_path), FakeMonotonic()
    live, standby = active(storage), watch(storage, clock)
    for _ in range(10):  # 30 s of renewals every 3 s, below the 4 s lapse
        assert standby.poll() is None
        clock.now += 3.0
        assert live.renew()
    assert standby.poll() is None
    assert record(storage).owner == live.owner


def test_a_lapsed_writer_is_taken_over_and_learns_it_on_its_next_renewal(tmp_path: Path) -> None:
    storage, clock = LocalStorage(tmp_path), FakeMonotonic()
    live, standby = active(storage), watch(storage, clock)
    assert standby.poll() is None
    clock.now += 4.5  # no renewal seen for longer than the lapse
    takeover = standby.poll()
    assert takeover is not None
    assert "has not renewed its liveness for 4.5s" in takeover.reason
    assert record(storage).owner == takeover.liveness.owner
    # the paused writer resumes: its conditional renewal fails, it knows it is fenced
    assert not live.renew()
    assert live.lost.is_set()
    assert record(storage).owner == takeover.liveness.owner  # and it changed nothing
    # the new owner renews from the version it wrote
    assert takeover.liveness.renew()
    assert not takeover.liveness.lost.is_set()


def test_a_clean_stop_hands_over_at_once(tmp_path: Path) -> None:
    storage, clock = LocalStorage(tmp_path), FakeMonotonic()
    live, standby = active(storage), watch(storage, clock)
    assert standby.poll() is None
    live.stop(handover=True)
    assert record(storage).state == STOPPED
    takeover = standby.poll()  # no time passed
    assert takeover is not None
    assert "stopped cleanly" in takeover.reason


def test_two_standbys_only_one_takes_over(tmp_path: Path) -> None:
    storage, clock = LocalStorage(tmp_path), FakeMonotonic()
    active(storage)
    first, second = watch(storage, clock), watch(storage, clock)
    assert first.poll() is None and second.poll() is None
    clock.now += 5.0
    # both saw the same version lapse; the conditional replace lets one of them have it
    won = first.poll()
    assert won is not None
    assert second.poll() is None
    # the loser now watches the winner: it renews, so the loser never takes over
    for _ in range(5):
        clock.now += 3.0
        assert won.liveness.renew()
        assert second.poll() is None
    clock.now += 4.5
    assert second.poll() is not None  # until the winner lapses in turn


def test_no_file_means_no_writer_has_run_yet_and_the_standby_waits(tmp_path: Path) -> None:
    storage, clock = LocalStorage(tmp_path), FakeMonotonic()
    standby = watch(storage, clock)
    for _ in range(5):
        assert standby.poll() is None
        clock.now += 10.0
    assert not storage.exists(KEY)


def test_a_started_writer_takes_the_file_and_stops_marking_it_stopped(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    live = WriterLiveness(storage, KEY, writer_id="w1", interval_s=0.05).start()
    first = storage.head(KEY)
    assert first is not None
    assert record(storage).state == ALIVE
    # the background thread renews: the version changes without any batch
    deadline = 100
    while storage.head(KEY) == first and deadline:
        deadline -= 1
        live._stop.wait(0.02)
    assert storage.head(KEY) != first
    live.stop(handover=True)
    rec = record(storage)
    assert rec.state == STOPPED and rec.owner == live.owner


def test_an_unreadable_file_counts_as_a_lapsed_writer(tmp_path: Path) -> None:
    storage, clock = LocalStorage(tmp_path), FakeMonotonic()
    storage.write(KEY, b"not json")
    standby = watch(storage, clock)
    assert standby.poll() is None
    clock.now += 4.5
    takeover = standby.poll()
    assert takeover is not None
    assert json.loads(storage.read(KEY))["owner"] == takeover.liveness.owner


@pytest.mark.parametrize(
    ("interval", "lapse"), [(1.0, 1.5), (2.0, 3.9)], ids=["below-twice", "just-below"]
)
def test_config_refuses_a_lapse_shorter_than_two_renewals(interval: float, lapse: float) -> None:
    raw = {
        "kafka.bootstrap.servers": "127.0.0.1:9092",
        "kafka.topics": "t",
        "value.format": "json",
        "value.schema": "a INT",
        "table.path": "/tmp/t",
        "standby.liveness.interval.s": interval,
        "standby.takeover.after.s": lapse,
    }
    with pytest.raises(ConfigError, match=r"standby\.takeover\.after\.s=.* must be at least twice"):
        build_config(raw)
    cfg = build_config({**raw, "standby.takeover.after.s": 2 * interval})
    assert cfg["standby.takeover.after.s"] == 2 * interval
