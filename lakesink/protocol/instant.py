"""Hudi instants: a unique time, an action and a state, rendered to and parsed from timeline
file names in both timeline layouts (1: table version 6, 2: table version 8)."""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from lakesink.errors import CorruptTableError

_INSTANT_TIME_RE = re.compile(r"^\d{17}$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True, order=True)
class InstantTime:
    """A millisecond UTC timestamp `yyyyMMddHHmmssSSS`, Hudi's instant time. Ordered as text."""

    value: str

    def __post_init__(self) -> None:
        if not _INSTANT_TIME_RE.match(self.value):
            raise CorruptTableError(
                f"{self.value!r} is not an instant time; expected 17 digits yyyyMMddHHmmssSSS"
            )

    @classmethod
    def from_epoch_ms(cls, epoch_ms: int) -> InstantTime:
        # integer arithmetic and explicit widths: strftime("%Y") does not pad years before 1000
        dt = _EPOCH + timedelta(milliseconds=epoch_ms)
        return cls(
            f"{dt.year:04d}{dt.month:02d}{dt.day:02d}{dt.hour:02d}{dt.minute:02d}"
            f"{dt.second:02d}{dt.microsecond // 1000:03d}"
        )

    def to_epoch_ms(self) -> int:
        return _epoch_ms(self.value)

    def __str__(self) -> str:
        return self.value


@functools.lru_cache(maxsize=65_536)
def _epoch_ms(value: str) -> int:
    """Epoch milliseconds of an instant time; cached because conflict checks and instant-time
    generation convert every instant of the timeline on each commit (strptime is slow)."""
    v = value
    try:
        dt = datetime(
            int(v[0:4]),
            int(v[4:6]),
            int(v[6:8]),
            int(v[8:10]),
            int(v[10:12]),
            int(v[12:14]),
            tzinfo=UTC,
        )
    except ValueError as e:  # 17 digits, but not a date (e.g. month 13)
        raise CorruptTableError(f"instant time {value!r} is not a valid date: {e}") from e
    return int(dt.timestamp()) * 1000 + int(v[14:])


class Action(enum.Enum):
    """What an instant does to the table."""

    COMMIT = "commit"
    DELTA_COMMIT = "deltacommit"
    """A merge-on-read write: log files appended to file slices (new base files too)."""
    REPLACE_COMMIT = "replacecommit"
    ROLLBACK = "rollback"
    CLEAN = "clean"
    COMPACTION = "compaction"
    """A pending merge-on-read compaction (requested, inflight): it completes as a COMMIT at the
    same instant time (`<t>.compaction.requested`, `<t>.compaction.inflight`, `<t>.commit`)."""

    @property
    def writes_data(self) -> bool:
        return self in (Action.COMMIT, Action.DELTA_COMMIT, Action.REPLACE_COMMIT)


class State(enum.IntEnum):
    """Lifecycle of an instant, ordered: requested < inflight < completed."""

    REQUESTED = 1
    INFLIGHT = 2
    COMPLETED = 3


class TimelineLayout(enum.IntEnum):
    """Timeline layout versions: 1 for table version 6, 2 for table version 8."""

    V1 = 1
    V2 = 2


@dataclass(frozen=True, slots=True, order=True)
class Instant:
    """One step on the timeline. `completion_time` is known only for completed instants
    in layout 2, where the file name carries it."""

    time: InstantTime
    action: Action
    state: State
    completion_time: InstantTime | None = None

    def with_state(self, state: State, completion_time: InstantTime | None = None) -> Instant:
        return Instant(self.time, self.action, state, completion_time)

    @property
    def is_completed(self) -> bool:
        return self.state is State.COMPLETED

    def file_name(self, layout: TimelineLayout) -> str:
        """The timeline file that records this instant in this state."""
        t, a = self.time.value, self.action.value
        if self.state is State.REQUESTED:
            return f"{t}.{a}.requested"
        if self.state is State.INFLIGHT:
            # Hudi names a commit's inflight file `<t>.inflight` in both layouts.
            return f"{t}.inflight" if self.action is Action.COMMIT else f"{t}.{a}.inflight"
        if layout is TimelineLayout.V2:
            if self.completion_time is None:
                raise CorruptTableError(
                    f"completed instant {t} in layout 2 needs a completion time"
                )
            return f"{t}_{self.completion_time.value}.{a}"
        return f"{t}.{a}"

    @classmethod
    def parse(cls, file_name: str) -> Instant:
        """Parse a timeline file name of either layout; CorruptTableError if it is not one."""
        head, _, rest = file_name.partition(".")
        completion: InstantTime | None = None
        if "_" in head:
            head, _, done = head.partition("_")
            completion = InstantTime(done)
        time = InstantTime(head) if _INSTANT_TIME_RE.match(head) else None
        if time is None:
            raise CorruptTableError(f"{file_name!r} is not a timeline file name")
        if rest == "inflight":
            return cls(time, Action.COMMIT, State.INFLIGHT)
        action_text, _, suffix = rest.partition(".")
        try:
            action = Action(action_text)
        except ValueError:
            valid = ", ".join(a.value for a in Action)
            raise CorruptTableError(
                f"{file_name!r} names action {action_text!r}; lakesink knows {valid}"
            ) from None
        states = {"requested": State.REQUESTED, "inflight": State.INFLIGHT, "": State.COMPLETED}
        if suffix not in states:
            raise CorruptTableError(f"{file_name!r} has unknown state suffix {suffix!r}")
        state = states[suffix]
        if state is not State.COMPLETED and completion is not None:
            raise CorruptTableError(
                f"{file_name!r}: only completed instants carry a completion time"
            )
        return cls(time, action, state, completion)

    def __str__(self) -> str:
        done = f" done {self.completion_time}" if self.completion_time else ""
        return f"{self.time}.{self.action.value} [{self.state.name.lower()}{done}]"
