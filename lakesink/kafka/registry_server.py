"""A local schema registry server: Apicurio Registry on loopback, in-memory storage, for the
tests (tests/integration/registry_fixture.py) and `lakesink demo --registry`.

`scripts/setup-registry.sh` unpacks Apicurio Registry 2.6.13.Final (a Quarkus app that runs on
Java 17) into `$LAKESINK_CACHE/registry/app` (override: `$LAKESINK_REGISTRY_APP`). `start`
launches it on a free loopback port (its HTTP server, health included, bound to 127.0.0.1),
waits until the Confluent-compatible API answers and sets the global compatibility to BACKWARD
(Apicurio's default is NONE); `stop` ends it by its PID. `SchemaRegistry.url` is the
Confluent-compatible base URL that confluent-kafka's registry client and serializers take.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from lakesink.errors import ConfigError
from lakesink.kafka.broker_process import free_port
from lakesink.kafka.kafka_server import cache_dir, java_binary

__all__ = ["APP_ENV", "CCOMPAT_PATH", "SchemaRegistry", "registry_app_dir"]

APP_ENV = "LAKESINK_REGISTRY_APP"
"""Environment variable naming the folder of the unpacked Apicurio Registry app."""

CCOMPAT_PATH = "/apis/ccompat/v7"

# A registry lives for a test session or a demo, on a 2-core machine: the JIT's first tier and
# the serial collector spend the least CPU starting it; the heap is ample for a few dozen schemas.
JVM_OPTIONS: tuple[str, ...] = (
    "-Xms64m",
    "-Xmx384m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
)


def registry_app_dir() -> Path:
    """The folder of the registry's runner jar; a ConfigError saying how to get it."""
    override = os.environ.get(APP_ENV)
    app = Path(override) if override else cache_dir() / "registry" / "app"
    if not any(app.glob("apicurio-registry-app-*-runner.jar")):
        raise ConfigError(
            f"Apicurio Registry is not in {app}: run scripts/setup-registry.sh (needs Java 17 "
            f"and Maven), or set ${APP_ENV} to a folder that holds its runner jar"
        )
    return app


@dataclass
class SchemaRegistry:
    """One Apicurio Registry process; `start` waits until it answers, `stop` ends it by PID."""

    workdir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    ready: bool = False

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL (schema.registry.url)."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    @property
    def log_file(self) -> Path:
        return self.workdir / "registry.log"

    def start(self, timeout_s: float = 90) -> None:
        self.launch()
        self.wait_ready(timeout_s)

    def launch(self) -> None:
        """Start the process; `wait_ready` waits for it (the session launches it early)."""
        app = registry_app_dir()
        jar = next(app.glob("apicurio-registry-app-*-runner.jar"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    str(java_binary()),
                    *JVM_OPTIONS,
                    f"-Dquarkus.http.port={self.port}",
                    "-Dquarkus.http.host=127.0.0.1",
                    "-Dquarkus.management.host=127.0.0.1",
                    "-Dregistry.rules.global.compatibility=BACKWARD",
                    "-Dquarkus.log.level=WARN",
                    "-jar",
                    str(jar),
                ],
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, timeout_s: float = 90) -> None:
        """Wait until the API answers, then set BACKWARD compatibility (once)."""
        if not self.ready:
            self._wait_answering(timeout_s)
            self._request("PUT", "/config", {"compatibility": "BACKWARD"})
            level = self._request("GET", "/config")
            if not isinstance(level, dict) or level.get("compatibilityLevel") != "BACKWARD":
                raise RuntimeError(f"the registry's compatibility is {level}, not BACKWARD")
            self.ready = True

    def _wait_answering(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        if self.process is None:
            raise RuntimeError("Apicurio Registry was not launched (or was stopped)")
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"Apicurio Registry exited with {self.process.returncode}: "
                    f"{self.log_file.read_text(errors='replace')[-3000:]}"
                )
            with contextlib.suppress(OSError, ValueError):
                if isinstance(self._request("GET", "/subjects"), list):
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"Apicurio Registry did not answer within {timeout_s:.0f} s: "
                    f"{self.log_file.read_text(errors='replace')[-3000:]}"
                )
            time.sleep(0.25)

    def _request(self, method: str, path: str, body: object = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())

    def subjects(self) -> list[str]:
        found = self._request("GET", "/subjects")
        assert isinstance(found, list)
        return sorted(found)

    def stop(self, timeout_s: float = 20) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
