"""lakesink's Iceberg snapshot summary: its codec, the valid-through timestamp, the lineage walk
back past other writers' snapshots, and the append requirement's verdicts. Pure values."""

from __future__ import annotations

import re

import pytest

from lakesink.errors import CorruptTableError, OffsetError
from lakesink.formats.iceberg.errors import SummaryLayoutError
from lakesink.formats.iceberg.snapshots import (
    KEY_INCARNATION,
    KEY_LAYOUT,
    KEY_OFFSETS,
    KEY_VTTS,
    AppendRequirement,
    AppendVerdict,
    SnapshotInfo,
    WriterCommit,
    find_writer_commit,
    incarnation_key,
    last_commit_by_writer,
    parse_incarnation,
    valid_through,
)
from lakesink.protocol.offsets import OffsetRange, TopicPartition, WriterOffsets

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def commit(writer: str, cid: str, **offsets: int) -> WriterCommit:
    return WriterCommit(
        writer, cid, WriterOffsets({TopicPartition.parse(k): v for k, v in offsets.items()})
    )


def test_summary_round_trips_writer_commit_id_offsets_and_vtts() -> None:
    c = WriterCommit("w1", "c-1", WriterOffsets({A0: 10, A1: 7, B0: 0}), vtts_ms=1_700_000)
    summary = c.to_summary()
    assert all(isinstance(v, str) for v in summary.values())
    assert summary[KEY_LAYOUT] == "1" and summary[KEY_VTTS] == "1700000"
    assert WriterCommit.from_summary({**summary, "added-records": "5"}) == c


def test_summary_round_trips_the_incarnation_and_omits_it_when_none_was_claimed() -> None:
    c = WriterCommit("w1", "c-1", WriterOffsets({A0: 3}), incarnation=4)
    summary = c.to_summary()
    assert summary[KEY_INCARNATION] == "4"
    assert WriterCommit.from_summary(summary) == c
    plain = commit("w1", "c-2", **{"a:0": 3}).to_summary()
    assert KEY_INCARNATION not in plain
    decoded = WriterCommit.from_summary(plain)
    assert decoded is not None and decoded.incarnation is None
    with pytest.raises(SummaryLayoutError, match=re.escape(KEY_INCARNATION)):
        WriterCommit.from_summary({**summary, KEY_INCARNATION: "four"})


def test_incarnation_property_is_per_writer_id_and_must_be_a_positive_whole_number() -> None:
    props = {incarnation_key("w1"): "3", incarnation_key("w2"): "1"}
    assert incarnation_key("w1") == "lakesink.writer.w1.incarnation"
    assert parse_incarnation(props, "w1") == 3 and parse_incarnation(props, "w2") == 1
    assert parse_incarnation(props, "w3") is None
    for bad in ("0", "-2", "x", ""):
        with pytest.raises(SummaryLayoutError, match=re.escape("lakesink.writer.w1.incarnation")):
            parse_incarnation({incarnation_key("w1"): bad}, "w1")


def test_summary_without_vtts_has_no_vtts_key_and_decodes_to_none() -> None:
    c = WriterCommit("w1", "c-1", WriterOffsets({A0: 3}))
    assert KEY_VTTS not in c.to_summary()
    decoded = WriterCommit.from_summary(c.to_summary())
    assert decoded is not None and decoded.vtts_ms is None


def test_summary_of_another_writer_kind_is_not_read_as_lakesinks() -> None:
    kafka_connect = {
        "kafka.connect.commit-id": "x",
        "kafka.connect.vtts": "5",
        "operation": "append",
    }
    assert WriterCommit.from_summary(kafka_connect) is None


def test_summary_of_another_layout_is_a_clear_error_naming_the_snapshot() -> None:
    summary = {**commit("w", "c", **{"a:0": 1}).to_summary(), KEY_LAYOUT: "2"}
    with pytest.raises(SummaryLayoutError, match=r"snapshot 42 .*layout '2'.*reads layout '1'"):
        WriterCommit.from_summary(summary, 42)
    assert issubclass(SummaryLayoutError, CorruptTableError)


@pytest.mark.parametrize(
    "offsets", ['{"a:0": "ten"}', "[1, 2]", '{"a-0": 1}', "{not json", '{"a:0": true}']
)
def test_summary_with_unreadable_offsets_is_a_layout_error(offsets: str) -> None:
    summary = {**commit("w", "c", **{"a:0": 1}).to_summary(), KEY_OFFSETS: offsets}
    with pytest.raises(SummaryLayoutError, match="cannot be read"):
        WriterCommit.from_summary(summary, 7)


def test_summary_missing_a_key_names_it() -> None:
    summary = commit("w", "c", **{"a:0": 1}).to_summary()
    del summary["lakesink.commit-id"]
    with pytest.raises(SummaryLayoutError, match=r"lacks lakesink\.commit-id"):
        WriterCommit.from_summary(summary)


def test_vtts_is_the_minimum_of_per_partition_maxima() -> None:
    assert valid_through({A0: 500, A1: 300, B0: 900}, [A0, A1, B0]) == 300


def test_vtts_is_unset_when_a_partition_had_no_records() -> None:
    assert valid_through({A0: 500, A1: None}, [A0, A1]) is None
    assert valid_through({A0: 500}, [A0, B0]) is None


def snap(sid: int, parent: int | None, c: WriterCommit | None) -> SnapshotInfo:
    return SnapshotInfo(sid, parent, sid, sid * 1000, c.to_summary() if c else {"x": "y"})


def test_lineage_walk_skips_other_writers_and_foreign_snapshots() -> None:
    snaps = {
        1: snap(1, None, commit("w1", "c1", **{"a:0": 5})),
        2: snap(2, 1, commit("w2", "c2", **{"b:0": 9})),
        3: snap(3, 2, None),  # a snapshot some other engine wrote
        4: snap(4, 3, commit("w2", "c4", **{"b:0": 12})),
    }
    found = find_writer_commit(snaps, 4, "w1")
    assert found is not None and found.commit_id == "c1" and found.offsets.get(A0) == 5
    found2 = find_writer_commit(snaps, 4, "w2")
    assert found2 is not None and found2.commit_id == "c4"
    assert find_writer_commit(snaps, 4, "w3") is None
    assert last_commit_by_writer(snaps, 4) == {"w2": 4, "w1": 1}


def test_lineage_walk_ignores_snapshots_off_the_current_branch() -> None:
    # 3 was rolled back: the current snapshot 4 descends from 2
    snaps = {
        1: snap(1, None, commit("w1", "c1", **{"a:0": 5})),
        2: snap(2, 1, commit("w2", "c2", **{"b:0": 9})),
        3: snap(3, 2, commit("w1", "c3", **{"a:0": 8})),
        4: snap(4, 2, commit("w2", "c4", **{"b:0": 12})),
    }
    found = find_writer_commit(snaps, 4, "w1")
    assert found is not None and found.commit_id == "c1"


def test_lineage_walk_continues_past_an_expiry_gap_to_the_kept_commit() -> None:
    # snapshots 2 and 3 expired; 1 was kept as w1's newest commit; the parent of 4 is
    # either dangling or cleared by the expiry
    snaps = {
        1: snap(1, None, commit("w1", "c1", **{"a:0": 5})),
        4: snap(4, None, commit("w2", "c4", **{"b:0": 12})),
    }
    found = find_writer_commit(snaps, 4, "w1")
    assert found is not None and found.offsets.get(A0) == 5
    snaps[4] = snap(4, 3, commit("w2", "c4", **{"b:0": 12}))
    found = find_writer_commit(snaps, 4, "w1")
    assert found is not None and found.offsets.get(A0) == 5


def test_empty_table_has_no_commit() -> None:
    assert find_writer_commit({}, None, "w1") is None


def req(cid: str, *ranges: tuple[TopicPartition, int, int]) -> AppendRequirement:
    return AppendRequirement("w1", cid, tuple(OffsetRange(tp, s, e) for tp, s, e in ranges))


def test_requirement_proceeds_on_a_fresh_writer_and_on_matching_start_offsets() -> None:
    assert req("c2", (A0, 0, 5)).evaluate(None) is AppendVerdict.PROCEED
    last = commit("w1", "c1", **{"a:0": 5, "a:1": 3})
    assert req("c2", (A0, 5, 9), (A1, 3, 3)).evaluate(last) is AppendVerdict.PROCEED
    # a partition the writer never committed may start anywhere
    assert req("c2", (A0, 5, 9), (B0, 40, 41)).evaluate(last) is AppendVerdict.PROCEED
    assert req("c2", (A0, 5, 9)).end_offsets(last.offsets).get(A0) == 9


def test_requirement_recognises_its_own_landed_commit() -> None:
    last = commit("w1", "c2", **{"a:0": 9})
    assert req("c2", (A0, 5, 9)).evaluate(last) is AppendVerdict.LANDED


def test_requirement_recognises_a_replay_of_committed_ranges() -> None:
    last = commit("w1", "c1", **{"a:0": 9, "a:1": 4})
    assert req("c-new", (A0, 5, 9), (A1, 2, 4)).evaluate(last) is AppendVerdict.REPLAYED


def test_requirement_refuses_offsets_that_moved_elsewhere_naming_expected_and_found() -> None:
    last = commit("w1", "c1", **{"a:0": 12})
    with pytest.raises(OffsetError, match=r"a:0 expected 5 found 12"):
        req("c2", (A0, 5, 9)).evaluate(last)
    with pytest.raises(OffsetError, match=r"a:0 expected 20 found 12"):
        req("c2", (A0, 20, 25)).evaluate(last)
