"""Writer liveness: a heartbeat per inflight instant, and fencing of zombie incarnations.

A **heartbeat** is the file `.hoodie/.heartbeat/<instantTime>` (Hudi's layout) whose
modification time is the last beat; a daemon thread refreshes it every `interval_s`. Lazy
rollback (seed 003) treats an inflight instant whose heartbeat is older than the tolerance (or
missing) as failed and rolls it back, so a writer that could not beat for that long must
abort before publishing: `Heartbeat.check()` raises HeartbeatExpiredError.

A **writer incarnation** fences zombies of one writer id: each start claims the next number
under `.hoodie/.lakesink/writers/<writer_id>/` (created exclusively, so two starts never get the
same one); an incarnation that sees a newer one is fenced (`check()` raises FencedError).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from lakesink.errors import ConfigError, FencedError, HeartbeatExpiredError
from lakesink.formats.hudi.concurrency.lock import Clock
from lakesink.protocol.instant import InstantTime
from lakesink.storage import (
    LocalStorage,
    ObjectExistsError,
    ObjectNotFoundError,
    Storage,
    StorageError,
    as_storage,
)

log = logging.getLogger(__name__)

HEARTBEAT_DIR = ".hoodie/.heartbeat"
WRITERS_DIR = ".hoodie/.lakesink/writers"
TMP_DIR = ".hoodie/.lakesink/tmp"

_WRITER_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _instant_str(instant_time: InstantTime | str) -> str:
    return (
        instant_time.value
        if isinstance(instant_time, InstantTime)
        else InstantTime(instant_time).value
    )


Where = Storage | str | os.PathLike[str]
"""A table root: its storage, or the folder of a local table."""


def heartbeat_key(instant_time: InstantTime | str) -> str:
    return f"{HEARTBEAT_DIR}/{_instant_str(instant_time)}"


def heartbeat_path(
    table_base_path: str | os.PathLike[str], instant_time: InstantTime | str
) -> Path:
    return Path(table_base_path) / heartbeat_key(instant_time)


def last_heartbeat(table_base_path: Where, instant_time: InstantTime | str) -> float | None:
    """When the instant's heartbeat last beat (seconds since the epoch), None if it has none.
    Locally the file's modification time (as Hudi); on an object store the beat time the
    writer recorded in it (an object's time cannot be set)."""
    storage = as_storage(table_base_path)
    key = heartbeat_key(instant_time)
    if isinstance(storage, LocalStorage):
        try:
            return storage.path(key).stat().st_mtime
        except FileNotFoundError:
            return None
    try:
        return float(json.loads(storage.read(key))["at"])
    except ObjectNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return 0.0  # not lakesink's: as old as can be


def heartbeat_expired(
    table_base_path: Where,
    instant_time: InstantTime | str,
    tolerance_s: float,
    now: float | None = None,
) -> bool:
    """True if the instant's writer is presumed dead: no heartbeat file (as in Hudi), or none
    for more than `tolerance_s`. Lazy rollback may roll back only such inflight instants."""
    beat = last_heartbeat(table_base_path, instant_time)
    if beat is None:
        return True
    current = time.time() if now is None else now
    return current - beat > tolerance_s


def delete_heartbeat(table_base_path: Where, instant_time: InstantTime | str) -> None:
    """Remove an instant's heartbeat (after it completed or was rolled back)."""
    as_storage(table_base_path).delete(heartbeat_key(instant_time))


class Heartbeat:
    """The heartbeat of one inflight instant of this writer.

    `start()` beats once (synchronously) and then every `interval_s` on a daemon thread.
    `check()` raises once no beat succeeded for `tolerance_s - safety_margin_s`, or the file was
    removed (a lazy rollback got there first): the writer must then abort the instant.
    """

    def __init__(
        self,
        table_base_path: Where,
        instant_time: InstantTime | str,
        *,
        writer_id: str = "",
        interval_s: float = 10.0,
        tolerance_s: float = 60.0,
        safety_margin_s: float | None = None,
        clock: Clock = time.time,
    ) -> None:
        if interval_s <= 0 or tolerance_s <= interval_s:
            raise ConfigError(
                f"heartbeat tolerance {tolerance_s}s must exceed its interval {interval_s}s > 0"
            )
        # by default the writer gives up one interval (at most half the slack) before others may
        # roll it back, yet tolerates a beat that comes a little late
        default_margin = min(interval_s, (tolerance_s - interval_s) / 2)
        margin = default_margin if safety_margin_s is None else safety_margin_s
        if not 0 <= margin < tolerance_s:
            raise ConfigError(f"heartbeat safety margin {margin}s not in [0, {tolerance_s}s)")
        self.storage = as_storage(table_base_path)
        self.table_base_path = self.storage.uri
        self.instant_time = _instant_str(instant_time)
        self.writer_id = writer_id
        self.interval_s = interval_s
        self.tolerance_s = tolerance_s
        self.safety_margin_s = margin
        self.clock = clock
        self.key = heartbeat_key(self.instant_time)
        self.last_success: float | None = None
        self.last_error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """Refresh the heartbeat once; its mtime is set to the beat time."""
        now = self.clock()
        payload = {"instant_time": self.instant_time, "writer_id": self.writer_id, "at": now}
        if isinstance(self.storage, LocalStorage):
            # Not fsynced: a beat only matters while this process lives; one lost in a crash
            # makes the instant look failed sooner, which it is.
            self.storage.write(self.key, json.dumps(payload).encode(), durable=False)
            os.utime(self.storage.path(self.key), (now, now))
        else:
            self.storage.write(self.key, json.dumps(payload).encode())
        self.last_success = now

    def start(self) -> Heartbeat:
        self.beat()
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name=f"lakesink-heartbeat-{self.instant_time}", daemon=True
            )
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
                self.last_error = None
            except (OSError, StorageError) as e:
                self.last_error = e
                log.warning(
                    "heartbeat of instant %s (writer %s, table %s) not refreshed: %s",
                    self.instant_time,
                    self.writer_id,
                    self.table_base_path,
                    e,
                )

    def stop(self, *, delete: bool = False) -> None:
        """Stop beating; with `delete`, remove the file (the instant completed or rolled back)."""
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=max(self.interval_s, 5.0))
        if delete:
            delete_heartbeat(self.storage, self.instant_time)

    def is_expired(self, now: float | None = None) -> bool:
        """True if this writer must no longer trust its instant (own view, with margin)."""
        current = self.clock() if now is None else now
        if self.last_success is None:
            return True
        return current - self.last_success > self.tolerance_s - self.safety_margin_s

    def check(self, now: float | None = None) -> None:
        """Raise HeartbeatExpiredError unless the instant is still safely alive."""
        current = self.clock() if now is None else now
        if self.is_expired(current):
            age = (
                "never" if self.last_success is None else f"{current - self.last_success:.1f}s ago"
            )
            raise HeartbeatExpiredError(
                f"heartbeat of instant {self.instant_time} (writer {self.writer_id!r}, table "
                f"{self.table_base_path}) last beat {age}, beyond tolerance {self.tolerance_s}s "
                f"minus margin {self.safety_margin_s}s; another writer may roll it back: abort "
                "this instant and start a new one"
            )
        if not self.storage.exists(self.key):
            raise HeartbeatExpiredError(
                f"heartbeat file of instant {self.instant_time} (writer {self.writer_id!r}) is "
                f"gone from {self.storage.uri}/{HEARTBEAT_DIR}; the instant was probably rolled "
                "back: abort it"
            )

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------
# writer incarnations (zombie fencing)
# --------------------------------------------------------------------------------------------


def _check_writer_id(writer_id: str) -> None:
    if not _WRITER_ID_RE.match(writer_id):
        raise ConfigError(
            f"writer id {writer_id!r} is not valid: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )


def _incarnation_name(n: int) -> str:
    return f"{n:010d}.json"


def _incarnations(storage: Storage, writer_dir: str) -> list[int]:
    names = [m.key.rsplit("/", 1)[-1] for m in storage.list_folder(writer_dir).objects]
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())


@dataclass(frozen=True, slots=True)
class WriterIncarnation:
    """One start of writer `writer_id` on a table; newer incarnations fence older ones."""

    table_base_path: str
    writer_id: str
    incarnation: int
    claimed_at: float
    storage: Storage = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.storage is None:
            object.__setattr__(self, "storage", as_storage(self.table_base_path))

    @property
    def writer_dir(self) -> str:
        return f"{WRITERS_DIR}/{self.writer_id}"

    def newest(self) -> int:
        """The newest incarnation claimed so far (at least this one)."""
        if not self.storage.exists(f"{self.writer_dir}/{_incarnation_name(self.incarnation + 1)}"):
            return self.incarnation
        return max([self.incarnation, *_incarnations(self.storage, self.writer_dir)])

    def is_current(self) -> bool:
        return self.newest() == self.incarnation

    def check(self) -> None:
        """Raise FencedError if a newer incarnation of this writer id started."""
        newest = self.newest()
        if newest != self.incarnation:
            raise FencedError(
                f"writer {self.writer_id!r} incarnation {self.incarnation} is fenced: incarnation "
                f"{newest} started on {self.table_base_path}; this process must stop and never "
                "publish (two processes run with the same writer id?)"
            )


def claim_writer(
    table_base_path: Where, writer_id: str, *, clock: Clock = time.time
) -> WriterIncarnation:
    """Claim the next incarnation of `writer_id`: create `<n+1>.json` exclusively (retrying if
    another start won that number) and update the summary `<writer_id>.json`."""
    _check_writer_id(writer_id)
    storage = as_storage(table_base_path)
    writer_dir = f"{WRITERS_DIR}/{writer_id}"
    while True:
        existing = _incarnations(storage, writer_dir)
        n = (existing[-1] if existing else 0) + 1
        now = clock()
        payload = {"writer_id": writer_id, "incarnation": n, "claimed_at": now, "pid": os.getpid()}
        try:
            storage.create(f"{writer_dir}/{_incarnation_name(n)}", json.dumps(payload).encode())
        except ObjectExistsError:
            continue
        break  # the number is ours: a conditional create makes a name once
    inc = WriterIncarnation(storage.uri, writer_id, n, now, storage)
    summary = f"{WRITERS_DIR}/{writer_id}.json"
    try:
        previous = json.loads(storage.read(summary)).get("incarnation", 0)
    except (ObjectNotFoundError, ValueError, AttributeError):
        previous = 0
    if n > previous:  # informational; the numbered files are the authority
        storage.write(summary, json.dumps(payload).encode())
    log.info("writer %s claimed incarnation %d on %s", writer_id, n, table_base_path)
    return inc
