"""Size tiers for a streaming writer's clustering and rewrite (`engine.tiers`): the tier of a
size, which files a run takes, and a stream of runs through Hudi's real slice chooser against
the untiered rule on the same input: nothing lost, a byte rewritten about twice instead of once
per run."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakesink.engine.tiers import BOTTOM_TIER, size_tier, tiered_selection
from lakesink.formats.hudi.services.clustering import ClusteringOptions, choose_slices
from lakesink.formats.hudi.table.file_group import FileSlice
from lakesink.protocol.instant import InstantTime

MiB = 1024 * 1024
TARGET = 128 * MiB
SMALL = 96 * MiB


@pytest.mark.parametrize(
    ("size", "tier"),
    [
        (TARGET - 1, 0),
        (TARGET // 8, 0),  # a tier's smallest size is in it
        (TARGET // 8 - 1, 1),
        (TARGET // 64, 1),
        (TARGET // 64 - 1, 2),
        (TARGET // 8**4, 3),
        (TARGET // 8**4 - 1, BOTTOM_TIER),
        (1, BOTTOM_TIER),
        (0, BOTTOM_TIER),
    ],
)
def test_size_tier_bounds_are_powers_of_the_ratio_below_the_target(size: int, tier: int) -> None:
    assert size_tier(size, TARGET, 8) == tier


def test_ratio_zero_takes_every_file_once_there_are_min_files() -> None:
    assert tiered_selection([5, 7 * MiB], target=TARGET, ratio=0, min_files=2) == [0, 1]
    assert tiered_selection([5], target=TARGET, ratio=0, min_files=2) == []


def test_only_tiers_holding_ratio_files_and_min_files_are_taken() -> None:
    tier1 = [10 * MiB] * 4  # 4 of 4: due
    tier2 = [1 * MiB] * 3  # 3 of 4: waits
    bottom = [100, 200, 300, 400, 500]  # 5 of 4: due
    sizes = [*tier1, *tier2, *bottom]
    due = tiered_selection(sizes, target=TARGET, ratio=4, min_files=2)
    assert due == [0, 1, 2, 3, 7, 8, 9, 10, 11]
    # min.files above the ratio holds a tier back until it has that many
    assert tiered_selection(sizes, target=TARGET, ratio=4, min_files=5) == [7, 8, 9, 10, 11]


@pytest.mark.parametrize("ratio", [1, -2])
def test_a_ratio_of_one_or_below_zero_is_refused(ratio: int) -> None:
    with pytest.raises(ValueError, match="tier ratio"):
        tiered_selection([1, 2], target=TARGET, ratio=ratio, min_files=2)


def _stream(runs: list[list[int]], ratio: int) -> tuple[int, int, list[int]]:
    """Runs of new files (sizes) into one partition; after each run Hudi's chooser picks the
    small slices and a clustering writes their bytes again, rolled at the target. Returns the
    bytes ingested, the bytes rewritten and the files left."""
    opts = ClusteringOptions(
        small_file_bytes=SMALL, target_file_bytes=TARGET, min_files=2, tier_ratio=ratio
    )
    ids = itertools.count()
    clock = itertools.count(1)
    files: dict[str, FileSlice] = {}

    def add(size: int) -> None:
        fid = f"f{next(ids)}"
        t = InstantTime(f"{20260101000000000 + next(clock)}")
        files[fid] = FileSlice("p", fid, t, f"p/{fid}", size, 1)

    ingested = rewritten = 0
    for run in runs:
        for size in run:
            add(size)
            ingested += size
        chosen = choose_slices(list(files.values()), frozenset(), opts).get("p", ())
        taken = sum(s.file_size_bytes for s in chosen)
        assert (not chosen) or len(chosen) >= 2
        for s in chosen:
            del files[s.file_id]
        whole, rest = divmod(taken, TARGET)
        for size in [TARGET] * whole + ([rest] if rest else []):
            add(size)
        rewritten += taken
    return ingested, rewritten, sorted(s.file_size_bytes for s in files.values())


def test_a_steady_stream_rewrites_a_byte_about_twice_not_once_per_run() -> None:
    # the benchmark's shape (90,000 records/s, services every 10 commits of 2 tasks): 20 files
    # of ~600 KB a run, 12 MB a run
    runs = [[600 * 1024] * 20 for _ in range(200)]
    ingested, untiered, left_untiered = _stream(runs, ratio=0)
    _, tiered, left_tiered = _stream(runs, ratio=8)
    assert sum(left_untiered) == sum(left_tiered) == ingested  # nothing lost either way
    assert untiered / ingested > 4.0  # the growing file, read and written every run
    assert tiered / ingested < 2.2
    small = [s for s in left_tiered if s < SMALL]
    assert len(small) < 8 * (BOTTOM_TIER + 1)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(min_value=1, max_value=40 * MiB), min_size=0, max_size=25),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from([2, 4, 8]),
)
def test_tiers_lose_nothing_and_leave_fewer_than_ratio_files_a_tier(
    runs: list[list[int]], ratio: int
) -> None:
    ingested, _, left = _stream(runs, ratio)
    assert sum(left) == ingested
    # after a run, a tier holds fewer than `ratio` files, or got them from that run's rewrite
    # (at most one rolled remainder per tier taken) and the next run takes it
    per_tier = [0] * (BOTTOM_TIER + 1)
    for size in left:
        if size < SMALL:
            per_tier[size_tier(size, TARGET, ratio)] += 1
    assert all(n <= ratio for n in per_tier), per_tier
