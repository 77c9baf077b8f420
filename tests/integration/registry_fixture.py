"""A real schema registry for the tests: Apicurio Registry on loopback, one per session.

`scripts/setup-registry.sh` unpacks Apicurio Registry 2.6.13.Final (a Quarkus app that runs on
Java 17) into `$LAKESINK_CACHE/registry/app` (override: `$LAKESINK_REGISTRY_APP`). The session
fixture `schema_registry` starts it with in-memory storage on a free loopback port (its HTTP
server, health included, bound to 127.0.0.1), waits until the Confluent-compatible API answers,
sets the global compatibility to BACKWARD (Apicurio's default is NONE) and stops it by its PID at
the session's end. The process itself is `schema_registry_launched`, which the session launches
early (tests/integration/conftest.py) so that the JVM's start overlaps Spark's and the
broker's. Tests use `SchemaRegistry.url`, the Confluent-compatible base URL that confluent-kafka's
registry client and serializers take.

A test module registers it with `pytest_plugins = ["registry_fixture"]`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lakesink.kafka.registry_server import SchemaRegistry


@pytest.fixture(scope="session")
def schema_registry_launched(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SchemaRegistry]:
    """Apicurio Registry's process, launched and not waited for: conftest's `spark_start`
    launches it beside the session's other starts when a test of the session needs it, so its
    JVM start overlaps theirs. Stopped by PID at the session's end."""
    registry = SchemaRegistry(tmp_path_factory.mktemp("schema-registry"))
    registry.launch()
    yield registry
    registry.stop()


@pytest.fixture(scope="session")
def schema_registry(schema_registry_launched: SchemaRegistry) -> SchemaRegistry:
    """Apicurio Registry for the session (in-memory storage, BACKWARD compatibility), answering."""
    schema_registry_launched.wait_ready()
    return schema_registry_launched
