"""A process of its own for a table's services beside the batches.

Why a process and not only the runner's thread (`engine/services.py`): some services are mostly
pure Python (pyiceberg's manifests, snapshot expiry, orphan listing). On a thread of the driver
they hold the interpreter's lock for long stretches, and the batch's commit, a chain of short
steps that each need it back, waits behind them (the freshness tail: an Iceberg commit beside a
rewrite took seconds). In a process of their own they compete for a core, not for the lock.

The protocol is pickled frames on the child's stdin and stdout: the parent sends `(module,
function, args)`, the child answers `(True, result)` or `(False, "the error")`. Nothing else
ties the two: when the parent dies (kill -9 included) the child reads the end of its input and
exits after the job in progress, which commits or not as a process of its own beside the writer
would. A child idle for `idle_s` exits too; the next call starts another.
"""

from __future__ import annotations

import importlib
import logging
import os
import pickle
import select
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, Any, TypeVar

from lakesink.errors import LakesinkError

log = logging.getLogger(__name__)

T = TypeVar("T")

IDLE_S = 120.0
"""How long a child waits for its next job before it exits (services run every few commits)."""

CLOSE_WAIT_S = 5.0


class ServiceProcessError(LakesinkError):
    """The service's process failed the job (its error's text) or died under it."""


class ServiceProcess:
    """Runs module-level functions in one child Python process, one call at a time."""

    def __init__(self, name: str, *, idle_s: float = IDLE_S) -> None:
        self.name = name
        self.idle_s = idle_s
        self.started = 0  # children started, for tests and the log
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in the child (`fn` a module-level function; args and result pickle).
        A child that ended before it read the job (idle, or killed) is replaced once."""
        frame = pickle.dumps((fn.__module__, fn.__qualname__, args))
        with self._lock:
            for attempt in (1, 2):
                child = self._running_child()
                try:
                    assert child.stdin is not None and child.stdout is not None
                    child.stdin.write(frame)
                    child.stdin.flush()
                    ok, value = pickle.load(child.stdout)
                    break
                except (BrokenPipeError, EOFError, OSError, pickle.UnpicklingError) as e:
                    self._stop(child)
                    if attempt == 2:
                        raise ServiceProcessError(
                            f"{self.name}: the services' process ended during "
                            f"{fn.__qualname__} ({type(e).__name__}; exit code "
                            f"{child.returncode})"
                        ) from e
        if not ok:
            raise ServiceProcessError(f"{self.name}: {fn.__qualname__} failed: {value}")
        return value  # type: ignore[no-any-return]

    def close(self) -> None:
        """End the child (it finishes the job in progress first, up to CLOSE_WAIT_S)."""
        with self._lock:
            if self._child is not None:
                self._stop(self._child)

    def _running_child(self) -> subprocess.Popen[bytes]:
        if self._child is not None and self._child.poll() is None:
            return self._child
        level = logging.getLogger("lakesink").getEffectiveLevel()
        # the child imports what this process can (lakesink from a notebook's sys.path too)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._child = subprocess.Popen(
            [sys.executable, "-m", __name__, str(level), str(self.idle_s), self.name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self.started += 1
        log.info("%s: services' process started (pid %d)", self.name, self._child.pid)
        return self._child

    def _stop(self, child: subprocess.Popen[bytes]) -> None:
        for stream in (child.stdin, child.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            child.wait(CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if self._child is child:
            self._child = None


def _serve(frames_in: IO[bytes], frames_out: IO[bytes], idle_s: float) -> int:
    while True:
        ready, _, _ = select.select([frames_in], [], [], idle_s)
        if not ready:
            return 0  # idle: the parent starts another when it needs one
        try:
            module, qualname, args = pickle.load(frames_in)
        except EOFError:
            return 0  # the parent closed our input or died
        try:
            fn: Any = importlib.import_module(module)
            for part in qualname.split("."):
                fn = getattr(fn, part)
            answer: tuple[bool, object] = (True, fn(*args))
        except Exception as e:  # answered, never raised: the parent decides
            log.exception("%s failed", qualname)
            answer = (False, f"{type(e).__name__}: {e}")
        pickle.dump(answer, frames_out)
        frames_out.flush()


def main(argv: list[str]) -> int:
    level, idle_s, name = int(argv[0]), float(argv[1]), argv[2]
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s %(levelname)s %(name)s [{name} services]: %(message)s",
    )
    # the frames own stdout: anything printed goes to stderr, with the log
    frames_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return _serve(sys.stdin.buffer, frames_out, idle_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
