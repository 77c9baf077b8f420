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

import contextlib
import json
import logging
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lakesink.concurrency.lock import Clock
from lakesink.errors import ConfigError, FencedError, HeartbeatExpiredError
from lakesink.protocol.instant import InstantTime

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


def heartbeat_path(
    table_base_path: str | os.PathLike[str], instant_time: InstantTime | str
) -> Path:
    return Path(table_base_path) / HEARTBEAT_DIR / _instant_str(instant_time)


def _write_replace(table_base_path: Path, target: Path, payload: dict[str, Any]) -> None:
    """Write JSON to `target` all at once; the temp file lives under `.hoodie/.lakesink/tmp`
    so that no reader (Hudi lists the heartbeat folder) ever sees a half-written name."""
    tmp_dir = table_base_path / TMP_DIR
    tmp_dir.mkdir(parents=True, exist_ok=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f"{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "x") as f:
            json.dump(payload, f)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def last_heartbeat(
    table_base_path: str | os.PathLike[str], instant_time: InstantTime | str
) -> float | None:
    """When the instant's heartbeat last beat (seconds since the epoch), None if it has none."""
    try:
        return heartbeat_path(table_base_path, instant_time).stat().st_mtime
    except FileNotFoundError:
        return None


def heartbeat_expired(
    table_base_path: str | os.PathLike[str],
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


def delete_heartbeat(
    table_base_path: str | os.PathLike[str], instant_time: InstantTime | str
) -> None:
    """Remove an instant's heartbeat (after it completed or was rolled back)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(heartbeat_path(table_base_path, instant_time))


class Heartbeat:
    """The heartbeat of one inflight instant of this writer.

    `start()` beats once (synchronously) and then every `interval_s` on a daemon thread.
    `check()` raises once no beat succeeded for `tolerance_s - safety_margin_s`, or the file was
    removed (a lazy rollback got there first): the writer must then abort the instant.
    """

    def __init__(
        self,
        table_base_path: str | os.PathLike[str],
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
        self.table_base_path = Path(table_base_path)
        self.instant_time = _instant_str(instant_time)
        self.writer_id = writer_id
        self.interval_s = interval_s
        self.tolerance_s = tolerance_s
        self.safety_margin_s = margin
        self.clock = clock
        self.path = heartbeat_path(table_base_path, self.instant_time)
        self.last_success: float | None = None
        self.last_error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """Refresh the heartbeat once; its mtime is set to the beat time."""
        now = self.clock()
        _write_replace(
            self.table_base_path,
            self.path,
            {"instant_time": self.instant_time, "writer_id": self.writer_id, "at": now},
        )
        os.utime(self.path, (now, now))
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
            except OSError as e:
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
            delete_heartbeat(self.table_base_path, self.instant_time)

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
        if not self.path.exists():
            raise HeartbeatExpiredError(
                f"heartbeat file of instant {self.instant_time} (writer {self.writer_id!r}) is "
                f"gone from {self.path.parent}; the instant was probably rolled back: abort it"
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


def _incarnations(writer_dir: Path) -> list[int]:
    try:
        names = os.listdir(writer_dir)
    except FileNotFoundError:
        return []
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())


@dataclass(frozen=True, slots=True)
class WriterIncarnation:
    """One start of writer `writer_id` on a table; newer incarnations fence older ones."""

    table_base_path: str
    writer_id: str
    incarnation: int
    claimed_at: float

    @property
    def writer_dir(self) -> Path:
        return Path(self.table_base_path) / WRITERS_DIR / self.writer_id

    def newest(self) -> int:
        """The newest incarnation claimed so far (at least this one)."""
        if not (self.writer_dir / _incarnation_name(self.incarnation + 1)).exists():
            return self.incarnation
        return max([self.incarnation, *_incarnations(self.writer_dir)])

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
    table_base_path: str | os.PathLike[str], writer_id: str, *, clock: Clock = time.time
) -> WriterIncarnation:
    """Claim the next incarnation of `writer_id`: create `<n+1>.json` exclusively (retrying if
    another start won that number) and update the summary `<writer_id>.json`."""
    _check_writer_id(writer_id)
    base = Path(table_base_path)
    writer_dir = base / WRITERS_DIR / writer_id
    writer_dir.mkdir(parents=True, exist_ok=True)
    tmp_dir = base / TMP_DIR
    tmp_dir.mkdir(parents=True, exist_ok=True)
    while True:
        existing = _incarnations(writer_dir)
        n = (existing[-1] if existing else 0) + 1
        now = clock()
        payload = {"writer_id": writer_id, "incarnation": n, "claimed_at": now, "pid": os.getpid()}
        tmp = tmp_dir / f"{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "x") as f:
                json.dump(payload, f)
            try:
                os.link(tmp, writer_dir / _incarnation_name(n))
            except FileExistsError:
                continue
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        break  # the number is ours: link() creates a name once (a newer start fences us)
    inc = WriterIncarnation(os.fspath(table_base_path), writer_id, n, now)
    summary = base / WRITERS_DIR / f"{writer_id}.json"
    try:
        previous = json.loads(summary.read_text()).get("incarnation", 0)
    except (FileNotFoundError, ValueError, AttributeError):
        previous = 0
    if n > previous:  # informational; the numbered files are the authority
        _write_replace(base, summary, payload)
    log.info("writer %s claimed incarnation %d on %s", writer_id, n, table_base_path)
    return inc
