"""A fault-injecting HTTP proxy for a test S3 server.

`FaultProxy(upstream)` listens on a free loopback port and forwards every request to the S3
server at `upstream` (moto's server in the tests), unchanged and with keep-alive. Rules
injected with `inject(...)` make the next N requests that match a method and a path pattern
fail the way a real store fails:

- `Error(503, "SlowDown")`, `Error(500, "InternalError")`: an S3 error document, the request
  never reaches the server;
- `Drop()`: the connection is closed with no response (a reset mid-request); with
  `after_forward=True` the server has already applied the request and only its response is lost
  (the case a conditional publish must recognise as its own);
- `Delay(seconds)`: the request is held, then forwarded (past the client's timeout, the client
  has given up and retries while the first attempt may still land).

Every request is logged with its S3 operation (LIST, GET, HEAD, PUT, POST, DELETE) and status,
so tests and the storage benchmark can count requests per commit.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

# headers that belong to one hop, never forwarded
_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "expect",
}


@dataclass(frozen=True, slots=True)
class Error:
    """Answer with an S3 error document and this status; the server never sees the request."""

    status: int
    code: str
    message: str = "injected by the test's fault proxy"


@dataclass(frozen=True, slots=True)
class Drop:
    """Close the connection without a response; after_forward: once the server applied it."""

    after_forward: bool = False


@dataclass(frozen=True, slots=True)
class Delay:
    """Hold the request this many seconds, then forward it."""

    seconds: float


Action = Error | Drop | Delay


@dataclass(slots=True)
class Rule:
    """Apply `action` to the next `times` requests matching `method` and `path` (a regular
    expression searched in the path and query), after letting `skip` matching ones through."""

    action: Action
    method: str | None = None
    path: str | None = None
    times: int = 1
    skip: int = 0
    fired: int = 0

    def matches(self, method: str, target: str) -> bool:
        if self.method is not None and self.method != method:
            return False
        return self.path is None or re.search(self.path, target) is not None

    @property
    def spent(self) -> bool:
        return self.fired >= self.times


@dataclass(frozen=True, slots=True)
class Request:
    """One request the proxy saw: its S3 operation, method, target, status and fault."""

    op: str
    method: str
    target: str
    status: int | None
    fault: str | None
    seconds: float


def s3_operation(method: str, target: str) -> str:
    """LIST for a listing (a GET on a bucket: ListObjects, ListObjectsV2, or uploads), else
    the method (GET, HEAD, PUT, POST, DELETE) of an object request."""
    parts = urlsplit(target)
    if method == "GET":
        query = parse_qs(parts.query, keep_blank_values=True)
        key = parts.path.lstrip("/").partition("/")[2]
        if not key or "list-type" in query or "uploads" in query:
            return "LIST"
    return method


@dataclass
class _State:
    rules: list[Rule] = field(default_factory=list)
    log: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class FaultProxy:
    """The proxy: `start()`, `endpoint_url`, `inject(...)`, `counts()`, `stop()`."""

    def __init__(self, upstream: str, upstream_timeout_s: float = 60.0) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port
        self.upstream_timeout_s = upstream_timeout_s
        self.state = _State()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the fault proxy is not running")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        handler = type("_BoundHandler", (_Handler,), {"proxy": self})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def inject(
        self,
        action: Action,
        *,
        method: str | None = None,
        path: str | None = None,
        times: int = 1,
        skip: int = 0,
    ) -> Rule:
        """Fail the next `times` matching requests with `action` (after `skip` matching ones)."""
        rule = Rule(action, method, path, times, skip)
        with self.state.lock:
            self.state.rules.append(rule)
        return rule

    def clear(self) -> None:
        """Remove every rule; later requests are forwarded unchanged."""
        with self.state.lock:
            self.state.rules.clear()

    def _take(self, method: str, target: str) -> Action | None:
        with self.state.lock:
            for rule in self.state.rules:
                if rule.spent or not rule.matches(method, target):
                    continue
                if rule.skip > 0:
                    rule.skip -= 1
                    continue
                rule.fired += 1
                return rule.action
        return None

    def _record(self, request: Request) -> None:
        with self.state.lock:
            self.state.log.append(request)

    @property
    def requests(self) -> list[Request]:
        with self.state.lock:
            return list(self.state.log)

    def counts(self, since: int = 0) -> Counter[str]:
        """Requests by S3 operation (LIST, GET, HEAD, PUT, POST, DELETE) from log index `since`."""
        with self.state.lock:
            return Counter(r.op for r in self.state.log[since:])

    def faults_fired(self) -> int:
        with self.state.lock:
            return sum(1 for r in self.state.log if r.fault is not None)

    @contextlib.contextmanager
    def counting(self) -> Iterator[Counter[str]]:
        """`with proxy.counting() as c:` fills `c` with the requests made inside the block."""
        out: Counter[str] = Counter()
        with self.state.lock:
            start = len(self.state.log)
        try:
            yield out
        finally:
            out.update(self.counts(start))


class _Handler(BaseHTTPRequestHandler):
    proxy: FaultProxy
    protocol_version = "HTTP/1.1"
    _upstream: http.client.HTTPConnection | None = None

    def log_message(self, format: str, *args: object) -> None:
        pass  # the proxy keeps its own log; nothing on stderr

    def do_GET(self) -> None:
        self._handle()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        start = time.monotonic()
        method, target = self.command, self.path
        body = self._body()
        action = self.proxy._take(method, target)
        fault = type(action).__name__ if action is not None else None

        def record(status: int | None) -> None:  # before the client sees the answer
            took = time.monotonic() - start
            op = s3_operation(method, target)
            self.proxy._record(Request(op, method, target, status, fault, took))

        try:
            if isinstance(action, Error):
                record(action.status)
                self._send_error(action)
            elif isinstance(action, Drop):
                if action.after_forward:
                    self._forward(method, target, body)
                record(None)
                self._drop()
            else:
                if isinstance(action, Delay):
                    time.sleep(action.seconds)
                resp, data = self._forward(method, target, body)
                record(resp.status)
                self._relay(resp, data)
        except (OSError, http.client.HTTPException):
            self.close_connection = True  # the client went away (it timed out) or upstream did

    def _send_error(self, error: Error) -> None:
        doc = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{error.code}</Code><Message>{error.message}</Message>"
            f"<Resource>{self.path}</Resource><RequestId>fault-proxy</RequestId></Error>"
        ).encode()
        self.send_response(error.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(doc) if self.command != "HEAD" else 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(doc)

    def _drop(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _forward(
        self, method: str, target: str, body: bytes
    ) -> tuple[http.client.HTTPResponse, bytes]:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        if body or method in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        for attempt in (0, 1):  # a kept-alive upstream connection may have been closed
            conn = self._upstream
            if conn is None:
                conn = http.client.HTTPConnection(
                    self.proxy.upstream_host,
                    self.proxy.upstream_port,
                    timeout=self.proxy.upstream_timeout_s,
                )
                self._upstream = conn
            try:
                conn.request(method, target, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                if resp.will_close:
                    conn.close()
                    self._upstream = None
                return resp, data
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                conn.close()
                self._upstream = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _relay(self, resp: http.client.HTTPResponse, data: bytes) -> None:
        self.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP and k.lower() not in ("content-length", "server", "date"):
                self.send_header(k, v)
        if self.command == "HEAD":
            self.send_header("Content-Length", resp.getheader("Content-Length") or "0")
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.wfile.flush()

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        if self._upstream is not None:
            self._upstream.close()
            self._upstream = None
