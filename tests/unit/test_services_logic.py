"""Table-service decisions without I/O: what the cleaner deletes, which small files clustering
picks, how far archival may go."""

from __future__ import annotations

from lakesink.protocol.instant import Action, Instant, InstantTime, State
from lakesink.protocol.write_status import FileWrite
from lakesink.services.archival import ArchivePolicy, archivable_prefix
from lakesink.services.clean import RetainPolicy, earliest_retained, failed_files, plan_clean
from lakesink.services.clustering import ClusteringOptions, choose_slices
from lakesink.table.metadata import CommitMetadata
from lakesink.table.view import FileSlice


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


def test_archival_waits_until_clustering_rewrote_the_prefix() -> None:
    entries = [commit(i, f"f{i}") for i in range(1, 6)]
    entries.append(commit(6, "g", replaced=tuple(f"f{i}" for i in range(1, 6))))
    entries += [commit(i, f"f{i}") for i in range(7, 10)]
    policy = ArchivePolicy(min_instants=2, max_instants=3)
    gone = lambda _p: False  # noqa: E731
    # the boundary may sit at the clustering: everything before it is replaced by it
    assert archivable_prefix(entries, None, policy, gone) == 5
    # never past an inflight instant
    assert archivable_prefix(entries, t(3), policy, gone) == 0
    # archiving the replacecommit would un-hide replaced files still on storage (hudi-rs)
    entries.append(commit(10, "h", replaced=("g", "f7", "f8", "f9")))
    keep_one = ArchivePolicy(min_instants=1, max_instants=3)
    assert archivable_prefix(entries, None, keep_one, lambda _p: True) == 5
    assert archivable_prefix(entries, None, keep_one, gone) == 9
    # and always keep min_instants active
    assert archivable_prefix(entries, None, ArchivePolicy(2, 3), gone) == 5
