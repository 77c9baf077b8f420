"""The table lock, held only around a commit (seed 003, optimistic concurrency).

A `LockProvider` hands out a `LockLease`. A lease is a promise that nobody else holds the lock
until `expires_at`; `check()` must pass right before anything is published, because a holder
that stalled (GC pause, SIGSTOP, slow disk) past its expiry may already have been taken over.

Providers:
- `FileLockProvider`: lease files on the table's own storage (seed 003, option 2): a local
  file system, or an object store with conditional creates and If-Match renewals.
- `PostgresLockProvider` (`lakesink.formats.hudi.concurrency.pg_lock`): a PostgreSQL advisory lock.
- `NoLockProvider`: one writer only; serialises the threads of this process and nothing more.

`lakesink.formats.hudi.concurrency.factory.make_lock_provider` builds the one that
`lock.provider` names.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from lakesink.errors import ConfigError, LockError
from lakesink.faults import pause_point
from lakesink.storage import (
    LocalStorage,
    ObjectChangedError,
    ObjectExistsError,
    ObjectNotFoundError,
    Storage,
    StorageError,
    as_storage,
)
from lakesink.storage.local import fsync_dir

log = logging.getLogger(__name__)

Clock = Callable[[], float]
"""Seconds since the epoch (wall clock: it is compared across processes)."""
Sleep = Callable[[float], None]

LockKind = Literal["filesystem", "postgres", "none"]
LOCK_KINDS: tuple[LockKind, ...] = ("filesystem", "postgres", "none")

LOCK_DIR = ".hoodie/.lakesink/lock"
"""Where `FileLockProvider` keeps its lease files, relative to the table base path."""


@runtime_checkable
class LockLease(Protocol):
    """One holding of the table lock, valid until `expires_at` (seconds since the epoch)."""

    @property
    def owner(self) -> str: ...

    @property
    def expires_at(self) -> float: ...

    def is_valid(self) -> bool:
        """True while this holder may still publish; never raises."""
        ...

    def check(self) -> None:
        """Raise LockError unless this holder may still publish. Call right before publishing."""
        ...

    def renew(self) -> None:
        """Extend the lease; LockError if it was already lost."""
        ...


class LockProvider(Protocol):
    """Hands out the table lock. `acquire` waits at most `timeout_s` (LockError after)."""

    def acquire(self, timeout_s: float) -> LockLease: ...

    def release(self, lease: LockLease) -> None: ...

    def locked(self, timeout_s: float) -> contextlib.AbstractContextManager[LockLease]: ...


@contextlib.contextmanager
def hold(provider: LockProvider, timeout_s: float) -> Iterator[LockLease]:
    """Acquire, yield the lease, and release it whatever happens inside."""
    lease = provider.acquire(timeout_s)
    try:
        yield lease
    finally:
        provider.release(lease)


# --------------------------------------------------------------------------------------------
# no lock: a single writer
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _ProcessLease:
    owner: str
    _provider: NoLockProvider
    _released: bool = False

    @property
    def expires_at(self) -> float:
        return math.inf

    def is_valid(self) -> bool:
        return not self._released

    def check(self) -> None:
        if self._released:
            raise LockError(f"lease of {self.owner!r} was released; take the lock again")

    def renew(self) -> None:
        self.check()


class NoLockProvider:
    """`lock.provider=none`: the user promises a single writer per table. Only the threads of
    this process are serialised; other processes are not excluded."""

    def __init__(self, owner: str = "single-writer") -> None:
        self.owner = owner
        self._mutex = threading.Lock()

    def acquire(self, timeout_s: float) -> LockLease:
        if not self._mutex.acquire(timeout=max(timeout_s, 0.0)):
            raise LockError(f"in-process lock of {self.owner!r} not free within {timeout_s}s")
        return _ProcessLease(self.owner, self)

    def release(self, lease: LockLease) -> None:
        if isinstance(lease, _ProcessLease) and not lease._released:
            lease._released = True
            self._mutex.release()

    def locked(self, timeout_s: float) -> contextlib.AbstractContextManager[LockLease]:
        return hold(self, timeout_s)


# --------------------------------------------------------------------------------------------
# file system lease lock
# --------------------------------------------------------------------------------------------

_LEASE_RE = re.compile(r"^(\d{12})\.lease$")


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """What a lease file says: who took lease number `seq` and until when (seconds)."""

    seq: int
    owner: str
    token: str
    acquired_at: float
    expires_at: float

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "owner": self.owner,
            "token": self.token,
            "acquired_at": self.acquired_at,
            "expires_at": self.expires_at,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LeaseRecord:
        return cls(
            int(d["seq"]),
            str(d["owner"]),
            str(d["token"]),
            float(d["acquired_at"]),
            float(d["expires_at"]),
        )


class FileLease:
    """Lease number `seq` of a `FileLockProvider`. Valid while not released, not expired
    (with a safety margin for the publish itself) and not succeeded by a newer lease."""

    def __init__(self, provider: FileLockProvider, record: LeaseRecord) -> None:
        self._provider = provider
        self.record = record
        self._expires_at = record.expires_at
        self._released = False
        self._lost: str | None = None
        self._renewer: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def owner(self) -> str:
        return self.record.owner

    @property
    def seq(self) -> int:
        return self.record.seq

    @property
    def expires_at(self) -> float:
        return self._expires_at

    def _why_invalid(self, margin_s: float | None = None) -> str | None:
        p = self._provider
        margin = p.safety_margin_s if margin_s is None else margin_s
        if self._released:
            return "it was released"
        if self._lost is not None:
            return self._lost
        now = p.clock()
        if now >= self._expires_at - margin:
            return (
                f"it expires at {self._expires_at:.3f} and only {self._expires_at - now:.3f}s "
                f"are left (safety margin {margin}s)"
            )
        # A successor is only taken once this lease ran out by the contender's clock, and the
        # listing after this lease's create showed no newer one. Within the safety margin of
        # the lease's start (a short hold: begin, or a commit's view and publish), a
        # contender's clock would have to run ahead of ours by the lease less the margin (25 s
        # of 30) to have taken over: the clock check above decides, with no request. Later (a
        # long hold, a stalled writer) the store is asked: leases are numbered one after the
        # other, so lease seq+1 is the one to look for (one HEAD, no LIST), and a lease file
        # that is gone was pruned behind newer ones.
        if now - self.record.acquired_at < p.safety_margin_s:
            return None
        if p.storage.exists(p._lease_key(self.seq + 1)):
            return f"lease {self.seq + 1} was taken after it"
        if not p.storage.exists(p._lease_key(self.seq)):
            return "its lease file is gone"
        return None

    def is_valid(self) -> bool:
        try:
            return self._why_invalid() is None
        except (OSError, StorageError):
            return False

    def check(self) -> None:
        self._raise_if_invalid(None)

    def _raise_if_invalid(self, margin_s: float | None) -> None:
        try:
            why = self._why_invalid(margin_s)
        except (OSError, StorageError) as e:
            raise LockError(f"cannot verify lease {self.seq} of {self.owner!r}: {e}") from e
        if why is not None:
            raise LockError(
                f"lease {self.seq} of {self.owner!r} on {self._provider.lock_dir} is lost: {why}; "
                "do not publish, retry the commit with a new lease"
            )

    def renew(self) -> None:
        """Extend to now + lease_s. Refuses once the current lease ran out: a renewal that
        lands after the expiry another contender may already have acted on proves nothing."""
        p = self._provider
        self._raise_if_invalid(0.0)
        start = p.clock()
        new_expiry = start + p.lease_s
        p._write_renewal(self.seq, self.record.token, new_expiry)
        if p.clock() >= self._expires_at:
            self._lost = "its renewal landed after the lease had expired"
            raise LockError(
                f"lease {self.seq} of {self.owner!r} expired while being renewed; "
                "do not publish, retry the commit with a new lease"
            )
        self._expires_at = new_expiry

    # the heartbeat that keeps a held lease alive

    def _start_renewer(self, every_s: float) -> None:
        def run() -> None:
            while not self._stop.wait(every_s):
                try:
                    self.renew()
                except (LockError, OSError, StorageError) as e:
                    log.warning("lock lease %s of %s not renewed: %s", self.seq, self.owner, e)
                    if not self.is_valid():
                        return

        t = threading.Thread(target=run, name=f"lakesink-lock-renew-{self.seq}", daemon=True)
        self._renewer = t
        t.start()

    def _stop_renewer(self) -> None:
        self._stop.set()
        t = self._renewer
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)

    def __repr__(self) -> str:
        return f"FileLease(seq={self.seq}, owner={self.owner!r}, expires_at={self._expires_at})"


class FileLockProvider:
    """A lease lock made of files under `<table>/.hoodie/.lakesink/lock/` (seed 003, option 2),
    on a local file system or an object store.

    Lease number n is the file `<n:012d>.lease`, created at once with its content (a
    create-if-absent: a temp file `link()`ed locally, `If-None-Match: *` on an object store; it
    fails if the name exists) and never rewritten: `{seq, owner, token, acquired_at,
    expires_at}`. The holder extends it by writing `<n>.renewed` (created once, then replaced
    only if unchanged since its last renewal, `If-Match` on an object store: a renewal never
    overwrites a write it did not see) and ends it with `<n>.released`.

    To take the lock, a contender reads the newest lease n. If it is released, or expired (its
    expiry and any renewal lie in the past), the contender creates lease n+1; the name can be
    created once, so of two contenders exactly one wins. Nothing is ever deleted or renamed to
    take over, so a stale view can never remove somebody else's fresh lease. A holder whose
    lease was taken over sees the newer lease (and its own expiry) in `check()`.
    """

    def __init__(
        self,
        table_base_path: str | os.PathLike[str] | Storage,
        owner: str,
        *,
        lease_s: float = 30.0,
        safety_margin_s: float | None = None,
        poll_s: float = 0.05,
        auto_renew: bool = True,
        keep_leases: int = 16,
        clock: Clock = time.time,
        sleep: Sleep = time.sleep,
    ) -> None:
        if lease_s <= 0:
            raise ConfigError(f"lock lease must be positive seconds, got {lease_s}")
        margin = lease_s / 6 if safety_margin_s is None else safety_margin_s
        if not 0 <= margin < lease_s:
            raise ConfigError(f"lock safety margin {margin}s must be in [0, lease {lease_s}s)")
        self.storage = as_storage(
            table_base_path if isinstance(table_base_path, Storage) else os.fspath(table_base_path)
        )
        self.table_base_path = self.storage.uri
        self.lock_dir = f"{self.storage.uri}/{LOCK_DIR}"
        """The lease folder as a path or URI, for messages."""
        self._renewal_etags: dict[int, str] = {}
        # the lease this provider released last: the next acquire tries the number after it
        # first (no listing before the create), the steady case of one writer per table
        self._released_seq: int | None = None
        self.owner = owner
        self.lease_s = lease_s
        self.safety_margin_s = margin
        self.poll_s = poll_s
        self.auto_renew = auto_renew
        self.keep_leases = max(keep_leases, 2)
        self.clock = clock
        self.sleep = sleep

    # paths and records

    def _lease_key(self, seq: int) -> str:
        return f"{LOCK_DIR}/{seq:012d}.lease"

    def _names(self) -> list[str]:
        return self.storage.list_names(LOCK_DIR)  # names only: no stat per lease file

    def _seqs(self) -> list[int]:
        return self._listing()[0]

    def _listing(self) -> tuple[list[int], frozenset[int]]:
        """(lease numbers, sorted; those with a release file), from one listing."""
        names = self._names()
        released = frozenset(int(n.split(".", 1)[0]) for n in names if n.endswith(".released"))
        return sorted(int(m.group(1)) for n in names if (m := _LEASE_RE.match(n))), released

    def _newer_than(self, seq: int) -> int | None:
        # One LIST (it also answers whether seq+1 exists): a lease newer than a name just
        # created can only exist if that name was taken before and pruned
        newer = [s for s in self._seqs() if s > seq]
        return newer[-1] if newer else None

    def read_lease(self, seq: int) -> LeaseRecord | None:
        """The lease file `seq` (None if absent). An unreadable file (being written, or its
        writer died mid-write) counts as a lease taken at its modification time."""
        key = self._lease_key(seq)
        try:
            data = self.storage.read(key)
        except ObjectNotFoundError:
            return None
        try:
            return LeaseRecord.from_json(json.loads(data))
        except (ValueError, KeyError, TypeError):
            if isinstance(self.storage, LocalStorage):
                mtime = self.storage.path(key).stat().st_mtime
            else:  # an object appears whole: garbage is not a lease being written; be careful
                mtime = self.clock()
            return LeaseRecord(seq, "<unreadable>", "", mtime, mtime + self.lease_s)

    def _renewed_until(self, seq: int) -> float | None:
        try:
            data = self.storage.read(f"{LOCK_DIR}/{seq:012d}.renewed")
            return float(json.loads(data)["until"])
        except (ObjectNotFoundError, ValueError, KeyError, TypeError):
            return None

    def lease_expiry(self, seq: int) -> float | None:
        """When lease `seq` runs out, taking renewals into account (None if no such lease)."""
        rec = self.read_lease(seq)
        if rec is None:
            return None
        renewed = self._renewed_until(seq)
        return rec.expires_at if renewed is None else max(rec.expires_at, renewed)

    def current(self) -> LeaseRecord | None:
        """The newest lease, whether or not it is still held."""
        seqs = self._seqs()
        return self.read_lease(seqs[-1]) if seqs else None

    def _write_atomic(
        self, name: str, payload: dict[str, Any], *, exclusive: bool, durable: bool = True
    ) -> bool:
        """Write `payload` as JSON to `name` in the lock dir, all at once. With `exclusive`,
        fail (return False) if `name` exists; else replace it. `durable=False` (a local file
        system): the name is not fsynced either, for a file whose loss in a crash is
        harmless."""
        if isinstance(self.storage, LocalStorage):
            return self._write_local(name, payload, exclusive=exclusive, durable=durable)
        data = json.dumps(payload).encode()
        if not exclusive:
            self.storage.write(f"{LOCK_DIR}/{name}", data)
            return True
        key = f"{LOCK_DIR}/{name}"
        try:
            self.storage.create(key, data)
        except ObjectExistsError:
            # A store client retries a create whose response was lost and meets its own object
            # (412): the same bytes (a lease carries a random token) are this create's, else
            # the holder would wait out its own lease as if another had taken it.
            try:
                return self.storage.read(key) == data
            except (OSError, StorageError):
                return False
        return True

    def _write_local(
        self, name: str, payload: dict[str, Any], *, exclusive: bool, durable: bool = True
    ) -> bool:
        assert isinstance(self.storage, LocalStorage)
        lock_dir = self.storage.path(LOCK_DIR)
        os.makedirs(lock_dir, exist_ok=True)
        target = lock_dir / name
        tmp = lock_dir / f".{uuid.uuid4().hex}.tmp"
        try:
            # The content is not fsynced, only the name (below): after a crash a lease file
            # may be left empty, and an unreadable lease counts as held from its modification
            # time (`read_lease`), while its holder died in the crash; a release file counts
            # by its name alone.
            with open(tmp, "x") as f:
                json.dump(payload, f)
            if not exclusive:
                os.replace(tmp, target)
            elif not _link_exclusive(tmp, target, payload):
                return False
            if durable:
                fsync_dir(lock_dir)
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _write_renewal(self, seq: int, token: str, until: float) -> None:
        """Create `<seq>.renewed`, then replace it only if unchanged since this holder's last
        renewal (If-Match): a renewal never overwrites a write it did not see."""
        key = f"{LOCK_DIR}/{seq:012d}.renewed"
        data = json.dumps({"token": token, "until": until}).encode()
        etag = self._renewal_etags.get(seq)
        try:
            if etag is None:
                self._renewal_etags[seq] = self.storage.create(key, data)
            else:
                self._renewal_etags[seq] = self.storage.replace_if_unchanged(key, data, etag)
        except (ObjectExistsError, ObjectChangedError) as e:
            raise LockError(
                f"renewal of lease {seq} on {self.lock_dir} was changed by someone else; "
                "the lease is lost: do not publish"
            ) from e

    # acquiring

    def try_acquire(self) -> FileLease | None:
        """One attempt: the lease if the lock was free, else None. Never waits.

        After this provider released lease n, it first tries to create n+1 without listing
        (one PUT, then the listing that proves it the newest): n+1 exists if anyone took the
        lock since, and then the create fails and the usual attempt follows. Mutual exclusion
        rests on the create either way: a name is created once."""
        last, self._released_seq = self._released_seq, None
        if last is not None:
            lease = self._take(last + 1)
            if lease is not None:
                return lease
        seqs, released = self._listing()
        if seqs:
            newest = seqs[-1]
            if newest not in released:  # the listing names the release files too: no HEAD
                expiry = self.lease_expiry(newest)
                if expiry is not None and self.clock() < expiry:
                    return None
        return self._take(seqs[-1] + 1 if seqs else 1)

    def _take(self, next_seq: int) -> FileLease | None:
        """Create lease `next_seq`; the lease if it was created and is the newest."""
        now = self.clock()
        rec = LeaseRecord(next_seq, self.owner, uuid.uuid4().hex, now, now + self.lease_s)
        if not self._write_atomic(f"{next_seq:012d}.lease", rec.to_json(), exclusive=True):
            return None  # another contender created it first
        if self._newer_than(next_seq) is not None:
            # our view was stale (an old, pruned number): ours is not the newest lease
            self._write_atomic(f"{next_seq:012d}.released", {"stale": True}, exclusive=False)
            return None
        lease = FileLease(self, rec)
        self._prune(next_seq)
        log.info("lock %s taken by %s (lease %d)", self.lock_dir, self.owner, next_seq)
        if self.auto_renew:
            lease._start_renewer(max(self.lease_s / 3, 0.01))
        return lease

    def acquire(self, timeout_s: float) -> FileLease:
        deadline = self.clock() + timeout_s
        while True:
            try:
                lease = self.try_acquire()
            except (OSError, StorageError) as e:
                raise LockError(f"cannot take the lock under {self.lock_dir}: {e}") from e
            if lease is not None:
                return lease
            if self.clock() >= deadline:
                cur = self.current()
                held = (
                    f"held by {cur.owner!r} (lease {cur.seq}) until {self.lease_expiry(cur.seq)}"
                    if cur is not None
                    else "contended"
                )
                raise LockError(
                    f"lock {self.lock_dir} not acquired within {timeout_s}s: it is {held}; "
                    "retry later or raise the lock timeout"
                )
            pause_point("waiting-for-lock")  # a test-only hook: a race across processes
            self.sleep(self.poll_s)

    def release(self, lease: LockLease) -> None:
        if not isinstance(lease, FileLease) or lease._released:
            return
        lease._stop_renewer()
        lease._released = True
        self._released_seq = lease.seq
        # Contenders look only at the newest lease's release file, so this one is written
        # whether or not a newer lease took over (no LIST to find out), and without fsync: a
        # release lost in a crash only makes contenders wait for the lease's expiry, and the
        # lease file itself was made durable before it was used.
        try:
            self._write_atomic(
                f"{lease.seq:012d}.released",
                {"token": lease.record.token, "at": self.clock()},
                exclusive=False,
                durable=False,
            )
        except (OSError, StorageError) as e:
            log.warning(
                "lock lease %d of %s not released (it will expire): %s", lease.seq, self.owner, e
            )

    def locked(self, timeout_s: float) -> contextlib.AbstractContextManager[FileLease]:
        return hold(self, timeout_s)  # type: ignore[return-value]

    def _prune(self, newest: int) -> None:
        """Delete the files of leases far older than `newest`; nobody can hold them."""
        floor = newest - self.keep_leases
        if floor <= 0 or newest % max(1, self.keep_leases // 2):
            return  # pruning lists the lock folder: every keep_leases/2 leases is enough
        try:
            names = self._names()
            old = [n for n in names if (h := n.split(".", 1)[0]).isdigit() and int(h) < floor]
            self.storage.delete_many([f"{LOCK_DIR}/{n}" for n in old])
        except (OSError, StorageError):
            return
        for n in old:
            self._renewal_etags.pop(int(n.split(".", 1)[0]), None)


_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK}


def _link_exclusive(tmp: Path, target: Path, payload: dict[str, Any]) -> bool:
    """Create `target` with the content of `tmp` unless it exists (False then). `link()` makes
    the name appear with its full content; on file systems without hard links, fall back to
    O_CREAT|O_EXCL and write in place (readers treat a half-written lease as held)."""
    try:
        os.link(tmp, target)
        return True
    except FileExistsError:
        return False
    except OSError as e:
        if e.errno not in _NO_HARD_LINKS:
            raise
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f)
        f.flush()
        os.fsync(f.fileno())
    return True


__all__ = [
    "LOCK_DIR",
    "LOCK_KINDS",
    "Clock",
    "FileLease",
    "FileLockProvider",
    "LeaseRecord",
    "LockKind",
    "LockLease",
    "LockProvider",
    "NoLockProvider",
    "hold",
]
