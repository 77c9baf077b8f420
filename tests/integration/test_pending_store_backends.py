"""The pending-commit store on both backends with real processes and a real PostgreSQL.

Scenarios:
- the store contract (idempotent pre-commit, conflicts, order, recovery, prune) on PostgreSQL;
- a process SIGKILLed right after `pre_commit` returned: the row is there (both backends);
- PostgreSQL stopped: a retriable PendingStoreError naming host/port, not the password;
  after the restart nothing is lost and the same store object works again.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from lakesink.engine.pending.factory import make_pending_store
from lakesink.engine.pending.postgres import PostgresPendingCommitStore
from lakesink.engine.pending.store import (
    PendingEntryConflictError,
    PendingStatus,
    PendingStoreUnavailableError,
)
from lakesink.errors import PendingStoreError

if TYPE_CHECKING:
    from pg_fixture import PostgresServer

pytest_plugins = ["pg_fixture"]
pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
W = "writer-1"


@pytest.fixture
def pg_table() -> str:
    return f"pending_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def pg_store(postgres_dsn: str, pg_table: str) -> Iterator[PostgresPendingCommitStore]:
    store = PostgresPendingCommitStore(postgres_dsn, table=pg_table)
    yield store
    store.close()


def test_pg_store_contract(pg_store: PostgresPendingCommitStore) -> None:
    # a fresh table is created on first use
    assert pg_store.count_pending(W) == 0 and pg_store.latest_committed_epoch(W) is None
    for epoch in (3, 1, 2, 4, 5):
        assert pg_store.pre_commit(W, epoch, f"m{epoch}".encode()) is True
    # same content again: a replay, nothing changes
    assert pg_store.pre_commit(W, 1, b"m1") is False
    # other content for a Pending epoch: conflict, not retriable
    with pytest.raises(PendingEntryConflictError, match="epoch 1") as e:
        pg_store.pre_commit(W, 1, b"other")
    assert not e.value.retriable
    assert [x.epoch for x in pg_store.pending(W)] == [1, 2, 3, 4, 5]
    pg_store.mark_committed(W, 1)
    pg_store.mark_committed(W, 1)
    pg_store.mark_committed(W, 2)
    with pytest.raises(PendingEntryConflictError, match="cannot become Aborted"):
        pg_store.mark_aborted(W, 2)
    # recovery: dirty epochs above the committed one are aborted, then replaced on replay
    assert pg_store.abort_pending_above(W, 3) == [4, 5]
    assert pg_store.pre_commit(W, 4, b"replayed") is True
    entry = pg_store.get(W, 4)
    assert entry is not None and entry.status is PendingStatus.PENDING
    assert entry.metadata == b"replayed" and entry.created_at.tzinfo is not None
    with pytest.raises(PendingEntryConflictError, match="cannot become Committed"):
        pg_store.mark_committed(W, 5)
    assert pg_store.count_pending(W) == 2 and pg_store.latest_committed_epoch(W) == 2
    assert pg_store.prune_committed(W, keep_last=1) == 1  # epoch 1 goes
    assert pg_store.get(W, 1) is None and pg_store.get(W, 2) is not None
    assert pg_store.get("other-writer", 2) is None


def test_pg_store_pickles_without_its_connection(pg_store: PostgresPendingCommitStore) -> None:
    pg_store.pre_commit(W, 1, b"m")
    copy = pickle.loads(pickle.dumps(pg_store))
    assert copy._conn is None
    assert copy.get(W, 1) is not None
    copy.close()


WORKER = textwrap.dedent(
    """
    import sys
    from lakesink.engine.pending.factory import make_pending_store

    kind, target, table = sys.argv[1:4]
    store = make_pending_store(kind, path=target, dsn=target, table=table)
    epoch = 0
    while True:
        epoch += 1
        store.pre_commit("w", epoch, b"x" * 1000 + str(epoch).encode())
        print("DONE", epoch, flush=True)
    """
)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_sigkill_right_after_pre_commit_returns_loses_nothing(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, pg_table: str
) -> None:
    target = (
        str(tmp_path / "pending.db")
        if kind == "sqlite"
        else request.getfixturevalue("postgres_dsn")
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, kind, target, pg_table],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        last = 0
        while last < 20:
            line = proc.stdout.readline()
            assert line, f"worker exited with {proc.wait()}"
            last = int(line.split()[1])
        os.kill(proc.pid, signal.SIGKILL)  # right after pre_commit(20) returned
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    store = make_pending_store(kind, path=target, dsn=target, table=pg_table)
    try:
        epochs = [e.epoch for e in store.pending("w")]
        assert epochs[:last] == list(range(1, last + 1))
        entry = store.get("w", last)
        assert entry is not None and entry.metadata.endswith(str(last).encode())
    finally:
        store.close()


def test_pg_stopped_is_retriable_error_and_nothing_is_lost_after_restart(
    postgres_server: PostgresServer, pg_store: PostgresPendingCommitStore
) -> None:
    if postgres_server.external_dsn:
        pytest.skip("needs the fixture's own server to stop and restart it")
    for epoch in range(1, 4):
        pg_store.pre_commit(W, epoch, b"m")
    postgres_server.stop()
    try:
        with pytest.raises(PendingStoreError) as e:
            pg_store.pre_commit(W, 4, b"m")
        assert isinstance(e.value, PendingStoreUnavailableError) and e.value.retriable
        message = str(e.value)
        assert "unreachable" in message and "retriable" in message
        assert f"host=127.0.0.1 port={postgres_server.port}" in message
        assert "password" not in message and postgres_server.password not in message
        with pytest.raises(PendingStoreUnavailableError):
            pg_store.count_pending(W)  # a fresh connection attempt fails the same way
    finally:
        postgres_server.start()
        postgres_server.wait_ready()
    assert [x.epoch for x in pg_store.pending(W)] == [1, 2, 3]
    pg_store.pre_commit(W, 4, b"m")
    assert pg_store.count_pending(W) == 4
