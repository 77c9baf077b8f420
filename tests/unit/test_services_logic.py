"""Table-service decisions without I/O: what the cleaner deletes, which small files clustering
picks, how far archival may go."""

from __future__ import annotations

from lakesink.formats.hudi.services.archival import ArchivePolicy, archivable_prefix
from lakesink.formats.hudi.services.clean import (
    RetainPolicy,
    earliest_retained,
    failed_files,
    plan_clean,
)
from lakesink.formats.hudi.services.clustering import ClusteringOptions, choose_slices
from lakesink.formats.hudi.table.file_group import FileSlice
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.protocol.instant import Action, Instant, InstantTime, State
from lakesink.protocol.write_status import FileWrite


def t(n: int) -> InstantTime:
    return InstantTime(f"20260101000000{n:03d}")


def name(fid: str, n: int) -> str:
    return f"p/{fid}_0-0-0_{t(n).value}.parquet"


def commit(n: int, *fids: str, replaced: tuple[str, ...] = ()) -> tuple[Instant, CommitMetadata]:
    action = Action.REPLACE_COMMIT if replaced else Action.COMMIT
    writes = tuple(FileWrite("p", f, name(f, n), 10, 100) for f in fids)
    md = CommitMetadata("INSERT", writes, {"p": replaced} if replaced else {})
    return Instant(t(n), action, State.COMPLETED, t(n)), md


def test_clean_keeps_views_of_retained_commits_and_deletes_replaced_groups() -> None:
    commits = [commit(1, "a"), commit(2, "b"), commit(3, "c", replaced=("a", "b")), commit(4, "d")]
    instants = [i for i, _ in commits]
    # retain 2: views as of 3 and 4 need c, d only; a and b were replaced at 3
    plan = plan_clean(commits, instants, [], RetainPolicy(commits=2), 0)
    assert plan.earliest_retained == t(3)
    assert plan.replaced == (name("a", 1), name("b", 2))
    # retain 3: the view as of 2 still reads a and b
    assert plan_clean(commits, instants, [], RetainPolicy(commits=3), 0).is_empty


def test_clean_retain_hours_keeps_more_when_recent() -> None:
    commits = [commit(1, "a"), commit(2, "b")]
    now = t(2).to_epoch_ms() + 10
    assert earliest_retained(commits, RetainPolicy(commits=1, hours=1.0), now) == t(1)
    assert earliest_retained(commits, RetainPolicy(commits=1), now) == t(2)


def test_failed_files_spares_pending_and_unknown_older_instants() -> None:
    done, _ = commit(2, "a")
    pending = Instant(t(4), Action.COMMIT, State.INFLIGHT)
    later = Instant(t(9), Action.CLEAN, State.COMPLETED, t(9))
    storage = [
        name("a", 2),  # referenced by a completed commit: kept
        name("x", 2),  # of a completed commit that does not list it: failed
        name("y", 3),  # of no instant, inside the timeline (rolled back): failed
        name("z", 4),  # of a pending instant: kept
        name("w", 1),  # older than the active timeline (maybe archived): kept
    ]
    out = failed_files(storage, [done, pending, later], {name("a", 2)})
    assert out == [name("x", 2), name("y", 3)]


def test_clustering_picks_small_files_outside_pending_plans() -> None:
    def s(fid: str, size: int, part: str = "p") -> FileSlice:
        return FileSlice(part, fid, t(1), f"{part}/{fid}", size, 1)

    latest = [s("a", 10), s("b", 10), s("c", 500), s("d", 10), s("e", 10, "q")]
    opts = ClusteringOptions(small_file_bytes=100, min_files=2)
    chosen = choose_slices(latest, frozenset({("p", "d")}), opts)
    assert {p: [x.file_id for x in v] for p, v in chosen.items()} == {"p": ["a", "b"]}


def test_clustering_takes_the_oldest_small_files_up_to_its_bytes_per_partition() -> None:
    def s(fid: str, size: int, n: int, part: str = "p") -> FileSlice:
        return FileSlice(part, fid, t(n), f"{part}/{fid}", size, 1)

    latest = [s("new", 40, 5), s("old", 40, 1), s("mid", 40, 3), s("q1", 90, 1, "q")]
    latest += [s("q2", 90, 2, "q"), s("r1", 30, 1, "r"), s("r2", 30, 2, "r")]

    def chosen(max_bytes: int) -> dict[str, list[str]]:
        opts = ClusteringOptions(small_file_bytes=100, min_files=2, max_bytes=max_bytes)
        return {
            p: [x.file_id for x in v] for p, v in choose_slices(latest, frozenset(), opts).items()
        }

    # p: the two oldest fit in 100 bytes, the newest waits; q: one file alone is not worth a
    # rewrite; r: both fit
    assert chosen(100) == {"p": ["old", "mid"], "r": ["r1", "r2"]}
    assert chosen(1000) == {"p": ["old", "mid", "new"], "q": ["q1", "q2"], "r": ["r1", "r2"]}
    # a first file over the cap is still taken (it cannot be split), and nothing after it
    assert chosen(10) == {}


def storage_of(entries: list[tuple[Instant, CommitMetadata]]) -> dict[str, InstantTime]:
    return {w.path: i.time for i, md in entries for w in md.writes}


def test_archival_of_an_append_only_stream_keeps_min_instants_and_every_file_live() -> None:
    entries = [commit(i, f"f{i}") for i in range(1, 10)]
    choice = archivable_prefix(entries, (), (), storage_of(entries), ArchivePolicy(2, 3))
    assert choice.count == 7 and not choice.held_back_by
    assert sorted(s.file_id for s in choice.live) == [f"f{i}" for i in range(1, 8)]
    # the newest data instant stays active even when only cleans follow it (hudi-rs reads as of it)
    cleans = [(Instant(t(i), Action.CLEAN, State.COMPLETED, t(i)), None) for i in range(10, 14)]
    assert (
        archivable_prefix(entries + cleans, (), (), storage_of(entries), ArchivePolicy(2, 3)).count
        == 8
    )
    # at most max_instants active: nothing to do
    assert archivable_prefix(entries, (), (), {}, ArchivePolicy(2, 9)).count == 0


def test_archival_stops_at_pending_instants_and_what_completed_after_they_began() -> None:
    entries = [commit(i, f"f{i}") for i in range(1, 10)]
    storage = storage_of(entries)
    pending = Instant(t(4), Action.COMMIT, State.INFLIGHT)
    choice = archivable_prefix(entries, (), (pending,), storage, ArchivePolicy(2, 3))
    assert choice.count == 3 and "pending" in choice.held_back_by
    # commit 3 completed after the pending instant 4 began (its conflict check needs it)
    late = Instant(t(10), Action.COMMIT, State.INFLIGHT)
    after = lambda done, _p: done.time == t(3)  # noqa: E731
    assert archivable_prefix(entries, (), (late,), storage, ArchivePolicy(2, 3), after).count == 2


def test_archival_keeps_completion_order_between_archived_and_active() -> None:
    entries = [commit(i, f"f{i}") for i in range(1, 10)]
    # instant 5 completed last of all (a slow writer): archiving it and not 6 would make an
    # incremental reader that stopped at 6's completion miss it; archiving 6 without 5 as well
    slow, md = entries[4]
    entries[4] = (Instant(slow.time, slow.action, State.COMPLETED, t(50)), md)
    choice = archivable_prefix(entries, (), (), storage_of(entries), ArchivePolicy(2, 3))
    assert choice.count == 4 and "completion order" in choice.held_back_by


def test_archival_waits_for_files_hudi_rs_would_read_as_committed() -> None:
    entries = [commit(1, "a"), commit(2, "b"), commit(4, "c")]
    entries.append(commit(5, "g", replaced=("a", "b")))
    entries += [commit(i, f"f{i}") for i in range(6, 10)]
    storage = storage_of(entries)
    policy = ArchivePolicy(2, 3)
    # a failed write of instant 3 left a file: the first active instant must not be after it
    stray = {**storage, name("x", 3): t(3)}
    choice = archivable_prefix(entries, (), (), stray, policy)
    assert choice.count == 1 and name("x", 3) in choice.held_back_by
    # the replacecommit 5 hides a and b only while it is active: archived, they must be gone
    choice = archivable_prefix(entries, (), (), storage, policy)
    assert choice.count == 3  # up to 4; 5 stays active
    cleaned = {p: tt for p, tt in storage.items() if p not in (name("a", 1), name("b", 2))}
    choice = archivable_prefix(entries, (), (), cleaned, policy)
    assert choice.count == 6
    assert sorted(s.file_id for s in choice.live) == ["c", "f6", "f7", "g"]


def test_archival_starts_from_the_previous_archived_view() -> None:
    base = (FileSlice("p", "old", t(1), name("old", 1), 10, 100),)
    entries = [commit(5, "g", replaced=("old",))] + [commit(i, f"f{i}") for i in range(6, 10)]
    storage = {**storage_of(entries), name("old", 1): t(1)}
    # "old" (archived before) is replaced by 5 but still on storage: 5 stays active
    assert archivable_prefix(entries, base, (), storage, ArchivePolicy(1, 2)).count == 0
    del storage[name("old", 1)]
    choice = archivable_prefix(entries, base, (), storage, ArchivePolicy(1, 2))
    assert choice.count == 4
    assert sorted(s.file_id for s in choice.live) == ["f6", "f7", "f8", "g"]
