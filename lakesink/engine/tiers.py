"""Which small files a streaming writer's clustering (Hudi) or rewrite (Iceberg) takes: files of
similar size, a tier at a time, so that a byte is rewritten a few times, not once per run.

Without tiers every run takes every small file of a partition, the file the previous run wrote
included: under a steady stream that file grows by one run's data each run and is read and
written again until it passes the small-file threshold, about (threshold / run) / 2 times its
bytes (4.5 at 90,000 records/s, benchmarks/README.md, session 12). With tiers a file only meets
files of its own size class: tier k holds the files of `target / ratio**(k+1)` up to
`target / ratio**k` bytes, files under `target / ratio**BOTTOM_TIER` share the bottom tier, and
a tier is taken once it holds `ratio` files (and `min_files`). A rewrite of `ratio` files of one
tier writes a file of the tier above (unless the bin-packing to the target cuts it), so a byte
above the bottom tier climbs a tier per rewrite, and a partition keeps about `ratio` small files
per tier at most between runs (`lakesink table cluster` / `iceberg rewrite-data-files` take
them all). Bytes in the bottom tier may be rewritten more often, but they are few.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["BOTTOM_TIER", "size_tier", "tiered_selection"]

BOTTOM_TIER = 4
"""Files under target / ratio**4 (32 KiB of a 128 MiB target at ratio 8) share one tier: they
are cheap to rewrite together whatever their sizes."""


def size_tier(size: int, target: int, ratio: int) -> int:
    """The tier of a file of `size` bytes: 0 just under the target, BOTTOM_TIER the smallest."""
    if size <= 0:
        return BOTTOM_TIER
    tier = 0
    bound = target / ratio  # the smallest size of the current tier
    while tier < BOTTOM_TIER and size < bound:
        tier += 1
        bound /= ratio
    return tier


def tiered_selection(sizes: Sequence[int], *, target: int, ratio: int, min_files: int) -> list[int]:
    """The indexes of one partition's small files to rewrite now, in their given order: those
    of every tier holding at least max(ratio, min_files) files; ratio 0 (no tiers): all of them
    once there are min_files."""
    if ratio == 0:
        return list(range(len(sizes))) if len(sizes) >= min_files else []
    if ratio < 2 or target <= 0:
        raise ValueError(f"tier ratio must be 0 or >= 2 and target > 0, got {ratio}, {target}")
    tiers = [size_tier(s, target, ratio) for s in sizes]
    counts = [tiers.count(k) for k in range(BOTTOM_TIER + 1)]
    due = {k for k, n in enumerate(counts) if n >= max(ratio, min_files)}
    return [i for i, k in enumerate(tiers) if k in due]
