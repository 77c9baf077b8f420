"""A real S3 server for tests: moto's standalone server (`moto[server]`) on a free loopback port.

It speaks S3 over HTTP, including conditional writes (`If-None-Match: *`, `If-Match: <etag>`),
so the object-store storage, the lease lock and hudi-rs are tested against a real HTTP endpoint.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

_bucket_counter = itertools.count()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """moto's S3 server as a subprocess: `start()`, `new_bucket()`, `stop()` (by PID)."""

    region = "us-east-1"
    access_key_id = "lakesink-test-key"
    secret_access_key = "lakesink-test-secret"

    def __init__(self, log_dir: Path | None = None, *, authenticate: bool = False) -> None:
        """`authenticate=True` makes moto check every request's credentials (moto's IAM
        mode): unknown access keys are refused with 403, like a real store."""
        self.port = free_port()
        self.host = "127.0.0.1"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_dir = log_dir
        self._tag = uuid.uuid4().hex[:8]
        self._authenticate = authenticate
        self._recording = Path(tempfile.gettempdir()) / f"moto-recording-{self._tag}.jsonl"

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("the S3 server is not running")
        return self._proc.pid

    def start(self, timeout_s: float = 30.0) -> None:
        log = (
            open(self._log_dir / f"moto-{self.port}.log", "ab")  # noqa: SIM115 - owned by Popen
            if self._log_dir is not None
            else subprocess.DEVNULL
        )
        env = dict(os.environ)
        env.setdefault("MOTO_ALLOW_NONEXISTENT_REGION", "true")
        if self._authenticate:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        env["MOTO_RECORDER_FILEPATH"] = str(self._recording)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self._proc.returncode} at start")
            try:
                with urllib.request.urlopen(self.endpoint_url + "/moto-api/", timeout=1):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto server on {self.endpoint_url} did not answer in {timeout_s}s")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def _api(self, path: str, method: str = "POST") -> bytes:
        req = urllib.request.Request(self.endpoint_url + path, method=method)
        with urllib.request.urlopen(req, timeout=10) as r:
            return bytes(r.read())

    def start_recording(self) -> None:
        """Record every S3 request from now on (moto's recorder)."""
        self._api("/moto-api/recorder/reset-recording")
        self._api("/moto-api/recorder/start-recording")

    def stop_recording(self, bucket: str | None = None) -> list[tuple[str, str]]:
        """Stop recording; the (kind, path) of each request recorded, kind one of LIST, GET,
        HEAD, PUT, POST, DELETE; only those of `bucket` when given."""
        self._api("/moto-api/recorder/stop-recording")
        text = self._api("/moto-api/recorder/download-recording", "GET").decode()
        out: list[tuple[str, str]] = []
        for line in text.splitlines():
            if not line.strip():
                continue
            entry = json.loads(line)
            url = urllib.parse.urlsplit(entry["url"])
            if bucket is not None and not url.path.lstrip("/").startswith(bucket):
                continue
            query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
            kind = entry["method"]
            if kind == "GET" and (
                "list-type" in query or "prefix" in query or url.path.rstrip("/").count("/") <= 1
            ):
                kind = "LIST"
            out.append((kind, url.path))
        return out

    def client(self) -> Any:
        """A boto3 S3 client for this server (boto3 comes with moto)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
        )

    def new_bucket(self, prefix: str = "lakesink") -> str:
        """Create a fresh bucket with a valid S3 name (3-63 lower-case characters) and return it."""
        name = f"{prefix}-{self._tag}-{next(_bucket_counter)}".lower()[:63]
        self.client().create_bucket(Bucket=name)
        return name

    def env(self) -> dict[str, str]:
        """AWS environment variables that point the standard credential chain at this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
        }

    def storage_config(self) -> dict[str, Any]:
        """lakesink config keys that point a table at this server."""
        return {
            "storage.s3.endpoint": self.endpoint_url,
            "storage.s3.region": self.region,
            "storage.s3.allow.http": True,
            "storage.s3.access.key.id": self.access_key_id,
            "storage.s3.secret.access.key": self.secret_access_key,
        }

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
