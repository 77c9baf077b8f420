"""The table lock across real OS processes: FileLockProvider and PostgresLockProvider.

Scenarios (one comment per case):
- two processes take the lock in turns many times and never overlap;
- a holder killed with SIGKILL: a file lease is taken over only after it expired, a PostgreSQL
  advisory lock is freed as soon as the session dies;
- a holder that stalled past its expiry (SIGSTOP) and was taken over fails `check()`;
- a PostgreSQL session terminated under the holder fails `check()`;
- an unreachable PostgreSQL is a clear, retriable LockError without the password.
The lease-lock cases run on a local table and on an S3 table (moto over HTTP: conditional
creates and If-Match renewals).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from integration.table_stores import STORES
from s3_server import S3Server

from lakesink.errors import LockError
from lakesink.formats.hudi.concurrency.lock import LOCK_DIR, FileLockProvider
from lakesink.formats.hudi.concurrency.pg_lock import PostgresLockProvider
from lakesink.storage import Storage, open_storage

pytest_plugins = ["pg_fixture"]
pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent(
    """
    import os, sys, time
    from lakesink.formats.hudi.concurrency.lock import FileLockProvider
    from lakesink.formats.hudi.concurrency.pg_lock import PostgresLockProvider
    from lakesink.config import table_storage_at

    kind, target, name, mode = sys.argv[1:5]
    lease_s = float(sys.argv[5])

    def make():
        if kind == "file":
            return FileLockProvider(
                table_storage_at(target), name, lease_s=lease_s, poll_s=0.005
            )
        return PostgresLockProvider(target, "table-x", name, poll_s=0.005)

    p = make()
    if mode == "rounds":
        log_path, rounds = sys.argv[6], int(sys.argv[7])
        for _ in range(rounds):
            lease = p.acquire(timeout_s=60)
            lease.check()
            with open(log_path, "a") as f:
                f.write(f"{name} enter {getattr(lease, 'seq', 0)}\\n")
                f.flush()
                time.sleep(0.002)
                f.write(f"{name} exit\\n")
                f.flush()
            lease.check()
            p.release(lease)
        print("DONE", flush=True)
    else:  # hold: take the lock, report, then check on every line read from stdin
        lease = p.acquire(timeout_s=30)
        print("HELD", getattr(lease, "seq", 0), lease.expires_at, flush=True)
        for line in sys.stdin:
            try:
                lease.check()
                print("VALID", flush=True)
            except Exception as e:
                print("LOST", type(e).__name__, e, flush=True)
    """
)


def spawn(*args: object, env_extra: dict[str, str] | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})}
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.wait(timeout=10)
        for stream in (p.stdin, p.stdout):
            if stream is not None:
                stream.close()


def assert_no_interleaving(log: Path, names: list[str], rounds: int) -> list[str]:
    lines = log.read_text().splitlines()
    assert len(lines) == 2 * rounds * len(names)
    enters = []
    for i in range(0, len(lines), 2):
        who, what, *rest = lines[i].split()
        assert what == "enter", f"line {i}: {lines[i]!r}"
        assert lines[i + 1] == f"{who} exit", f"interleaved at line {i}: {lines[i : i + 2]}"
        enters.append(rest[0] if rest else "")
    return enters


def read_line(p: subprocess.Popen[str]) -> str:
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line, f"worker {p.pid} exited with {p.wait()}"
    return line.strip()


def ask(p: subprocess.Popen[str]) -> str:
    assert p.stdin is not None
    p.stdin.write("check\n")
    p.stdin.flush()
    return read_line(p)


# --- lease lock on the table's storage (local file system or S3) ------------------------------


@dataclass(frozen=True)
class LockTable:
    """A table root for the lease lock: `target` for the worker processes (with `env`),
    `storage` for this process."""

    target: str
    env: dict[str, str]
    storage: Storage


@pytest.fixture(params=STORES)
def lock_table(request: pytest.FixtureRequest, tmp_path: Path) -> LockTable:
    if request.param == "local":
        path = str(tmp_path / "table")
        return LockTable(path, {}, open_storage(path))
    server: S3Server = request.getfixturevalue("s3_server")
    uri = f"s3://{server.new_bucket()}/table"
    settings = server.storage_config()
    env = {
        "LAKESINK_" + k.upper().replace(".", "_"): str(v).lower() if isinstance(v, bool) else v
        for k, v in settings.items()
    }
    return LockTable(uri, env, open_storage(uri, settings))


def test_file_lock_two_processes_never_overlap_over_many_rounds(
    tmp_path: Path, procs: list[subprocess.Popen[str]], lock_table: LockTable
) -> None:
    log, rounds = tmp_path / "log.txt", 40 if lock_table.storage.is_local else 12
    for name in ("a", "b"):
        procs.append(
            spawn(
                "file",
                lock_table.target,
                name,
                "rounds",
                10,
                log,
                rounds,
                env_extra=lock_table.env,
            )
        )
    for p in procs:
        assert read_line(p) == "DONE"
    seqs = assert_no_interleaving(log, ["a", "b"], rounds)
    assert sorted(map(int, seqs)) == list(range(1, 2 * rounds + 1))  # one lease per holding


def test_file_lock_of_killed_holder_is_taken_over_only_after_expiry(
    procs: list[subprocess.Popen[str]], lock_table: LockTable
) -> None:
    holder = spawn("file", lock_table.target, "victim", "hold", 3, env_extra=lock_table.env)
    procs.append(holder)
    seq = int(read_line(holder).split()[1])
    me = FileLockProvider(lock_table.storage, "survivor", lease_s=5)
    assert me.try_acquire() is None
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=10)
    expiry = me.lease_expiry(seq)
    assert expiry is not None and time.time() < expiry
    assert me.try_acquire() is None  # dead, but its lease has not run out yet
    lease = me.acquire(timeout_s=10)
    assert time.time() >= expiry
    assert lease.seq == seq + 1
    lease.check()
    me.release(lease)


def test_file_lock_holder_stalled_past_expiry_fails_check_after_takeover(
    procs: list[subprocess.Popen[str]], lock_table: LockTable
) -> None:
    holder = spawn("file", lock_table.target, "zombie", "hold", 1.0, env_extra=lock_table.env)
    procs.append(holder)
    read_line(holder)
    assert ask(holder) == "VALID"
    os.kill(holder.pid, signal.SIGSTOP)  # a long GC pause: no renewals
    me = FileLockProvider(lock_table.storage, "successor", lease_s=5)
    lease = me.acquire(timeout_s=10)
    os.kill(holder.pid, signal.SIGCONT)
    answer = ask(holder)
    assert answer.startswith("LOST LockError"), answer
    lease.check()
    me.release(lease)


def test_file_lock_expired_holder_in_process_check_raises(lock_table: LockTable) -> None:
    holder = FileLockProvider(lock_table.storage, "slow", lease_s=0.3, auto_renew=False)
    lease = holder.acquire(timeout_s=1)
    other = FileLockProvider(lock_table.storage, "fast", lease_s=5)
    taken = other.acquire(timeout_s=5)
    with pytest.raises(LockError, match="lost"):
        lease.check()
    other.release(taken)


def test_file_lock_contenders_racing_for_one_lease_exactly_one_wins(lock_table: LockTable) -> None:
    contenders = [
        FileLockProvider(lock_table.storage, f"c{i}", lease_s=5, auto_renew=False) for i in range(4)
    ]
    barrier = threading.Barrier(len(contenders))
    won: list[object] = []

    def contend(p: FileLockProvider) -> None:
        barrier.wait()
        lease = p.try_acquire()
        if lease is not None:
            won.append(lease)

    threads = [threading.Thread(target=contend, args=(p,)) for p in contenders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1


def test_file_lock_renewal_over_a_renewal_it_did_not_write_is_refused(
    lock_table: LockTable,
) -> None:
    p = FileLockProvider(lock_table.storage, "holder", lease_s=5, auto_renew=False)
    lease = p.acquire(timeout_s=1)
    lease.renew()  # creates <seq>.renewed; the next renewal replaces it only if unchanged
    lock_table.storage.write(
        f"{LOCK_DIR}/{lease.seq:012d}.renewed", b'{"token": "someone else", "until": 0}'
    )
    with pytest.raises(LockError, match="changed by someone else"):
        lease.renew()


# --- PostgreSQL advisory lock ----------------------------------------------------------------


def test_pg_lock_two_processes_never_overlap_over_many_rounds(
    tmp_path: Path, postgres_dsn: str, procs: list[subprocess.Popen[str]]
) -> None:
    log, rounds = tmp_path / "log.txt", 30
    for name in ("a", "b"):
        procs.append(spawn("pg", postgres_dsn, name, "rounds", 0, log, rounds))
    for p in procs:
        assert read_line(p) == "DONE"
    assert_no_interleaving(log, ["a", "b"], rounds)


def test_pg_lock_of_killed_holder_is_freed_when_its_session_dies(
    postgres_dsn: str, procs: list[subprocess.Popen[str]]
) -> None:
    holder = spawn("pg", postgres_dsn, "victim", "hold", 0)
    procs.append(holder)
    read_line(holder)
    me = PostgresLockProvider(postgres_dsn, "table-x", "survivor")
    with pytest.raises(LockError, match="lakesink-lock:victim"):
        me.acquire(timeout_s=0.2)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=10)
    start = time.monotonic()
    lease = me.acquire(timeout_s=10)
    assert time.monotonic() - start < 5
    lease.check()
    me.release(lease)


def test_pg_lock_terminated_session_fails_check(postgres_dsn: str) -> None:
    import psycopg

    p = PostgresLockProvider(postgres_dsn, "table-y", "holder")
    lease = p.acquire(timeout_s=5)
    assert lease._conn is not None
    pid = lease._conn.info.backend_pid
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(LockError, match="is lost"):
        lease.check()
    assert not lease.is_valid()
    other = PostgresLockProvider(postgres_dsn, "table-y", "next").acquire(timeout_s=5)
    other.check()
    p.release(lease)


def test_pg_lock_unreachable_server_is_retriable_lock_error_without_password() -> None:
    from pg_fixture import free_port

    port = free_port()
    dsn = f"host=127.0.0.1 port={port} user=u password=hunter2 dbname=d"
    p = PostgresLockProvider(dsn, "t", "w", connect_timeout_s=2)
    with pytest.raises(LockError, match=f"port={port}") as e:
        p.acquire(timeout_s=1)
    assert e.value.retriable and "unreachable" in str(e.value)
    assert "hunter2" not in str(e.value)
