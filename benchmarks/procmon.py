"""Sample the process tree of a PID: peak RSS and CPU seconds per role (driver Python, Spark
JVM, the Spark JVM's JIT compiler threads, the Python source's planning process ("source"),
Python workers, everything else), for the benchmark's memory and CPU columns."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import psutil


def role_of(proc: psutil.Process, root_pid: int) -> str:
    if proc.pid == root_pid:
        return "driver"
    try:
        cmd = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "other"
    if "java" in cmd.split(" ", 1)[0] or "org.apache.spark" in cmd:
        return "jvm"
    if "python_streaming_source_runner" in cmd:  # a Python source's driver side (planning)
        return "source"
    if "pyspark" in cmd:
        return "pyworkers"
    return "other"


_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# HotSpot's names for its JIT threads ("C2 CompilerThread0" cut to 15 characters by the kernel)
_JIT_THREAD_PREFIXES = ("C1 CompilerThre", "C2 CompilerThre")


class _JitThreads:
    """CPU seconds of the JIT compiler threads of JVM processes, from /proc/PID/task: the part
    of a JVM's CPU that is warm-up (compiling) rather than work. A compiler thread that exits
    keeps the last value seen (HotSpot starts and stops them as the compile queue grows)."""

    def __init__(self) -> None:
        self._names: dict[tuple[int, int], str] = {}
        self._cpu: dict[tuple[int, int], float] = {}

    def of(self, pid: int) -> float:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            tids = []
        for tid in tids:
            key = (pid, tid)
            name = self._names.get(key)
            if name is None:
                try:
                    with open(f"/proc/{pid}/task/{tid}/comm") as f:
                        name = self._names[key] = f.read().strip()
                except OSError:
                    continue
            if name.startswith(_JIT_THREAD_PREFIXES):
                try:
                    with open(f"/proc/{pid}/task/{tid}/stat") as f:
                        fields = f.read().rsplit(") ", 1)[1].split()
                except (OSError, IndexError):
                    continue
                self._cpu[key] = (int(fields[11]) + int(fields[12])) / _TICKS_PER_S
        return sum(secs for (p, _), secs in self._cpu.items() if p == pid)

    def forget(self, pid: int) -> None:
        """A new process took `pid`: its thread ids are not the old one's."""
        for key in [k for k in self._names if k[0] == pid]:
            del self._names[key]
        for key in [k for k in self._cpu if k[0] == pid]:
            del self._cpu[key]


@dataclass
class TreeStats:
    """Peak RSS (bytes) per role, summed over that role's live processes at each sample, and
    CPU seconds per role (user + system, last value seen for every process)."""

    peak_rss: dict[str, int] = field(default_factory=dict)
    peak_total_rss: int = 0
    cpu_s: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        return {
            "peak_rss_mb": {k: round(v / 2**20, 1) for k, v in self.peak_rss.items()},
            "peak_total_rss_mb": round(self.peak_total_rss / 2**20, 1),
            "cpu_s": {k: round(v, 2) for k, v in self.cpu_s.items()},
        }


class TreeMonitor:
    """`with TreeMonitor(pid) as m: ...` samples the tree rooted at `pid` every `interval_s`."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.stats = TreeStats()
        self._cpu: dict[int, tuple[str, float]] = {}
        self._jit = _JitThreads()
        self._procs: dict[int, psutil.Process] = {}
        self._gone: list[tuple[str, float]] = []
        """(role, CPU seconds) of exited processes whose pid a new one took."""
        self.timeline: list[tuple[float, dict[str, float]]] = []
        """(time.time(), CPU seconds so far per role) at every sample."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        cpu: dict[str, float] = {}
        for role, secs in [*self._cpu.values(), *self._gone]:
            cpu[role] = cpu.get(role, 0.0) + secs
        self.stats.cpu_s = cpu

    def _tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        out = []
        for p in procs:
            known = self._procs.get(p.pid)
            if known is None or known.create_time() != p.create_time():
                if known is not None:  # a new process under a reused pid
                    for old in (self._cpu.pop(p.pid, None), self._cpu.pop(-p.pid, None)):
                        if old is not None:
                            self._gone.append(old)
                    self._jit.forget(p.pid)
                self._procs[p.pid] = p
                known = p
            out.append(known)
        return out

    def sample(self) -> None:
        rss: dict[str, int] = {}
        for p in self._tree():
            try:
                role = role_of(p, self.pid)
                if role == "other" and p.pid in self._cpu:
                    # an exiting worker whose command line can no longer be read keeps its
                    # role (a `bash spark-class` that execs java does change it: to jvm)
                    role = self._cpu[p.pid][0]
                with p.oneshot():
                    mem = p.memory_info().rss
                    t = p.cpu_times()
                secs = t.user + t.system
                if role == "jvm":  # its compiler threads apart, under -pid
                    jit = min(secs, self._jit.of(p.pid))
                    self._cpu[-p.pid] = ("jit", jit)
                    secs -= jit
                self._cpu[p.pid] = (role, secs)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            rss[role] = rss.get(role, 0) + mem
        cpu: dict[str, float] = {}
        for role, secs in [*self._cpu.values(), *self._gone]:
            cpu[role] = cpu.get(role, 0.0) + secs
        self.timeline.append((time.time(), cpu))
        for role, v in rss.items():
            self.stats.peak_rss[role] = max(self.stats.peak_rss.get(role, 0), v)
        self.stats.peak_total_rss = max(self.stats.peak_total_rss, sum(rss.values()))

    def cpu_between(self, t0: float, t1: float) -> float:
        """CPU seconds of the whole tree between wall times t0 and t1 (nearest samples)."""
        return sum(self.cpu_by_role_between(t0, t1).values())

    def cpu_by_role_between(self, t0: float, t1: float) -> dict[str, float]:
        """CPU seconds per role between wall times t0 and t1 (nearest samples): where a steady
        window's CPU went (driver, jvm, pyworkers)."""

        def at(t: float) -> dict[str, float]:
            return min(self.timeline, key=lambda s: abs(s[0] - t), default=(0.0, {}))[1]

        start, end = at(t0), at(t1)
        return {role: max(0.0, secs - start.get(role, 0.0)) for role, secs in end.items()}

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(self.interval_s)
        self.sample()


def run_monitored(
    cmd: list[str], interval_s: float = 0.1, **popen: object
) -> tuple[int, TreeMonitor, float]:
    """Run `cmd`, sampling its tree; returns (exit code, monitor, wall seconds)."""
    import subprocess

    started = time.perf_counter()
    proc = subprocess.Popen(cmd, **popen)  # type: ignore[call-overload]
    with TreeMonitor(proc.pid, interval_s) as mon:
        code = proc.wait()
    return code, mon, time.perf_counter() - started
