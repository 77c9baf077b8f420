"""The services' process (`engine/service_process.py`): calls run in a real child Python, its
failures come back as one error, and a child that ended (idle, killed, or its parent gone) is
never waited on."""

from __future__ import annotations

import math
import operator
import os
import subprocess
import sys
import textwrap
import time

import pytest

from lakesink.engine.service_process import ServiceProcess, ServiceProcessError


def _gone(pid: int, within_s: float) -> bool:
    """The process ended (a zombie nobody reaped yet counts as ended)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_calls_run_in_one_child_that_is_not_this_process() -> None:
    process = ServiceProcess("t")
    try:
        assert process.call(operator.add, 2, 3) == 5
        pid = process.call(os.getpid)
        assert pid != os.getpid()
        assert process.call(os.getpid) == pid  # one child serves every call
        assert process.started == 1
    finally:
        process.close()
    assert _gone(pid, 5)


def test_a_failing_call_raises_its_error_and_the_child_serves_the_next() -> None:
    process = ServiceProcess("t")
    try:
        with pytest.raises(ServiceProcessError, match=r"sqrt failed: ValueError: math domain"):
            process.call(math.sqrt, -1.0)
        assert process.call(math.sqrt, 9.0) == 3.0
        assert process.started == 1
    finally:
        process.close()


def test_a_child_killed_between_calls_is_replaced() -> None:
    process = ServiceProcess("t")
    try:
        first = process.call(os.getpid)
        os.kill(first, 9)
        second = process.call(os.getpid)
        assert second != first and process.started == 2
    finally:
        process.close()


def test_an_idle_child_exits_and_the_next_call_starts_another() -> None:
    process = ServiceProcess("t", idle_s=0.2)
    try:
        first = process.call(os.getpid)
        deadline = time.monotonic() + 5
        while process._child is not None and process._child.poll() is None:
            assert time.monotonic() < deadline, "the idle child did not exit"
            time.sleep(0.05)
        assert process.call(os.getpid) != first and process.started == 2
    finally:
        process.close()


def test_the_child_of_a_killed_parent_exits() -> None:
    parent = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import os
                from lakesink.engine.service_process import ServiceProcess
                p = ServiceProcess("t")
                print(p.call(os.getpid), flush=True)
                os._exit(9)  # no cleanup: as kill -9 leaves it
                """
            ),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    child = int(parent.stdout.strip())
    assert _gone(child, 10), "the services' process outlived its parent"
