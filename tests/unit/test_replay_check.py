"""The batch a restart replays, checked against the log ends before Spark runs it: nothing to
do for a finished batch or one inside the log; one DataLossError naming both ends; with
kafka.fail.on.data.loss=false the offset log cut at the log end and the loss kept for the
commit; never a cut below offsets the batch starts after (the table's offsets never go back).
A dropped Pending batch (commit.mode=async) rewound so that Spark runs it again, only when the
offset log holds it with its ranges."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lakesink.errors import DataLossError
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.spark.replay_check import (
    LOST_FOLDER,
    check_replay_against_log_end,
    lost_spans,
    rewind_to,
    unfinished_batch,
)

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


def _checkpoint(tmp_path: Path, ranges: dict[str, list[int]], *, committed: bool) -> Path:
    cp = tmp_path / "cp"
    (cp / "offsets").mkdir(parents=True)
    (cp / "commits").mkdir()
    meta = '{"batchWatermarkMs":0}'
    (cp / "offsets" / "0").write_text(f'v1\n{meta}\n{{"v":1,"ranges":{{"t:0":[0,0]}}}}\n')
    (cp / "commits" / "0").write_text("v1\n{}\n")
    (cp / "offsets" / "1").write_text(f"v1\n{meta}\n{json.dumps({'v': 1, 'ranges': ranges})}\n")
    (cp / "offsets" / ".1.crc").write_bytes(b"crc")
    if committed:
        (cp / "commits" / "1").write_text("v1\n{}\n")
    return cp


def _marks(high: dict[TopicPartition, int]):  # type: ignore[no-untyped-def]
    def watermarks(parts: list[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
        return {tp: (0, high[tp]) for tp in parts}

    return watermarks


def test_replay_check_passes_a_finished_batch_and_one_inside_the_log(tmp_path: Path) -> None:
    done = _checkpoint(tmp_path / "a", {"t:0": [0, 100]}, committed=True)
    assert unfinished_batch(done) is None
    assert check_replay_against_log_end(done, _marks({A: 10}), fail_on_data_loss=True) == []
    inside = _checkpoint(tmp_path / "b", {"t:0": [0, 100], "t:1": [5, 5]}, committed=False)
    assert unfinished_batch(inside) == 1
    marks = _marks({A: 100, B: 0})
    assert check_replay_against_log_end(inside, marks, fail_on_data_loss=True) == []
    assert unfinished_batch(tmp_path / "none") is None


def test_replay_beyond_the_log_end_fails_naming_both_ends_and_the_key(tmp_path: Path) -> None:
    cp = _checkpoint(tmp_path, {"t:0": [100, 304], "t:1": [0, 50]}, committed=False)
    before = (cp / "offsets" / "1").read_text()
    with pytest.raises(DataLossError) as e:
        check_replay_against_log_end(cp, _marks({A: 300, B: 50}), fail_on_data_loss=True)
    assert "t:0 was planned to end at 304 but the log ends at 300" in str(e.value)
    assert "kafka.fail.on.data.loss=false" in str(e.value) and "t:1" not in str(e.value)
    assert (cp / "offsets" / "1").read_text() == before and lost_spans(cp, 1) == ()


def test_replay_beyond_the_log_end_is_cut_there_and_the_loss_kept_without_fail(
    tmp_path: Path,
) -> None:
    cp = _checkpoint(tmp_path, {"t:0": [100, 304], "t:1": [0, 50]}, committed=False)
    lost = check_replay_against_log_end(cp, _marks({A: 300, B: 60}), fail_on_data_loss=False)
    assert lost == [OffsetRange(A, 300, 304)]
    lines = (cp / "offsets" / "1").read_text().splitlines()
    assert lines[:2] == ["v1", '{"batchWatermarkMs":0}']
    assert json.loads(lines[2]) == {"v": 1, "ranges": {"t:0": [100, 300], "t:1": [0, 50]}}
    assert not (cp / "offsets" / ".1.crc").exists()  # Spark reads the new text unchecked
    assert lost_spans(cp, 1) == (OffsetRange(A, 300, 304),) and lost_spans(cp, 2) == ()
    # a second start finds the batch inside the log: nothing more to cut
    again = check_replay_against_log_end(cp, _marks({A: 300, B: 60}), fail_on_data_loss=False)
    assert again == [] and lost_spans(cp, 1) == (OffsetRange(A, 300, 304),)


def test_a_log_end_below_the_batchs_start_is_refused_even_without_fail(tmp_path: Path) -> None:
    cp = _checkpoint(tmp_path, {"t:0": [100, 200]}, committed=False)
    with pytest.raises(DataLossError, match=r"new writer\.id"):
        check_replay_against_log_end(cp, _marks({A: 90}), fail_on_data_loss=False)


def test_a_rewind_makes_the_batch_the_last_unrecorded_one_only_when_its_ranges_match(
    tmp_path: Path,
) -> None:
    cp = _checkpoint(tmp_path, {"t:0": [0, 100], "t:1": [5, 5]}, committed=True)
    meta = '{"batchWatermarkMs":0}'
    later = {"v": 1, "ranges": {"t:0": [100, 130]}}
    (cp / "offsets" / "2").write_text(f"v1\n{meta}\n{json.dumps(later)}\n")
    (cp / "offsets" / ".2.crc").write_bytes(b"crc")
    (cp / "commits" / "2").write_text("v1\n{}\n")
    (cp / "offsets" / "3").write_text(f"v1\n{meta}\n{json.dumps(later)}\n")
    (cp / LOST_FOLDER).mkdir()
    for n in (1, 3):
        (cp / LOST_FOLDER / f"{n}.json").write_text("[]")
    files = sorted(p.relative_to(cp) for p in cp.rglob("*"))
    # another batch's ranges, or a batch the log does not hold: nothing changes
    assert not rewind_to(cp, 1, [OffsetRange(A, 0, 90)])
    assert not rewind_to(cp, 7, [OffsetRange(A, 0, 100)])
    assert sorted(p.relative_to(cp) for p in cp.rglob("*")) == files
    # the batch's ranges (an empty one is not in the commit's ranges): batch 1 runs again
    assert rewind_to(cp, 1, [OffsetRange(A, 0, 100)])
    assert unfinished_batch(cp) == 1
    assert sorted(p.name for p in (cp / "offsets").iterdir()) == [".1.crc", "0", "1"]
    assert sorted(p.name for p in (cp / "commits").iterdir()) == ["0"]
    assert sorted(p.name for p in (cp / LOST_FOLDER).iterdir()) == ["1.json"]
    assert rewind_to(cp, 1, [OffsetRange(A, 0, 100)])  # again (a crash midway): the same
    assert unfinished_batch(cp) == 1
