"""Zombie fencing: a writer that was replaced can never publish.

- Two OS processes with the same writer id: A begins an instant, writes its files and is paused
  (SIGSTOP); B starts with the same writer id (a newer incarnation), rolls A's instant back and
  commits the same offsets; A resumes (SIGCONT) and must fail without publishing.
- Two OS processes with different writer ids: A is paused past its heartbeat tolerance; B's
  recovery rolls A's expired instant back; A resumes and must fail without publishing.
- The race between a lazy rollback and the publish of the writer it rolls back, made
  deterministic with a hook: the resumed writer must not publish an instant whose files the
  rollback is deleting.

The processes drive `Coordinator` + `WriterCommitControl` directly (no Spark, no broker):
the commit protocol is what is under test; rows carry Kafka coordinates so the table can be
checked like the audit does (hudi-rs and lakesink's reader, no duplicates, exact offsets).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakesink.config import LakesinkConfig, build_config
from lakesink.errors import CommitError, LakesinkError
from lakesink.formats.hudi import writer_state as commit_state
from lakesink.formats.hudi.audit import read_with_hudi_rs
from lakesink.formats.hudi.control import WriterCommitControl
from lakesink.formats.hudi.coordinator import HudiCoordinator
from lakesink.formats.hudi.table.config import TableConfig
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.reader import TableReader
from lakesink.formats.hudi.table.timeline import Timeline
from lakesink.formats.hudi.table.writer import PartitionedWriter
from lakesink.protocol.instant import InstantTime
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.protocol.write_status import WriteStatus

pytestmark = pytest.mark.integration

COORDS = ["kafka_topic", "kafka_partition", "kafka_offset"]
TABLE_CONFIG = TableConfig(name="fenced", record_key_fields=tuple(COORDS), version=8)


def config(table: Path, writer_id: str, **extra: Any) -> LakesinkConfig:
    return build_config(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9",  # never contacted
            "kafka.topics": "t",
            "value.format": "raw",
            "table.path": str(table),
            "writer.id": writer_id,
            "lock.provider": "filesystem",
            "lock.lease.s": 5,
            "lock.timeout.s": 20,
            "heartbeat.interval.s": 0.2,
            "heartbeat.tolerance.s": 1.5,
            **extra,
        }
    )


def rows(topic: str, r: OffsetRange) -> pa.Table:
    n = r.end - r.start
    return pa.table(
        {
            "kafka_topic": pa.array([topic] * n, pa.string()),
            "kafka_partition": pa.array([r.partition.partition] * n, pa.int32()),
            "kafka_offset": pa.array(range(r.start, r.end), pa.int64()),
        }
    )


def write_batch(
    table: HudiTable, t: InstantTime, ranges: list[OffsetRange]
) -> tuple[list[WriteStatus], str]:
    statuses, schema = [], ""
    for task, r in enumerate(ranges):
        w = PartitionedWriter(table, t, f"{task}-1-0")
        w.write(rows(r.partition.topic, r))
        files = w.close()
        schema = w.avro_schema or schema
        statuses.append(WriteStatus(t.value, f"1.{task}.0", None, tuple(files), r.span, r.span))
    return statuses, schema


def coordinates(table: HudiTable) -> list[tuple[str, int, int]]:
    if not table.timeline().completed_data_instants():
        return []
    t = TableReader(table).snapshot(columns=COORDS)
    ours = sorted(zip(*(t.column(c).to_pylist() for c in COORDS), strict=True))
    rs = read_with_hudi_rs(str(table.base_path))
    theirs = sorted(zip(*(rs.column(c).to_pylist() for c in COORDS), strict=True))
    assert ours == theirs, "hudi-rs and lakesink's reader disagree"
    return ours


# --------------------------------------------------------------------------------------------
# the writer process
# --------------------------------------------------------------------------------------------

WRITER_SCRIPT = r"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from integration.test_fencing import config, write_batch, TABLE_CONFIG
from lakesink.errors import LakesinkError
from lakesink.protocol.offsets import OffsetRange, TopicPartition
from lakesink.formats.hudi.coordinator import HudiCoordinator
from lakesink.formats.hudi.control import WriterCommitControl
from lakesink.formats.hudi.table.hudi_table import HudiTable

table_path, writer_id, topic, start, end, mode = sys.argv[1:7]
status = Path(sys.argv[7])
def say(**kw):
    with open(status, "a") as f:
        f.write(json.dumps(kw) + "\n")
table = HudiTable.create(table_path, TABLE_CONFIG)
services = WriterCommitControl.for_writer(config(Path(table_path), writer_id).settings)
coordinator = HudiCoordinator(table, writer_id, query_id=mode, control=services)
coordinator.start()
ranges = [OffsetRange(TopicPartition(topic, 0), int(start), int(end))]
t = coordinator.begin_batch(0, ranges)
statuses, schema = write_batch(table, t, ranges)
prepared = coordinator.precommit(t, 0, ranges, statuses, schema)
say(state="prepared", instant=t.value)
if mode == "pause":
    while not Path(str(status) + ".go").exists():  # SIGSTOP lands here
        time.sleep(0.01)
try:
    outcome = coordinator.commit(prepared)
except LakesinkError as e:
    say(state="refused", error=type(e).__name__, message=str(e))
    sys.exit(3)
say(state="published", instant=t.value, verdict=outcome.verdict.value)
"""


@pytest.fixture
def writer_script(tmp_path: Path) -> Path:
    tests = str(Path(__file__).resolve().parents[1])
    path = tmp_path / "writer.py"
    path.write_text(WRITER_SCRIPT.format(tests=tests))
    return path


class WriterProcess:
    def __init__(
        self,
        script: Path,
        table: Path,
        writer_id: str,
        topic: str,
        start: int,
        end: int,
        mode: str,
        status: Path,
    ) -> None:
        self.status = status
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(script),
                str(table),
                writer_id,
                topic,
                str(start),
                str(end),
                mode,
                str(status),
            ],
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def states(self) -> list[dict[str, Any]]:
        try:
            return [json.loads(ln) for ln in self.status.read_text().splitlines() if ln]
        except FileNotFoundError:
            return []

    def wait_for(self, state: str, timeout_s: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for s in self.states():
                if s["state"] == state:
                    return s
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        out = self.proc.stdout.read() if self.proc.poll() is not None and self.proc.stdout else ""
        raise AssertionError(f"writer never reached {state!r}: {self.states()} {out[-3000:]}")

    def finish(self, timeout_s: float = 60) -> tuple[int, str]:
        try:
            out, _ = self.proc.communicate(timeout=timeout_s)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode, out


@pytest.fixture
def processes() -> Iterator[list[WriterProcess]]:
    started: list[WriterProcess] = []
    yield started
    for p in started:
        if p.proc.poll() is None:
            os.killpg(p.proc.pid, signal.SIGCONT)
            os.killpg(p.proc.pid, signal.SIGKILL)
            p.proc.wait()


def test_same_writer_id_started_twice_old_incarnation_never_publishes(
    tmp_path: Path, writer_script: Path, processes: list[WriterProcess]
) -> None:
    table = tmp_path / "t"
    a = WriterProcess(writer_script, table, "w", "topic", 0, 50, "pause", tmp_path / "a.status")
    processes.append(a)
    a_began = a.wait_for("prepared")
    os.killpg(a.proc.pid, signal.SIGSTOP)  # A is frozen mid-commit: files written, not published
    # B: the same writer id again (a restarted query): a newer incarnation that rolls A back.
    b = WriterProcess(writer_script, table, "w", "topic", 0, 50, "run", tmp_path / "b.status")
    processes.append(b)
    b_code, b_out = b.finish()
    assert b_code == 0, b_out
    b_done = b.wait_for("published")
    assert b_done["instant"] != a_began["instant"]
    (tmp_path / "a.status.go").touch()
    os.killpg(a.proc.pid, signal.SIGCONT)
    a_code, a_out = a.finish()
    refused = a.wait_for("refused")
    assert a_code == 3, a_out
    assert refused["error"] in ("FencedError", "HeartbeatExpiredError", "LockError", "CommitError")
    t = HudiTable.open(table)
    completed = {i.time.value for i in t.timeline().completed_data_instants()}
    assert a_began["instant"] not in completed and b_done["instant"] in completed
    assert coordinates(t) == [("topic", 0, o) for o in range(50)]
    assert commit_state.committed_offsets(t, "w").to_json() == {"topic:0": 50}


def test_writer_paused_past_its_heartbeat_is_rolled_back_by_another_and_never_publishes(
    tmp_path: Path, writer_script: Path, processes: list[WriterProcess]
) -> None:
    table = tmp_path / "t"
    a = WriterProcess(writer_script, table, "wa", "ta", 0, 40, "pause", tmp_path / "a.status")
    processes.append(a)
    a_began = a.wait_for("prepared")
    os.killpg(a.proc.pid, signal.SIGSTOP)
    time.sleep(2.5)  # beyond heartbeat.tolerance.s=1.5: A's instant counts as failed
    # B, another writer of the same table, starts: its recovery rolls back A's expired instant.
    b = WriterProcess(writer_script, table, "wb", "tb", 0, 30, "run", tmp_path / "b.status")
    processes.append(b)
    b_code, b_out = b.finish()
    assert b_code == 0, b_out
    t = HudiTable.open(table)
    assert t.timeline().get(a_began["instant"]) is None, "A's instant was not rolled back"
    (tmp_path / "a.status.go").touch()
    os.killpg(a.proc.pid, signal.SIGCONT)
    a_code, a_out = a.finish()
    refused = a.wait_for("refused")
    assert a_code == 3, a_out
    assert refused["error"] in ("FencedError", "HeartbeatExpiredError", "LockError", "CommitError")
    t = HudiTable.open(table)
    assert a_began["instant"] not in {i.time.value for i in t.timeline().completed()}
    assert coordinates(t) == [("tb", 0, o) for o in range(30)]
    assert commit_state.committed_offsets(t, "wa").to_json() == {}


def test_lazy_rollback_racing_the_publish_of_a_resumed_writer_never_loses_committed_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pauses between reconciling and publishing until its heartbeat expires. B's recovery
    rolls A's instant back; right when B has deleted A's files (before B completes the rollback),
    A resumes, beats again and publishes. A must be refused: a completed instant whose files
    are gone would be a loss (and a table no reader can read)."""
    path = tmp_path / "t"
    table = HudiTable.create(path, TABLE_CONFIG)
    a_services = WriterCommitControl.for_writer(
        config(path, "wa", **{"lock.timeout.s": 3}).settings
    )
    a = HudiCoordinator(table, "wa", control=a_services)
    a.start()
    ranges = [OffsetRange(TopicPartition("ta", 0), 0, 20)]
    t = a.begin_batch(0, ranges)
    assert t is not None
    statuses, schema = write_batch(table, t, ranges)
    prepared = a.precommit(t, 0, ranges, statuses, schema)
    heartbeat = a_services.heartbeats[t.value]
    heartbeat.stop()  # A is paused: no more beats
    time.sleep(1.8)  # beyond heartbeat.tolerance.s=1.5

    outcome: dict[str, Any] = {}

    def resume_a() -> None:
        heartbeat.start()  # A resumes: its heartbeat thread beats again at once
        try:
            outcome["published"] = a.commit(prepared)
        except LakesinkError as e:
            outcome["refused"] = e

    original = Timeline.complete_rollback
    racer: list[threading.Thread] = []

    def complete_rollback(self: Timeline, *args: Any, **kwargs: Any) -> Any:
        if not racer:  # B has deleted A's files and is about to complete its rollback
            racer.append(threading.Thread(target=resume_a))
            racer[0].start()
            racer[0].join(timeout=1.0)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Timeline, "complete_rollback", complete_rollback)
    b = HudiCoordinator(
        table, "wb", control=WriterCommitControl.for_writer(config(path, "wb").settings)
    )
    b.start()
    monkeypatch.setattr(Timeline, "complete_rollback", original)
    assert racer, "B did not roll back A's expired instant"
    racer[0].join(timeout=30)
    heartbeat.stop(delete=True)
    assert "refused" in outcome, f"A published an instant B was rolling back: {outcome}"
    completed = {i.time for i in table.timeline().completed()}
    assert t not in completed
    assert coordinates(table) == []
    for inst in table.timeline().completed_data_instants():
        for w in table.timeline().commit_metadata(inst).writes:
            assert (path / w.path).is_file(), f"{inst} references deleted file {w.path}"


def test_zombie_tasks_writing_after_their_instant_was_rolled_back_leave_no_files_readers_see(
    tmp_path: Path,
) -> None:
    """A's instant is rolled back by a newer incarnation (B) that then commits the same offsets;
    A's tasks, still running, finish their files afterwards. hudi-rs reads any base file whose
    instant time precedes the latest completed instant, on the timeline or not, so A's files
    must be gone at once (not only when A aborts): no reader may see a record twice."""
    path = tmp_path / "t"
    table = HudiTable.create(path, TABLE_CONFIG)
    ranges = [OffsetRange(TopicPartition("ta", 0), 0, 20)]
    a = HudiCoordinator(
        table, "w", control=WriterCommitControl.for_writer(config(path, "w").settings)
    )
    a.start()
    t_a = a.begin_batch(0, ranges)
    assert t_a is not None
    b = HudiCoordinator(
        table, "w", control=WriterCommitControl.for_writer(config(path, "w").settings)
    )
    b.start()  # fences A, rolls A's instant back
    t_b = b.begin_batch(0, ranges)
    assert t_b is not None
    statuses, schema = write_batch(table, t_b, ranges)
    b.complete_batch(t_b, 0, ranges, statuses, schema)
    with pytest.raises(CommitError, match="rolled back"):
        write_batch(table, t_a, ranges)  # A's tasks finish late: they delete their own file
    # even if A died right here (no abort), no reader sees A's rows
    assert coordinates(table) == [("ta", 0, o) for o in range(20)]
    a.abort(t_a)  # what the sink does when the batch fails
    a.control.stop_heartbeat(table, t_a)
    assert coordinates(table) == [("ta", 0, o) for o in range(20)]
