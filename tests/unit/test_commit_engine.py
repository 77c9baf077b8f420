"""The commit engine on its own: the retry loop's sorting of failures, the requirements, and a
TableTransaction's states on a local table (no lock, no Spark)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from lakesink.engine.format import TableFormat
from lakesink.engine.requirements import BackfillNotCommitted, OffsetsUnchanged
from lakesink.engine.retry import RetryPolicy, run_commit
from lakesink.engine.transaction import TableTransaction, TxState
from lakesink.errors import (
    CommitError,
    CommitStateUnknownError,
    LockError,
    OffsetError,
)
from lakesink.formats.hudi.control import CommitControl
from lakesink.formats.hudi.format import HudiFormat
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.files import base_file_name, new_file_id
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.markers import create_marker
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.writer_state import (
    BACKFILL_ID_KEY,
    COMMIT_ID_KEY,
    OFFSETS_KEY,
    WRITER_ID_KEY,
    committed_offsets,
)
from lakesink.protocol.instant import Action, InstantTime
from lakesink.protocol.offsets import TopicPartition, WriterOffsets
from lakesink.protocol.write_status import FileWrite

SCHEMA = json.dumps({"type": "record", "name": "r", "fields": [{"name": "x", "type": "long"}]})
NO_WAIT = RetryPolicy(attempts=3, backoff_s=0.0)


class Calls:
    def __init__(self, *outcomes: object) -> None:
        self.outcomes = list(outcomes)
        self.count = 0

    def __call__(self) -> object:
        self.count += 1
        out = self.outcomes.pop(0)
        if isinstance(out, BaseException):
            raise out
        return out


# --- the retry loop ---------------------------------------------------------------------------
def test_retry_unknown_outcome_that_landed_is_resolved_by_reading_the_table() -> None:
    attempt = Calls(CommitStateUnknownError("lost response"))
    assert run_commit(attempt, resolve=lambda: "landed", policy=NO_WAIT) == "landed"
    assert attempt.count == 1


def test_retry_unknown_outcome_not_on_the_table_is_tried_again() -> None:
    attempt = Calls(CommitStateUnknownError("lost response"), "published")
    assert run_commit(attempt, resolve=lambda: None, policy=NO_WAIT) == "published"
    assert attempt.count == 2


def test_retry_unknown_outcome_every_time_raises_after_the_attempts() -> None:
    attempt = Calls(*(CommitStateUnknownError("lost") for _ in range(3)))
    with pytest.raises(CommitStateUnknownError):
        run_commit(attempt, resolve=lambda: None, policy=NO_WAIT)
    assert attempt.count == 3


def test_retry_non_retriable_error_is_raised_at_once() -> None:
    attempt = Calls(OffsetError("offsets would move backwards"), "never reached")
    policy = RetryPolicy(attempts=3, backoff_s=0.0, retry_on=(OffsetError,))
    with pytest.raises(OffsetError):
        run_commit(attempt, resolve=lambda: None, policy=policy)
    assert attempt.count == 1


def test_retry_retriable_error_named_by_the_policy_is_tried_again() -> None:
    attempt = Calls(LockError("busy"), LockError("busy"), "published")
    policy = RetryPolicy(attempts=3, backoff_s=0.0, retry_on=(LockError,))
    assert run_commit(attempt, resolve=lambda: None, policy=policy) == "published"
    assert attempt.count == 3


def test_retry_retriable_error_not_named_by_the_policy_is_left_to_the_caller() -> None:
    attempt = Calls(CommitError("rolled back under us"), "never reached")
    with pytest.raises(CommitError):
        run_commit(attempt, resolve=lambda: None, policy=NO_WAIT)
    assert attempt.count == 1


# --- requirements -----------------------------------------------------------------------------
class FakeView:
    def __init__(self, offsets: WriterOffsets, backfills: frozenset[str] = frozenset()) -> None:
        self.offsets = offsets
        self.backfills = backfills

    def committed_offsets(self, writer_id: str) -> WriterOffsets:
        return self.offsets

    def backfill_committed(self, backfill_id: str) -> bool:
        return backfill_id in self.backfills

    def check_conflicts(self, operation: object, strategy: object) -> None:
        return None

    def check_alive(self, control: object, instant_time: object) -> None:
        return None


def test_offsets_unchanged_fails_when_another_incarnation_committed() -> None:
    t = InstantTime.from_epoch_ms(1_700_000_000_000)
    base = WriterOffsets({TopicPartition("t", 0): 10})
    moved = WriterOffsets({TopicPartition("t", 0): 20})
    OffsetsUnchanged("w", base, t).validate(FakeView(base))
    with pytest.raises(CommitError, match="writer w's committed offsets changed"):
        OffsetsUnchanged("w", base, t).validate(FakeView(moved))


def test_backfill_not_committed_fails_for_a_backfill_already_on_the_table() -> None:
    BackfillNotCommitted("b1").validate(FakeView(WriterOffsets.empty()))
    with pytest.raises(CommitError, match="backfill b1 was committed concurrently"):
        BackfillNotCommitted("b1").validate(FakeView(WriterOffsets.empty(), frozenset({"b1"})))


# --- TableTransaction on a local table ---------------------------------------------------------
class RecordingControl(CommitControl):
    def __init__(self) -> None:
        super().__init__()
        self.beating: set[str] = set()

    def start_heartbeat(self, table: HudiTable, t: InstantTime) -> None:
        self.beating.add(t.value)

    def stop_heartbeat(self, table: HudiTable, t: InstantTime) -> None:
        self.beating.discard(t.value)


def _table(tmp_path: Path) -> HudiTable:
    return HudiTable.create(tmp_path / "t", TableConfig("t", ("x",), (), version=8))


def _write(table: HudiTable, t: InstantTime) -> FileWrite:
    """One base file with its marker, as a task writes it."""
    fid = new_file_id()
    f = FileWrite("", fid, base_file_name(fid, "0-1-0", t), 1, 1)
    create_marker(table.base_path, t, "", f.path)
    (table.base_path / f.path).touch()
    return f


def _metadata(
    writes: tuple[FileWrite, ...], offsets: WriterOffsets, **extra: str
) -> CommitMetadata:
    return CommitMetadata(
        "INSERT",
        writes,
        schema=SCHEMA,
        extra={
            WRITER_ID_KEY: "w",
            COMMIT_ID_KEY: "c-1",
            OFFSETS_KEY: json.dumps(offsets.to_json()),
            **extra,
        },
    )


def test_hudi_format_is_a_table_format(tmp_path: Path) -> None:
    fmt: TableFormat = HudiFormat(_table(tmp_path))
    assert fmt.committed_offsets("nobody") == WriterOffsets.empty()


def test_transaction_begin_stage_commit_publishes_once_and_runs_hooks(tmp_path: Path) -> None:
    table = _table(tmp_path)
    control = RecordingControl()
    hooked: list[InstantTime] = []
    hooked_at: list[float] = []

    def hook(t: InstantTime) -> None:
        hooked.append(t)
        hooked_at.append(time.time())

    tx = TableTransaction(HudiFormat(table), control, writer_id="w", hooks=(hook,))
    t = tx.begin()
    assert tx.state is TxState.ACTIVE and t.value in control.beating
    assert [i.time for i in table.timeline().inflight_or_requested()] == [t]
    kept = _write(table, t)
    orphan = _write(table, t)  # a failed task attempt's file: marked, not reported
    assert tx.stage({kept.path}) == {kept.path}
    assert not (table.base_path / orphan.path).exists()
    offsets = WriterOffsets({TopicPartition("t", 0): 5})
    unchanged = OffsetsUnchanged("w", WriterOffsets.empty(), t)
    result = tx.commit(_metadata((kept,), offsets), (unchanged,))
    assert result.published and tx.state is TxState.COMMITTED
    assert hooked == [t] and control.beating == set()
    assert 0 < result.published_at <= hooked_at[0]  # published, then the hooks ran
    assert committed_offsets(table, "w") == offsets
    again = TableTransaction.resume(HudiFormat(table), control, t, writer_id="w").commit(
        _metadata((kept,), offsets)
    )
    assert not again.published
    assert len(table.timeline().completed(Action.COMMIT)) == 1


def test_transaction_reported_file_without_marker_is_an_error(tmp_path: Path) -> None:
    table = _table(tmp_path)
    tx = TableTransaction(HudiFormat(table), CommitControl(), writer_id="w")
    t = tx.begin()
    with pytest.raises(CommitError, match="have no marker"):
        tx.stage({f"{new_file_id()}_0-1-0_{t.value}.parquet"})


def test_transaction_failing_requirement_publishes_nothing_and_context_rolls_back(
    tmp_path: Path,
) -> None:
    table = _table(tmp_path)
    control = RecordingControl()
    with (
        pytest.raises(CommitError, match="backfill b1 was committed concurrently"),
        TableTransaction(HudiFormat(table), control, writer_id="w") as tx,
    ):
        t = tx.begin()
        f = _write(table, t)
        tx.stage({f.path})
        # the same backfill committed by another run meanwhile
        other = TableTransaction(HudiFormat(table), control, writer_id="w2")
        t2 = other.begin()
        g = _write(table, t2)
        other.stage({g.path})
        other.commit(_metadata((g,), WriterOffsets.empty(), **{BACKFILL_ID_KEY: "b1"}))
        tx.commit(
            _metadata((f,), WriterOffsets.empty(), **{BACKFILL_ID_KEY: "b1"}),
            (BackfillNotCommitted("b1"),),
        )
    assert tx.state is TxState.ABORTED
    assert control.beating == set()
    assert table.timeline().get(t) is None
    assert not (table.base_path / f.path).exists()
    assert [i.time for i in table.timeline().completed(Action.COMMIT)] == [t2]


def test_transaction_publish_whose_response_was_lost_is_found_on_the_table(
    tmp_path: Path,
) -> None:
    table = _table(tmp_path)
    tx = TableTransaction(HudiFormat(table), CommitControl(), writer_id="w", retry=NO_WAIT)
    t = tx.begin()
    f = _write(table, t)
    tx.stage({f.path})
    real = tx.format.publish
    calls: list[int] = []

    def publish_then_lose_the_answer(*args: object, **kwargs: object) -> object:
        calls.append(1)
        real(*args, **kwargs)  # type: ignore[arg-type]
        raise CommitStateUnknownError("the store did not answer")

    tx.format.publish = publish_then_lose_the_answer  # type: ignore[method-assign]
    result = tx.commit(_metadata((f,), WriterOffsets({TopicPartition("t", 0): 1})))
    assert result.published and calls == [1]
    done = table.timeline().get(t)
    assert done is not None and done.is_completed


def test_cleans_and_commits_get_completion_times_by_one_rule(tmp_path: Path) -> None:
    """A clean's completed file and a commit's follow the same completion-time rule: after the
    newest completion time, never before the instant's own time, never a time already taken."""
    from lakesink.formats.hudi.instants import complete_instant
    from lakesink.protocol.instant import Instant, State

    table = HudiTable.create(tmp_path / "t", TableConfig("t", ("k",), (), version=8))
    ahead = InstantTime.from_epoch_ms(int(time.time() * 1000) + 60_000)  # ahead of the clock
    timeline = table.timeline()
    commit = timeline.begin(Action.COMMIT, ahead)
    done = timeline.publish(commit, CommitMetadata("INSERT", (), schema=SCHEMA))
    assert done.completion_time is not None and done.completion_time >= ahead
    clean_time = InstantTime.from_epoch_ms(ahead.to_epoch_ms() - 30_000)
    table.timeline().begin(Action.CLEAN, clean_time)
    cleaned = complete_instant(table, Instant(clean_time, Action.CLEAN, State.INFLIGHT), b"x")
    assert cleaned.completion_time is not None
    assert cleaned.completion_time > done.completion_time  # after the newest completion
    taken = {i.time for i in table.timeline().instants} | {done.completion_time}
    assert cleaned.completion_time not in taken - {cleaned.time}
