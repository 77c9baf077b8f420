"""Shared fixtures: one Kafka-protocol broker for the whole test session, unique topic names.

Set LAKESINK_TEST_BOOTSTRAP_SERVERS to run the broker tests against an external cluster;
otherwise one embedded noida-db broker is started on loopback for the session.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable, Iterator

import pytest

from lakesink.kafka.embedded_broker import EmbeddedBroker

BOOTSTRAP_ENV = "LAKESINK_TEST_BOOTSTRAP_SERVERS"

_session_tag = uuid.uuid4().hex[:8]
_topic_counter = itertools.count()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """bootstrap.servers of the session's broker (external if $LAKESINK_TEST_BOOTSTRAP_SERVERS)."""
    external = os.environ.get(BOOTSTRAP_ENV)
    if external:
        yield external
        return
    broker = EmbeddedBroker()
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
def fresh_broker() -> Iterator[EmbeddedBroker]:
    """A broker of this test's own, for restart and crash tests."""
    broker = EmbeddedBroker()
    broker.start()
    try:
        yield broker
    finally:
        broker.close()
