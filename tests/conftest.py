"""Shared fixtures: one Kafka broker for the whole test session, unique topic names.

The broker is Apache Kafka (jars resolved by scripts/setup-kafka.sh) started on loopback for the
session. LAKESINK_TEST_BROKER=noida runs the embedded noida-db broker instead;
LAKESINK_TEST_BOOTSTRAP_SERVERS points the session broker at an external cluster.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable, Iterator

import pytest
from emulators import Azurite, FakeGcs, GcpStorageEmulator
from hypothesis import settings
from s3_server import S3Server

from lakesink.kafka.kafka_server import BROKER_KINDS, LocalBroker, local_broker

BOOTSTRAP_ENV = "LAKESINK_TEST_BOOTSTRAP_SERVERS"
BROKER_ENV = "LAKESINK_TEST_BROKER"

# No per-example deadline in the property tests: a deadline is a timing assertion, and timings
# are measured in benchmarks, never asserted in tests (the oldest pins' unit tests run beside
# the integration tests, at a lower priority, where any example may wait its turn)
settings.register_profile("lakesink", deadline=None)
settings.load_profile("lakesink")

_session_tag = uuid.uuid4().hex[:8]
_topic_counter = itertools.count()


def _broker_kind_from_env() -> str:
    """The kind of local broker the tests start: `kafka` unless $LAKESINK_TEST_BROKER says."""
    kind = os.environ.get(BROKER_ENV, "kafka")
    if kind not in BROKER_KINDS:
        raise pytest.UsageError(f"{BROKER_ENV}={kind!r}: use one of {', '.join(BROKER_KINDS)}")
    return kind


@pytest.fixture(scope="session")
def broker_kind() -> str:
    """`kafka` or `noida`: the kind of the local brokers this session starts."""
    return _broker_kind_from_env()


@pytest.fixture(scope="session")
def kafka_bootstrap(broker_kind: str) -> Iterator[str]:
    """bootstrap.servers of the session's broker (external if $LAKESINK_TEST_BOOTSTRAP_SERVERS)."""
    external = os.environ.get(BOOTSTRAP_ENV)
    if external:
        yield external
        return
    broker = local_broker(broker_kind)
    broker.start()
    try:
        yield broker.bootstrap_servers
    finally:
        broker.close()


@pytest.fixture
def topic_factory(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Makes topic names unique to this session and test: `topic_factory("events")`."""
    test = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60].strip("-")

    def make(prefix: str = "t") -> str:
        return f"{prefix}-{test}-{_session_tag}-{next(_topic_counter)}"

    return make


@pytest.fixture
def fresh_broker(broker_kind: str) -> Iterator[LocalBroker]:
    """A broker of this test's own, for restart and crash tests."""
    broker = local_broker(broker_kind)
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One moto S3 server over HTTP on loopback for the whole test session."""
    server = S3Server(log_dir=tmp_path_factory.mktemp("moto"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """One Azurite (Azure Blob emulator, in memory) on loopback for the whole test session."""
    server = Azurite(tmp_path_factory.mktemp("azurite"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcs]:
    """One fake-gcs-server (in memory) on loopback for the whole test session."""
    server = FakeGcs(tmp_path_factory.mktemp("fake-gcs"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def gcp_storage_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcpStorageEmulator]:
    """One gcp-storage-emulator (in memory) on loopback for the whole test session."""
    server = GcpStorageEmulator(tmp_path_factory.mktemp("gcp-storage-emulator"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket on the session's S3 server."""
    return s3_server.new_bucket()
