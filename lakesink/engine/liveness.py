"""Writer liveness: one small file per writer id that its active process renews, so a warm
standby of the same writer id can tell when to take over.

The file (`WriterLiveness.key`) holds the owner (a token unique to one process's ownership),
the owner's pid and host, the time of the last renewal and a state: `alive`, or `stopped`
after a clean end (a standby then takes over at once). Every change after the first write
is a conditional replace of the version last seen (If-Match), so ownership moves exactly
once: the standby that replaces the version it watched lapse is the one that takes over;
another standby, or the old owner resuming after a pause, finds the version changed and
stands down. The file only elects who starts; the writer-id claim (`claim_writer`, or the
Iceberg incarnation property) still fences the old process out of the table.

A standby judges a lapse by its own monotonic clock (the version has not changed for the
lapse), never by comparing the owner's clock with its own.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from lakesink.storage import (
    ObjectChangedError,
    ObjectNotFoundError,
    Storage,
    StorageError,
)

log = logging.getLogger(__name__)

ALIVE = "alive"
STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class LivenessRecord:
    """What the liveness file says: who owns the writer id, in what state, since when."""

    owner: str
    state: str
    pid: int
    host: str
    at: float

    def to_bytes(self) -> bytes:
        fields = {"owner": self.owner, "state": self.state, "pid": self.pid, "host": self.host}
        return json.dumps({**fields, "at": self.at}).encode()

    @staticmethod
    def parse(data: bytes) -> LivenessRecord | None:
        try:
            d = json.loads(data)
            return LivenessRecord(
                str(d["owner"]), str(d["state"]), int(d["pid"]), str(d["host"]), float(d["at"])
            )
        except (ValueError, KeyError, TypeError):
            return None  # not lakesink's, or torn: treated like a lapsed owner

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


def new_record(owner: str, state: str = ALIVE) -> LivenessRecord:
    return LivenessRecord(owner, state, os.getpid(), socket.gethostname(), time.time())


class WriterLiveness:
    """The active process's side: renews the liveness file every `interval_s` on a daemon
    thread while it owns it. `lost` is set once another process replaced it (a standby took
    over): this process is then fenced, and must stop."""

    def __init__(
        self,
        storage: Storage,
        key: str,
        *,
        writer_id: str,
        interval_s: float,
        owner: str | None = None,
        etag: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.storage = storage
        self.key = key
        self.writer_id = writer_id
        self.interval_s = interval_s
        self.owner = owner or uuid.uuid4().hex
        self.clock = clock
        self.lost = threading.Event()
        self._etag = etag  # the version this process wrote last (None: not written yet)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _record(self, state: str) -> bytes:
        rec = new_record(self.owner, state)
        return LivenessRecord(rec.owner, rec.state, rec.pid, rec.host, self.clock()).to_bytes()

    def start(self) -> WriterLiveness:
        """Take the file (a plain write when this process does not own it yet: a normal
        start is the newest claim of the writer id anyway) and renew it from now on."""
        if self._etag is None:
            self.storage.write(self.key, self._record(ALIVE))
            meta = self.storage.head(self.key)
            self._etag = meta.etag if meta is not None else None
        self._thread = threading.Thread(
            target=self._run, name=f"lakesink-liveness-{self.writer_id}", daemon=True
        )
        self._thread.start()
        return self

    def renew(self, state: str = ALIVE) -> bool:
        """One conditional renewal; False (and `lost` set) once another process owns it."""
        if self.lost.is_set() or self._etag is None:
            return False
        try:
            self._etag = self.storage.replace_if_unchanged(
                self.key, self._record(state), self._etag
            )
            return True
        except (ObjectChangedError, ObjectNotFoundError):
            self.lost.set()
            log.warning(
                "writer %s: liveness file %s was taken over by another process; this process "
                "is fenced and stops publishing",
                self.writer_id,
                self.key,
            )
            return False

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if not self.renew():
                    return
            except (OSError, StorageError) as e:  # a standby may take over if this persists
                log.warning("writer %s: liveness not renewed: %s", self.writer_id, e)

    def stop(self, *, handover: bool = True) -> None:
        """Stop renewing; with `handover`, mark the file `stopped` so a standby takes over at
        once rather than after the lapse."""
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=max(self.interval_s, 5.0))
        if handover:
            try:
                self.renew(STOPPED)
            except (OSError, StorageError) as e:
                log.warning("writer %s: liveness not marked stopped: %s", self.writer_id, e)


@dataclass(frozen=True, slots=True)
class Takeover:
    """A standby's won takeover: why, from whom, and the liveness it now owns."""

    reason: str
    liveness: WriterLiveness


class LivenessWatch:
    """The standby's side: watches the liveness file until the active writer has stopped (a
    `stopped` record) or lapsed (no new version for `lapse_s` by this process's clock), then
    tries to take ownership with a conditional write. A standby only takes over from a
    writer it has seen: while there is no file (no writer of this id ran yet) it waits."""

    def __init__(
        self,
        storage: Storage,
        key: str,
        *,
        writer_id: str,
        interval_s: float,
        lapse_s: float,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        self.storage = storage
        self.key = key
        self.writer_id = writer_id
        self.interval_s = interval_s
        self.lapse_s = lapse_s
        self.monotonic = monotonic
        self.poll_s = min(0.25, interval_s / 4)
        self._sleep = sleep
        self._seen: str | None = "<unread>"  # the version last seen, and when it changed
        self._seen_at = monotonic()

    def _read(self) -> tuple[LivenessRecord | None, str | None]:
        try:
            data, etag = self.storage.read_with_etag(self.key)
        except ObjectNotFoundError:
            return None, None
        return LivenessRecord.parse(data), etag

    def _take(self, etag: str) -> WriterLiveness | None:
        """Own the file if it is still at version `etag`."""
        owner = uuid.uuid4().hex
        try:
            data = new_record(owner).to_bytes()
            new_etag = self.storage.replace_if_unchanged(self.key, data, etag)
        except (ObjectChangedError, ObjectNotFoundError):
            return None  # another standby, or the active writer, got there first
        return WriterLiveness(
            self.storage,
            self.key,
            writer_id=self.writer_id,
            interval_s=self.interval_s,
            owner=owner,
            etag=new_etag,
        )

    def poll(self) -> Takeover | None:
        """One look at the file: the won `Takeover` when the active writer stopped or lapsed
        and this standby got the file, else None (keep watching)."""
        record, etag = self._read()
        now = self.monotonic()
        if etag != self._seen:
            self._seen, self._seen_at = etag, now
        reason: str | None = None
        if record is not None and record.state == STOPPED:
            reason = f"the active writer ({record.describe()}) stopped cleanly"
        elif etag is not None and now - self._seen_at > self.lapse_s:
            who = f"the active writer ({record.describe()})" if record else "the active writer"
            reason = (
                f"{who} has not renewed its liveness for {now - self._seen_at:.1f}s "
                f"(standby.takeover.after.s={self.lapse_s:g})"
            )
        if reason is None or etag is None:
            return None
        won = self._take(etag)
        if won is None:
            self._seen = "<lost>"  # another standby (or a restart) got it: watch the new owner
            return None
        return Takeover(reason, won)

    def wait(
        self, stop: threading.Event | None = None, timeout_s: float | None = None
    ) -> Takeover | None:
        """Poll until a takeover is won (returned), or `stop` is set or `timeout_s` passed
        (None); the lapse is measured across calls."""
        stop = stop or threading.Event()
        deadline = None if timeout_s is None else self.monotonic() + timeout_s
        while not stop.is_set():
            won = self.poll()
            if won is not None:
                return won
            if deadline is not None and self.monotonic() >= deadline:
                return None
            if self._sleep is not None:
                self._sleep(self.poll_s)
            else:
                stop.wait(self.poll_s)
        return None
