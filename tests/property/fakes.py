"""Fake commit services for the state machines: one shared `World` (a fake clock, the table lock,
heartbeats and writer incarnations) and per-process `FakeServices` bound to it.

A process that crashes stops beating and never releases what it holds, like a SIGKILL; a
stalled process (GC pause, SIGSTOP) stops beating while the clock moves on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from lakesink.errors import FencedError, HeartbeatExpiredError, LockError
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.timeline import Timeline
from lakesink.protocol.instant import InstantTime


class Crash(BaseException):
    """Raised at an injected crash point: the process dies there (nothing catches it)."""


@dataclass
class World:
    """What every process of the test shares: time, the lock, heartbeats, incarnations."""

    now_s: float
    lock_lease_s: float = 5.0
    heartbeat_tolerance_s: float = 10.0
    heartbeat_margin_s: float = 2.0
    lock_holder: FakeServices | None = None
    lock_expires_s: float = 0.0
    beats: dict[str, tuple[FakeServices, float]] = field(default_factory=dict)
    incarnations: dict[str, int] = field(default_factory=dict)
    live: list[FakeServices] = field(default_factory=list)
    crash_at: str | None = None

    def now_ms(self) -> int:
        return int(self.now_s * 1000)

    def advance(self, seconds: float, *, stalled: frozenset[int] = frozenset()) -> None:
        """Let time pass; every live, not stalled process beats its heartbeats meanwhile."""
        self.now_s += seconds
        for t, (owner, _) in list(self.beats.items()):
            if owner.alive and id(owner) not in stalled:
                self.beats[t] = (owner, self.now_s)

    def crash_point(self, point: str) -> None:
        if self.crash_at == point:
            self.crash_at = None
            raise Crash(point)


class FakeServices(CommitControl):
    """One process's view of the world's services."""

    def __init__(self, world: World, name: str) -> None:
        super().__init__(clock_ms=world.now_ms)
        self.world = world
        self.name = name
        self.alive = True
        self.incarnation: tuple[str, int] | None = None
        self._last_issued = 0
        world.live.append(self)

    def die(self) -> None:
        """The process is gone: no more beats; a lock it holds stays until its lease runs out."""
        self.alive = False
        if self in self.world.live:
            self.world.live.remove(self)

    def claim(self, table: HudiTable, writer_id: str) -> None:
        n = self.world.incarnations.get(writer_id, 0) + 1
        self.world.incarnations[writer_id] = n
        self.incarnation = (writer_id, n)

    @contextlib.contextmanager
    def locked(self, table: HudiTable) -> Iterator[None]:
        w = self.world
        if w.lock_holder is not None and w.lock_holder is not self and w.now_s < w.lock_expires_s:
            raise LockError(f"lock held by {w.lock_holder.name} until {w.lock_expires_s}")
        w.lock_holder, w.lock_expires_s = self, w.now_s + w.lock_lease_s
        try:
            yield
        except Crash:
            raise  # a dead process releases nothing
        except BaseException:
            self._release()
            raise
        self._release()

    def _release(self) -> None:
        if self.world.lock_holder is self:
            self.world.lock_holder = None

    def next_instant_time(self, table: HudiTable, timeline: Timeline | None = None) -> InstantTime:
        instants = (timeline or table.timeline()).instants
        latest = max((i.time.to_epoch_ms() for i in instants), default=0)
        ms = max(self.world.now_ms(), latest + 1, self._last_issued + 1)
        self._last_issued = ms
        return InstantTime.from_epoch_ms(ms)

    def start_heartbeat(self, table: HudiTable, t: InstantTime) -> None:
        self.world.beats[t.value] = (self, self.world.now_s)

    def stop_heartbeat(self, table: HudiTable, t: InstantTime) -> None:
        self.world.beats.pop(t.value, None)

    def heartbeat_expired(self, table: HudiTable, t: InstantTime) -> bool:
        beat = self.world.beats.get(t.value)
        return beat is None or self.world.now_s - beat[1] > self.world.heartbeat_tolerance_s

    def check_alive(self, table: HudiTable, t: InstantTime) -> None:
        w = self.world
        if w.lock_holder is not self or w.now_s >= w.lock_expires_s:
            raise LockError(f"{self.name} does not hold the lock")
        beat = w.beats.get(t.value)
        if beat is None or beat[0] is not self:
            raise HeartbeatExpiredError(f"heartbeat of {t} is gone ({self.name})")
        if w.now_s - beat[1] > w.heartbeat_tolerance_s - w.heartbeat_margin_s:
            raise HeartbeatExpiredError(f"heartbeat of {t} is too old ({self.name})")
        if self.incarnation is None:
            raise FencedError(f"{self.name} never claimed an incarnation")
        writer_id, n = self.incarnation
        if w.incarnations.get(writer_id) != n:
            raise FencedError(f"{self.name}: incarnation {n} of {writer_id} is fenced")
