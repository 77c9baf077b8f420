"""Timeline file names render and parse back identically in both layouts."""

from __future__ import annotations

import pytest

from lakesink.errors import CorruptTableError
from lakesink.protocol.instant import Action, Instant, InstantTime, State, TimelineLayout

T = InstantTime("20240102030405678")
C = InstantTime("20240102030406000")


@pytest.mark.parametrize(
    ("instant", "layout", "name"),
    [
        (Instant(T, Action.COMMIT, State.REQUESTED), TimelineLayout.V1, f"{T}.commit.requested"),
        (Instant(T, Action.COMMIT, State.INFLIGHT), TimelineLayout.V1, f"{T}.inflight"),
        (Instant(T, Action.COMMIT, State.COMPLETED), TimelineLayout.V1, f"{T}.commit"),
        (
            Instant(T, Action.REPLACE_COMMIT, State.INFLIGHT),
            TimelineLayout.V1,
            f"{T}.replacecommit.inflight",
        ),
        (
            Instant(T, Action.REPLACE_COMMIT, State.COMPLETED),
            TimelineLayout.V1,
            f"{T}.replacecommit",
        ),
        (Instant(T, Action.ROLLBACK, State.COMPLETED), TimelineLayout.V1, f"{T}.rollback"),
        (Instant(T, Action.COMMIT, State.REQUESTED), TimelineLayout.V2, f"{T}.commit.requested"),
        (Instant(T, Action.COMMIT, State.INFLIGHT), TimelineLayout.V2, f"{T}.inflight"),
        (Instant(T, Action.COMMIT, State.COMPLETED, C), TimelineLayout.V2, f"{T}_{C}.commit"),
        (
            Instant(T, Action.REPLACE_COMMIT, State.COMPLETED, C),
            TimelineLayout.V2,
            f"{T}_{C}.replacecommit",
        ),
        (Instant(T, Action.ROLLBACK, State.COMPLETED, C), TimelineLayout.V2, f"{T}_{C}.rollback"),
        (
            Instant(T, Action.ROLLBACK, State.REQUESTED),
            TimelineLayout.V2,
            f"{T}.rollback.requested",
        ),
    ],
)
def test_instant_file_name_round_trips(instant: Instant, layout: TimelineLayout, name: str) -> None:
    assert instant.file_name(layout) == name
    assert Instant.parse(name) == instant


def test_completed_instant_in_layout_two_needs_a_completion_time() -> None:
    with pytest.raises(CorruptTableError, match="completion time"):
        Instant(T, Action.COMMIT, State.COMPLETED).file_name(TimelineLayout.V2)


@pytest.mark.parametrize(
    "name",
    [
        "hoodie.properties",
        "2024.commit",
        f"{T}.savepoint",
        f"{T}.commit.weird",
        f"{T}_{C}.commit.requested",
    ],
)
def test_parse_rejects_names_that_are_not_instants(name: str) -> None:
    with pytest.raises(CorruptTableError):
        Instant.parse(name)


def test_instant_time_epoch_round_trip() -> None:
    assert InstantTime.from_epoch_ms(T.to_epoch_ms()) == T
