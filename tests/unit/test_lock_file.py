"""FileLockProvider: lease expiry and takeover logic with a fake clock (no sleeps)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest

from lakesink.errors import ConfigError, LockError
from lakesink.formats.hudi.concurrency.factory import make_lock_provider
from lakesink.formats.hudi.concurrency.lock import (
    LOCK_DIR,
    FileLockProvider,
    LockLease,
    NoLockProvider,
)


class FakeClock:
    """Seconds that move only when told; `sleep` advances them."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now
        self.slept = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept += s
        self.now += s


def provider(tmp_path: Path, owner: str, clock: FakeClock, **kw: Any) -> FileLockProvider:
    return FileLockProvider(
        tmp_path, owner, lease_s=30, auto_renew=False, clock=clock, sleep=clock.sleep, **kw
    )


def test_acquire_free_lock_writes_lease_file_with_owner_and_expiry(tmp_path: Path) -> None:
    clock = FakeClock()
    lease = provider(tmp_path, "w1", clock).acquire(timeout_s=0)
    assert isinstance(lease, LockLease)
    assert lease.owner == "w1"
    assert lease.expires_at == clock.now + 30
    doc = json.loads((tmp_path / LOCK_DIR / "000000000001.lease").read_text())
    assert doc["owner"] == "w1" and doc["expires_at"] == clock.now + 30
    lease.check()
    assert lease.is_valid()


def test_held_lock_is_refused_until_timeout_with_holder_named(tmp_path: Path) -> None:
    clock = FakeClock()
    provider(tmp_path, "w1", clock).acquire(0)
    b = provider(tmp_path, "w2", clock)
    assert b.try_acquire() is None
    with pytest.raises(LockError, match=r"'w1' \(lease 1\)") as e:
        b.acquire(timeout_s=5)
    assert e.value.retriable
    assert clock.slept >= 5  # waited on the fake clock, not the real one


def test_released_lock_goes_to_next_contender_without_waiting(tmp_path: Path) -> None:
    clock = FakeClock()
    a = provider(tmp_path, "w1", clock)
    lease = a.acquire(0)
    a.release(lease)
    a.release(lease)  # idempotent
    with pytest.raises(LockError, match="released"):
        lease.check()
    second = provider(tmp_path, "w2", clock).acquire(0)
    assert second.seq == 2 and second.owner == "w2"


def test_expired_lease_is_taken_over_and_old_holder_check_raises(tmp_path: Path) -> None:
    clock = FakeClock()
    old = provider(tmp_path, "w1", clock).acquire(0)
    b = provider(tmp_path, "w2", clock)
    clock.now += 29.9
    assert b.try_acquire() is None  # not expired yet: never broken early
    clock.now += 0.2
    new = b.try_acquire()
    assert new is not None and new.seq == 2
    assert not old.is_valid()
    with pytest.raises(LockError, match="lost"):
        old.check()
    new.check()


def test_check_refuses_inside_the_safety_margin(tmp_path: Path) -> None:
    clock = FakeClock()
    lease = provider(tmp_path, "w1", clock, safety_margin_s=5).acquire(0)
    clock.now += 24.9
    lease.check()
    clock.now += 0.2
    with pytest.raises(LockError, match="safety margin"):
        lease.check()


def test_renewal_extends_the_lease_for_contenders(tmp_path: Path) -> None:
    clock = FakeClock()
    lease = provider(tmp_path, "w1", clock).acquire(0)
    b = provider(tmp_path, "w2", clock)
    clock.now += 20
    lease.renew()
    assert lease.expires_at == clock.now + 30
    clock.now += 15  # 35 s after acquiring: past the first expiry, inside the renewed one
    assert b.try_acquire() is None
    lease.check()
    clock.now += 16
    assert b.try_acquire() is not None


def test_renewal_after_expiry_is_refused(tmp_path: Path) -> None:
    clock = FakeClock()
    lease = provider(tmp_path, "w1", clock).acquire(0)
    clock.now += 31
    with pytest.raises(LockError):
        lease.renew()


def test_renewal_that_lands_after_expiry_loses_the_lease(tmp_path: Path) -> None:
    clock = FakeClock()
    p = provider(tmp_path, "w1", clock)
    lease = p.acquire(0)
    clock.now += 29
    real_write = p._write_renewal

    def slow_write(seq: int, token: str, until: float) -> None:
        real_write(seq, token, until)
        clock.now += 2  # the write took us past the old expiry: a contender may have acted

    p._write_renewal = slow_write  # type: ignore[method-assign]
    with pytest.raises(LockError, match="expired while being renewed"):
        lease.renew()
    assert not lease.is_valid()


def test_two_contenders_with_the_same_stale_view_cannot_both_win(tmp_path: Path) -> None:
    clock = FakeClock()
    provider(tmp_path, "w1", clock).acquire(0)
    clock.now += 31
    b = provider(tmp_path, "w2", clock)
    c = provider(tmp_path, "w3", clock)
    c_view = c._seqs()  # c looked before b acted
    won_b = b.try_acquire()
    c._seqs = lambda: c_view  # type: ignore[method-assign]
    won_c = c.try_acquire()
    assert won_b is not None and won_c is None


def test_stale_contender_recreating_a_pruned_lease_does_not_win(tmp_path: Path) -> None:
    clock = FakeClock()
    p = provider(tmp_path, "w1", clock, keep_leases=2)
    for _ in range(6):
        p.release(p.acquire(0))
    assert not (tmp_path / LOCK_DIR / "000000000002.lease").exists()  # pruned
    holder = p.acquire(0)
    stale = provider(tmp_path, "w2", clock)
    views = iter([[1]])  # its listing predates the pruning; later listings are fresh
    real_seqs = stale._seqs
    stale._seqs = lambda: next(views, None) or real_seqs()  # type: ignore[method-assign]
    assert stale.try_acquire() is None
    holder.check()


def test_the_acquire_after_a_release_creates_the_next_lease_before_listing(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    p = provider(tmp_path, "w1", clock)
    p.release(p.acquire(0))
    listings: list[int] = []
    real = p._names
    p._names = lambda: listings.append(1) or real()  # type: ignore[method-assign]
    lease = p.acquire(0)
    assert lease.seq == 2 and len(listings) == 1  # the listing that proves it the newest
    lease.check()


def test_the_next_number_taken_by_another_writer_meanwhile_is_waited_for(tmp_path: Path) -> None:
    clock = FakeClock()
    p = provider(tmp_path, "w1", clock)
    p.release(p.acquire(0))
    q = provider(tmp_path, "w2", clock)
    held = q.acquire(0)
    assert held.seq == 2
    assert p.try_acquire() is None  # its create of lease 2 fails; lease 2 is held
    q.release(held)
    again = p.try_acquire()
    assert again is not None and again.seq == 3


def test_a_successor_is_looked_up_once_the_lease_is_older_than_the_safety_margin(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    lease = provider(tmp_path, "w1", clock, safety_margin_s=5).acquire(0)
    # a contender whose clock runs 31 s ahead takes lease 2 at once
    ahead = FakeClock(clock.now + 31)
    assert provider(tmp_path, "w2", ahead).acquire(0).seq == 2
    lease.check()  # a young lease: the holder's clock decides, no request
    clock.now += 5
    with pytest.raises(LockError, match="lease 2 was taken after it"):
        lease.check()


def test_unreadable_lease_file_counts_as_held_for_one_lease_from_its_mtime(tmp_path: Path) -> None:
    clock = FakeClock()
    lock_dir = tmp_path / LOCK_DIR
    lock_dir.mkdir(parents=True)
    (lock_dir / "000000000001.lease").write_text("{not json")
    os.utime(lock_dir / "000000000001.lease", (clock.now - 29, clock.now - 29))
    p = provider(tmp_path, "w1", clock)
    assert p.try_acquire() is None  # maybe still being written: held for one lease
    clock.now += 1.5
    lease = p.acquire(0)
    assert lease.seq == 2


def test_lease_is_created_exclusively_without_hard_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_link(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, "hard links not supported")

    monkeypatch.setattr(os, "link", no_link)
    clock = FakeClock()
    first = provider(tmp_path, "w1", clock).acquire(0)
    assert first.seq == 1 and first.is_valid()
    assert provider(tmp_path, "w2", clock).try_acquire() is None


def test_locked_context_releases_even_on_error(tmp_path: Path) -> None:
    clock = FakeClock()
    p = provider(tmp_path, "w1", clock)
    with pytest.raises(RuntimeError), p.locked(0) as lease:
        assert lease.is_valid()
        raise RuntimeError("boom")
    assert not lease.is_valid()
    assert provider(tmp_path, "w2", clock).try_acquire() is not None


def test_config_errors_name_the_bad_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'filesystem', 'postgres', 'none'"):
        make_lock_provider("zookeeper", owner="w")
    with pytest.raises(ConfigError, match="DSN"):
        make_lock_provider("postgres", owner="w")
    with pytest.raises(ConfigError, match="base path"):
        make_lock_provider("filesystem", owner="w")
    with pytest.raises(ConfigError, match="positive"):
        FileLockProvider(tmp_path, "w", lease_s=0)
    assert isinstance(make_lock_provider("filesystem", owner="w", table_base_path=tmp_path),
                      FileLockProvider)  # fmt: skip
    assert isinstance(make_lock_provider("none", owner="w"), NoLockProvider)


def test_no_lock_provider_serialises_threads_of_one_process() -> None:
    p = NoLockProvider()
    with p.locked(0) as lease:
        with pytest.raises(LockError):
            p.acquire(0)
        lease.check()
    lease2 = p.acquire(0)
    p.release(lease2)
    with pytest.raises(LockError):
        lease2.check()
