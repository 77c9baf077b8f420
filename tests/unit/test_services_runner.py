"""The runner of table services beside the batches (lakesink.engine.services): one job at a
time in the order handed in, a name waits at most once (coalesced), failures are counted and
never raised, the end waits for the job in progress and drops what waits. Jobs are gated by
events the test sets: no sleeps order anything."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from lakesink.engine.services import ServicesRunner
from lakesink.metrics import IngestionMetrics, value_of

WAIT_S = 30.0  # only ever reached when the runner is broken


@dataclass
class Gate:
    """A job that says when it started and runs until the test lets it finish."""

    name: str
    log: list[str]
    started: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)
    fail: bool = False

    def __call__(self) -> object:
        self.started.set()
        assert self.go.wait(WAIT_S)
        self.log.append(self.name)
        if self.fail:
            raise RuntimeError(f"{self.name} broke")
        return None


def test_a_name_waits_at_most_once_while_its_run_goes_on() -> None:
    runner = ServicesRunner("t")
    ran: list[str] = []
    first, second, third = Gate("a1", ran), Gate("a2", ran), Gate("a3", ran)
    assert runner.submit("a", first)
    assert first.started.wait(WAIT_S)  # a1 runs: the batch thread went on
    assert runner.submit("a", second)  # waits its turn
    assert not runner.submit("a", third)  # one of the name waits already: coalesced
    assert runner.busy
    first.go.set()
    assert second.started.wait(WAIT_S)
    second.go.set()
    assert runner.wait_idle(WAIT_S)
    assert ran == ["a1", "a2"]
    assert (runner.stats.runs, runner.stats.coalesced, runner.stats.failed) == (2, 1, 0)
    assert runner.close(WAIT_S)


def test_a_failing_service_is_counted_and_the_next_one_still_runs() -> None:
    metrics = IngestionMetrics(table_names=("t",)).of_table("t")
    runner = ServicesRunner("t", metrics=metrics)
    ran: list[str] = []
    broken = Gate("broken", ran, fail=True)
    broken.go.set()

    @dataclass
    class Result:
        errors: list[str]

    assert runner.submit("x", broken)
    assert runner.submit("y", lambda: Result(["cluster: lost to a commit"]))  # gave up
    assert runner.submit("z", lambda: Result([]))
    assert runner.wait_idle(WAIT_S)
    assert ran == ["broken"]
    assert (runner.stats.runs, runner.stats.failed) == (3, 2)
    snap = metrics.snapshot()
    assert value_of(snap, "lakesink_table_service_runs_total", table="t", outcome="failed") == 2
    assert value_of(snap, "lakesink_table_service_runs_total", table="t", outcome="ok") == 1
    assert runner.close(WAIT_S)


def test_close_lets_the_run_in_progress_finish_and_drops_what_waits() -> None:
    runner = ServicesRunner("t")
    ran: list[str] = []
    running, waiting = Gate("running", ran), Gate("waiting", ran)
    assert runner.submit("a", running)
    assert running.started.wait(WAIT_S)
    assert runner.submit("b", waiting)
    assert not runner.close(0.0)  # the run goes on: not ended yet, nothing killed
    assert not runner.submit("c", Gate("late", ran))  # closed: refused
    running.go.set()
    assert runner.close(WAIT_S)
    assert ran == ["running"] and not waiting.started.is_set()
    assert runner.stats.dropped == 1 and not runner.busy


def test_an_idle_runner_holds_no_thread_and_closes_at_once() -> None:
    runner = ServicesRunner("idle")
    assert runner.wait_idle(0.0) and not runner.busy
    for _ in range(2):  # a thread for the work, ended when none is left; again for more
        ran: list[str] = []
        gate = Gate("a", ran)
        gate.go.set()
        assert runner.submit("a", gate)
        assert runner.wait_idle(WAIT_S) and ran == ["a"]
        for thread in [t for t in threading.enumerate() if t.name == "lakesink-services-idle"]:
            thread.join(WAIT_S)
            assert not thread.is_alive()
    assert runner.stats.runs == 2
    assert runner.close(0.0)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.one_of(st.sampled_from("abc"), st.just("step")), max_size=14))
def test_the_runner_runs_what_a_plain_queue_of_distinct_names_runs(ops: list[str]) -> None:
    """Against a reference: a list of waiting names (a name not appended while it waits) and
    one running job; `step` lets the running job finish."""
    runner = ServicesRunner("t")
    ran: list[str] = []
    running: Gate | None = None
    gates: dict[str, list[Gate]] = {}
    expected_ran: list[str] = []
    ref_waiting: list[str] = []
    ref_running: str | None = None

    def finish() -> None:
        nonlocal running, ref_running
        assert running is not None and ref_running is not None
        running.go.set()
        expected_ran.append(ref_running)
        ref_running = ref_waiting.pop(0) if ref_waiting else None
        running = None
        if ref_running is not None:
            running = gates[ref_running].pop(0)
            assert running.started.wait(WAIT_S)  # the next one started
        else:
            assert runner.wait_idle(WAIT_S)

    for op in ops:
        if op == "step":
            if ref_running is not None:
                finish()
            continue
        gate = Gate(op, ran)
        queued = runner.submit(op, gate)
        ref_queued = op not in ref_waiting
        assert queued == ref_queued
        if not queued:
            continue
        gates.setdefault(op, []).append(gate)
        if ref_running is None:
            ref_running = op
            running = gates[op].pop(0)
            assert running.started.wait(WAIT_S)
        else:
            ref_waiting.append(op)
    while ref_running is not None:
        finish()
    assert ran == expected_ran
    assert runner.stats.runs == len(expected_ran)
    assert runner.close(WAIT_S)
