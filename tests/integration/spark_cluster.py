"""A Spark standalone cluster on loopback (one master, N workers) from pyspark's own launcher
(`bin/spark-class`), for tests whose executors must be separate processes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pyspark


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


class StandaloneCluster:
    def __init__(self, work_dir: Path, workers: int = 1, cores_per_worker: int = 2) -> None:
        self.work_dir = work_dir
        self.workers = workers
        self.cores = cores_per_worker
        self.port = _free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _launch(self, name: str, args: list[str]) -> None:
        env = {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_HOME": str(self.spark_class.parents[1]),
        }
        log = open(self.work_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.procs.append(
            subprocess.Popen(
                [str(self.spark_class), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        )

    def start(self) -> StandaloneCluster:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._launch(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(_free_port()),
            ],
        )
        _wait_port(self.port, 60)
        for n in range(self.workers):
            self._launch(
                f"worker{n}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    self.master_url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(self.cores),
                    "--memory",
                    "2g",
                    "--webui-port",
                    str(_free_port()),
                    "--work-dir",
                    str(self.work_dir / f"work{n}"),
                ],
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # workers registered?
            logs = (self.work_dir / "master.log").read_text(errors="replace")
            if logs.count("Registering worker") >= self.workers:
                return self
            time.sleep(0.5)
        raise TimeoutError(f"workers did not register with {self.master_url}")

    def executor_pids(self) -> list[int]:
        """Executor JVMs: the descendants of our worker processes running the executor class."""
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        todo = [p.pid for p in self.procs[1:]]
        found: list[int] = []
        while todo:
            pid = todo.pop()
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"CoarseGrainedExecutorBackend" in cmd:
                found.append(pid)
            todo.extend(children.get(pid, []))
        return found

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self.procs.clear()
