"""InstantTimeGenerator: unique, strictly increasing millisecond instant times."""

from __future__ import annotations

import threading

import pytest

from lakesink.errors import LockError
from lakesink.formats.hudi.concurrency.instant_time import InstantTimeGenerator
from lakesink.protocol.instant import InstantTime

BASE_MS = 1_735_689_600_000  # 2025-01-01T00:00:00Z


class ScriptedClock:
    def __init__(self, *values: int) -> None:
        self.values = list(values)

    def __call__(self) -> int:
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


def test_instant_time_is_the_clock_when_nothing_is_newer() -> None:
    gen = InstantTimeGenerator(ScriptedClock(BASE_MS))
    assert gen.next() == InstantTime("20250101000000000")


def test_same_millisecond_twice_gives_strictly_increasing_times() -> None:
    gen = InstantTimeGenerator(ScriptedClock(BASE_MS))
    times = [gen.next() for _ in range(5)]
    assert [t.to_epoch_ms() for t in times] == [BASE_MS + i for i in range(5)]


def test_clock_going_backwards_never_goes_below_the_last_issued() -> None:
    gen = InstantTimeGenerator(ScriptedClock(BASE_MS + 500, BASE_MS, BASE_MS + 100, BASE_MS + 900))
    times = [gen.next().to_epoch_ms() for _ in range(4)]
    assert times == [BASE_MS + 500, BASE_MS + 501, BASE_MS + 502, BASE_MS + 900]


def test_newest_instant_on_the_timeline_from_another_writer_is_exceeded() -> None:
    other = InstantTime.from_epoch_ms(BASE_MS + 10_000)  # a writer whose clock runs ahead
    gen = InstantTimeGenerator(ScriptedClock(BASE_MS), latest_instant=lambda: other)
    assert gen.next().to_epoch_ms() == BASE_MS + 10_001
    assert gen.next(InstantTime.from_epoch_ms(BASE_MS + 20_000)).to_epoch_ms() == BASE_MS + 20_001


def test_two_generators_sharing_a_timeline_never_collide() -> None:
    timeline: list[InstantTime] = []

    def latest() -> InstantTime | None:
        return max(timeline) if timeline else None

    a = InstantTimeGenerator(ScriptedClock(BASE_MS), latest_instant=latest)
    b = InstantTimeGenerator(ScriptedClock(BASE_MS - 5), latest_instant=latest)
    for _ in range(10):
        for gen in (a, b):
            timeline.append(gen.next())  # each under the lock, then written to the timeline
    assert len(set(timeline)) == 20 and timeline == sorted(timeline)


def test_lost_lease_is_checked_before_generating() -> None:
    class LostLease:
        owner = "w"
        expires_at = 0.0

        def is_valid(self) -> bool:
            return False

        def check(self) -> None:
            raise LockError("lost")

        def renew(self) -> None:
            raise LockError("lost")

    with pytest.raises(LockError):
        InstantTimeGenerator(ScriptedClock(BASE_MS)).next(lease=LostLease())


def test_threads_of_one_generator_get_unique_times() -> None:
    gen = InstantTimeGenerator(ScriptedClock(BASE_MS))
    out: list[InstantTime] = []
    mutex = threading.Lock()

    def run() -> None:
        for _ in range(200):
            t = gen.next()
            with mutex:
                out.append(t)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(out)) == 800
