"""Thin typed helpers over confluent_kafka: topics, partitions, watermarks, offsets for times.

Everything uses explicit partitions (`assign()`-style requests), never a consumer group:
confluent-kafka wants a `group.id` string even then, so a fixed dummy is set and auto commit is off.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal

from lakesink.errors import ConfigError, KafkaAuthorizationError, KafkaError
from lakesink.kafka.security import ClientErrors, new_client, not_authorized, one_line
from lakesink.protocol.offsets import TopicPartition

log = logging.getLogger(__name__)

IsolationLevel = Literal["read_committed", "read_uncommitted"]
ISOLATION_LEVELS: tuple[IsolationLevel, ...] = ("read_committed", "read_uncommitted")

DUMMY_GROUP_ID = "lakesink-assign-only"
"""confluent-kafka requires a group.id even with assign(); lakesink never joins or commits it."""

RECEIVE_MESSAGE_MAX_BYTES = 1_000_000_000
"""Some brokers (noida-db) ignore fetch size limits; allow large fetch responses."""


def check_isolation_level(isolation_level: str) -> IsolationLevel:
    if isolation_level not in ISOLATION_LEVELS:
        raise ConfigError(
            f"isolation level {isolation_level!r} is not valid; "
            f"use one of {', '.join(ISOLATION_LEVELS)}"
        )
    return isolation_level


def consumer_config(
    bootstrap: str,
    isolation_level: str = "read_committed",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The consumer configuration lakesink uses: assign-only, no commits, errors on lost offsets.

    `extra` (e.g. `KafkaSettings.consumer_config`) may hold security settings and Secrets;
    `lakesink.kafka.security.client_config` reveals them when the consumer is created."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": DUMMY_GROUP_ID,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "isolation.level": check_isolation_level(isolation_level),
        "receive.message.max.bytes": RECEIVE_MESSAGE_MAX_BYTES,
        "enable.partition.eof": True,
    }
    if extra:
        config.update(extra)
    if config.get("bootstrap.servers") != bootstrap:
        config["bootstrap.servers"] = bootstrap
    return config


def _ck_tp(tp: TopicPartition, offset: int | None = None) -> Any:
    from confluent_kafka import TopicPartition as CkTopicPartition

    if offset is None:
        return CkTopicPartition(tp.topic, tp.partition)
    return CkTopicPartition(tp.topic, tp.partition, offset)


def create_topic(
    bootstrap: str,
    topic: str,
    partitions: int,
    replication: int = 1,
    *,
    config: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
    timeout_s: float = 30.0,
) -> bool:
    """Create `topic` if it does not exist. Returns True if this call created it.

    An existing topic with another partition count is left as it is (a warning is logged).
    `extra`: client settings (security) of the admin client."""
    from confluent_kafka import KafkaError as CkKafkaError
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    if partitions <= 0:
        raise ConfigError(f"a topic needs at least one partition, got {partitions} for {topic!r}")
    admin_config = {**(extra or {}), "bootstrap.servers": bootstrap}
    errors = ClientErrors(bootstrap, admin_config)
    admin = new_client(AdminClient, admin_config, errors)
    new = NewTopic(topic, partitions, replication, config=dict(config or {}))
    futures = admin.create_topics([new], operation_timeout=timeout_s, request_timeout=timeout_s)
    created = True
    try:
        futures[topic].result(timeout=timeout_s)
    except KafkaException as e:
        err = e.args[0] if e.args else None
        if not (isinstance(err, CkKafkaError) and err.code() == CkKafkaError.TOPIC_ALREADY_EXISTS):
            admin.poll(0)
            errors.raise_failure()
            raise KafkaError(f"cannot create topic {topic!r} on {bootstrap}: {e}") from e
        created = False
    except Exception as e:
        admin.poll(0)
        errors.raise_failure()
        raise KafkaError(f"cannot create topic {topic!r} on {bootstrap}: {e}") from e
    # wait until the metadata shows it, so that producers and planners see every partition
    existing = _await_partition_count(admin, topic, timeout_s)
    if not created and existing != partitions:
        log.warning(
            "topic %r already exists with %d partitions (asked for %d)", topic, existing, partitions
        )
    return created


class Admin:
    """One AdminClient with its error callback, for many requests (a driver's planning)."""

    def __init__(self, bootstrap: str, extra: Mapping[str, Any] | None = None) -> None:
        from confluent_kafka.admin import AdminClient

        config = {**(extra or {}), "bootstrap.servers": bootstrap}
        self.bootstrap = bootstrap
        self.errors = ClientErrors(bootstrap, config)
        self.client: Any = new_client(AdminClient, config, self.errors)


def _await_partition_count(admin: Any, topic: str, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        md = admin.list_topics(timeout=timeout_s)
        t = md.topics.get(topic)
        if t is not None and t.error is None and t.partitions:
            return len(t.partitions)
        if time.monotonic() > deadline:
            raise KafkaError(
                f"topic {topic!r} is not visible in the metadata after {timeout_s:.0f} s"
            )
        time.sleep(0.05)


def list_partitions(
    bootstrap: str,
    topics: Sequence[str] | None = None,
    *,
    pattern: str | None = None,
    wait_timeout_s: float | None = None,
    timeout_s: float = 10.0,
    extra: Mapping[str, Any] | None = None,
    unavailable_s: float = 0.0,
    admin: Admin | None = None,
) -> list[TopicPartition]:
    """All partitions of `topics`, or of every topic whose full name matches the regex `pattern`
    (internal topics starting with `__` excluded), sorted.

    A listed topic that does not exist raises KafkaError naming it, unless `wait_timeout_s` is
    given: then this waits that long for it to appear. A broker that cannot be reached is asked
    again for up to `unavailable_s` (a restart). Never creates topics (the metadata request
    asks for all topics, so brokers with auto-create do not create the asked-for ones).

    `extra`: client settings (security). A broker that refuses the client (authentication,
    TLS) raises KafkaAuthenticationError at once; listed topics hidden by ACLs raise
    KafkaAuthorizationError. `admin`: a client to reuse (else one is made for this call)."""
    topics = list(topics) if topics else None
    pattern = pattern or None
    if (topics is None) == (pattern is None):
        raise ConfigError("give exactly one of topics (a list of names) or pattern (a regex)")
    regex = None
    if pattern is not None:
        try:
            regex = re.compile(pattern)
        except re.error as e:
            raise ConfigError(f"topic pattern {pattern!r} is not a valid regex: {e}") from e
    handle = admin or Admin(bootstrap, extra)
    errors = handle.errors
    deadline = time.monotonic() + (wait_timeout_s or 0.0)
    reachable_by = time.monotonic() + unavailable_s
    while True:
        try:
            md = _metadata(handle.client, errors, timeout_s)
        except KafkaError as e:
            cause = e.__cause__
            if (
                isinstance(cause, Exception)
                and _broker_unavailable(cause)
                and time.monotonic() < reachable_by
            ):
                log.info("broker %s unavailable (%s); asking again", bootstrap, cause)
                time.sleep(0.5)
                continue
            raise
        found: dict[str, int] = {
            name: len(t.partitions)
            for name, t in md.topics.items()
            if t.error is None and t.partitions
        }
        if regex is not None:
            names = sorted(n for n in found if not n.startswith("__") and regex.fullmatch(n))
            missing: list[str] = []
        else:
            assert topics is not None
            names = sorted(set(topics))
            missing = [n for n in names if n not in found]
        if not missing:
            return [TopicPartition(n, p) for n in names for p in range(found[n])]
        if wait_timeout_s is None or time.monotonic() > deadline:
            hidden = _unauthorized_topics(handle.client, missing, timeout_s)
            if hidden:
                raise not_authorized(bootstrap, errors.principal, hidden, "DESCRIBE and READ")
            raise KafkaError(
                f"topic(s) {', '.join(repr(m) for m in missing)} do not exist on {bootstrap}"
                + (f" (waited {wait_timeout_s:.0f} s)" if wait_timeout_s else "")
                + "; create them or fix the topic names"
            )
        time.sleep(0.2)


def _metadata(admin: Any, errors: ClientErrors, timeout_s: float) -> Any:
    """All topics' metadata; a broker refusing the client fails within about a second."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return admin.list_topics(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
        except Exception as e:
            admin.poll(0)  # serves the error callback
            errors.raise_failure()
            if time.monotonic() >= deadline:
                err = e.args[0] if e.args else e
                reason = one_line(err.str() if hasattr(err, "str") else str(err))
                raise KafkaError(
                    f"cannot list topics on {errors.bootstrap} (kafka.bootstrap.servers) within "
                    f"{timeout_s:.0f} s: {reason}"
                    + (f" (last error: {errors.last})" if errors.last else "")
                ) from e


def _unauthorized_topics(admin: Any, topics: Sequence[str], timeout_s: float) -> list[str]:
    """Those of `topics` the broker says this principal may not describe (ACLs hide such
    topics from a listing of all topics). Unknown when the broker cannot say: none then."""
    from confluent_kafka import KafkaError as CkKafkaError
    from confluent_kafka import TopicCollection

    try:
        futures = admin.describe_topics(TopicCollection(list(topics)), request_timeout=timeout_s)
    except Exception:
        return []
    out = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
        except Exception as e:
            err = e.args[0] if e.args else None
            if (
                isinstance(err, CkKafkaError)
                and err.code() == CkKafkaError.TOPIC_AUTHORIZATION_FAILED
            ):
                out.append(name)
    return sorted(out)


def check_topic_access(
    bootstrap: str,
    topics: Sequence[str],
    operations: Sequence[str],
    *,
    purpose: str,
    extra: Mapping[str, Any] | None = None,
    timeout_s: float = 10.0,
) -> None:
    """Raise KafkaAuthorizationError when the broker's ACLs deny this principal one of
    `operations` (ACL operation names: READ, WRITE, ...) on one of `topics`, naming what to
    grant. Topics that do not exist, and brokers that do not report authorized operations,
    pass: the requests themselves will fail then."""
    from confluent_kafka import KafkaError as CkKafkaError
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AdminClient

    if not topics:
        return
    admin_config = {**(extra or {}), "bootstrap.servers": bootstrap}
    errors = ClientErrors(bootstrap, admin_config)
    admin = new_client(AdminClient, admin_config, errors)
    try:
        futures = admin.describe_topics(
            TopicCollection(sorted(set(topics))),
            include_authorized_operations=True,
            request_timeout=timeout_s,
        )
    except Exception as e:
        log.debug("cannot ask %s for the operations allowed on %s: %s", bootstrap, topics, e)
        return
    for name, future in sorted(futures.items()):
        try:
            description = future.result(timeout=timeout_s)
        except Exception as e:
            err = e.args[0] if e.args else None
            code = err.code() if isinstance(err, CkKafkaError) else None
            if code == CkKafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise not_authorized(
                    bootstrap, errors.principal, [name], "DESCRIBE and " + " and ".join(operations)
                ) from None
            admin.poll(0)
            errors.raise_failure()
            log.debug("cannot describe topic %r on %s: %s", name, bootstrap, e)
            continue
        allowed = description.authorized_operations
        if allowed is None:
            continue
        names = {getattr(op, "name", str(op)) for op in allowed}
        missing = [op for op in operations if op not in names and "ALL" not in names]
        if missing:
            raise KafkaAuthorizationError(
                f"principal {errors.principal} may not {' or '.join(missing)} topic {name!r} on "
                f"Kafka broker {bootstrap} ({purpose}): grant it {' and '.join(missing)} ACLs "
                "on it"
            )


NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"
"""The all-zero topic id: what a broker that keeps no topic ids answers."""


def topic_ids(
    bootstrap: str,
    topics: Iterable[str],
    *,
    extra: Mapping[str, Any] | None = None,
    timeout_s: float = 10.0,
    admin: Admin | None = None,
) -> dict[str, str]:
    """Kafka's id of each topic. A topic gets a new id each time it is created, so a topic deleted
    and re-created under the same name has another id. Topics without an id (brokers that keep
    none) or not found are left out. `extra`: client settings (security); `admin`: a client to
    reuse (else one is made for this call)."""
    from confluent_kafka import TopicCollection

    names = sorted(set(topics))
    if not names:
        return {}
    client = (admin or Admin(bootstrap, extra)).client
    try:
        futures = client.describe_topics(TopicCollection(names), request_timeout=timeout_s)
    except Exception as e:
        raise KafkaError(f"cannot describe topics {names} on {bootstrap}: {e}") from e
    out: dict[str, str] = {}
    for name, future in futures.items():
        try:
            tid = str(future.result(timeout_s).topic_id)
        except Exception as e:
            log.debug("no topic id for %r on %s: %s", name, bootstrap, e)
            continue
        if tid and tid != NO_TOPIC_ID:
            out[name] = tid
    return out


class TopicIds:
    """Topic ids looked up once per topic (a driver's view for the length of one query)."""

    def __init__(self, bootstrap: str, extra: Mapping[str, Any] | None = None) -> None:
        self.bootstrap = bootstrap
        self.extra = dict(extra or {})
        self._known: dict[str, str] = {}
        self._asked: set[str] = set()

    def __call__(self, topics: Iterable[str]) -> dict[str, str]:
        wanted = set(topics)
        new = wanted - self._asked
        if new:
            try:
                self._known.update(topic_ids(self.bootstrap, new, extra=self.extra))
            except KafkaError as e:  # recorded with a later commit then
                log.warning("cannot look up topic ids on %s: %s", self.bootstrap, e)
                return {t: self._known[t] for t in sorted(wanted) if t in self._known}
            self._asked |= new
        return {t: self._known[t] for t in sorted(wanted) if t in self._known}


def _broker_unavailable(e: Exception) -> bool:
    """Whether a confluent-kafka error says the broker (or the partition's leader) is not
    reachable right now: worth asking again, unlike a missing topic."""
    from confluent_kafka import KafkaError as CkError

    err = e.args[0] if e.args else None
    if not isinstance(err, CkError):
        return False
    return err.code() in (
        CkError._TRANSPORT,
        CkError._ALL_BROKERS_DOWN,
        CkError._TIMED_OUT,
        CkError._RESOLVE,
        CkError.REQUEST_TIMED_OUT,
        CkError.LEADER_NOT_AVAILABLE,
        CkError.NOT_LEADER_FOR_PARTITION,
        CkError.BROKER_NOT_AVAILABLE,
    )


def _leader_unknown(e: Exception) -> bool:
    """Whether a confluent-kafka error is librdkafka's "Unknown partition" (no leader known for
    it): a partition that does not exist, or the broker that leads it is down. Ask the broker
    which (`OffsetClient._may_exist`)."""
    from confluent_kafka import KafkaError as CkError

    err = e.args[0] if e.args else None
    return isinstance(err, CkError) and err.code() == CkError._UNKNOWN_PARTITION


class OffsetClient:
    """A consumer that never joins a group, used on the driver to query offsets.

    Reuse one across batches (it keeps its connections); close it when done."""

    def __init__(
        self,
        bootstrap: str,
        isolation_level: str = "read_committed",
        *,
        extra: Mapping[str, Any] | None = None,
        timeout_s: float = 10.0,
        unavailable_s: float = 0.0,
    ) -> None:
        from confluent_kafka import Consumer

        self.bootstrap = bootstrap
        self.isolation_level = check_isolation_level(isolation_level)
        self.timeout_s = timeout_s
        self.unavailable_s = unavailable_s  # how long to ride out a broker that is down
        config = consumer_config(bootstrap, self.isolation_level, extra)
        self.errors = ClientErrors(bootstrap, config)
        self._consumer = new_client(Consumer, config, self.errors)

    def _failed(self) -> None:
        """After a failed request: raise the broker's refusal if that is why."""
        self._consumer.poll(0)  # serves the error callback
        self.errors.raise_failure()

    def watermarks(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, int]]:
        """(low, high) per partition: the log start and, under read_committed, the last stable
        offset (the high watermark otherwise)."""
        return {tp: self._watermarks_of(tp) for tp in partitions}

    def _watermarks_of(self, tp: TopicPartition) -> tuple[int, int]:
        """One partition's watermarks, asking again while the broker is unavailable (a restart)
        for up to `unavailable_s`."""
        deadline = time.monotonic() + self.unavailable_s
        while True:
            try:
                low, high = self._consumer.get_watermark_offsets(
                    _ck_tp(tp), timeout=self.timeout_s, cached=False
                )
                return int(low), int(high)
            except Exception as e:
                if time.monotonic() < deadline and (
                    _broker_unavailable(e) or (_leader_unknown(e) and self._may_exist(tp))
                ):
                    log.info("broker %s unavailable (%s); asking again", self.bootstrap, e)
                    time.sleep(0.5)
                    continue
                self._failed()
                raise KafkaError(
                    f"cannot read the watermarks of {tp} on {self.bootstrap}: {e} "
                    "(does the topic and partition exist?)"
                ) from e

    def _may_exist(self, tp: TopicPartition) -> bool:
        """After librdkafka's "Unknown partition": False only when the broker answers that `tp`
        does not exist. librdkafka says "Unknown partition" both for a partition that does not
        exist and for one whose leader it lost with the broker's connection (a broker restart,
        the moment it is killed); a broker that cannot be asked is the second case."""
        try:
            md = self._consumer.list_topics(timeout=min(self.timeout_s, 5.0))
        except Exception:
            self._failed()  # a broker that refuses this client: not a restart
            return True
        topic = md.topics.get(tp.topic)
        return topic is not None and tp.partition in topic.partitions

    def offsets_for_times(
        self, timestamps_ms: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int | None]:
        """The first offset whose timestamp is >= the given one, per partition; None when no
        record is that recent (start at the high watermark then)."""
        if not timestamps_ms:
            return {}
        query = [_ck_tp(tp, int(ts)) for tp, ts in timestamps_ms.items()]
        try:
            result = self._consumer.offsets_for_times(query, timeout=self.timeout_s)
        except Exception as e:
            self._failed()
            raise KafkaError(f"offsets_for_times failed on {self.bootstrap}: {e}") from e
        out: dict[TopicPartition, int | None] = {}
        for r in result:
            tp = TopicPartition(r.topic, r.partition)
            if r.error is not None:
                raise KafkaError(
                    f"offsets_for_times failed for {tp} on {self.bootstrap}: {r.error}"
                )
            out[tp] = int(r.offset) if r.offset >= 0 else None
        return out

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> OffsetClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class PlanningClients:
    """The Kafka clients a streaming query's driver plans its batches with: one Admin (partitions,
    topic ids) and one OffsetClient (watermarks, offsets for times), each made on first use and
    kept for the next batches; every request still asks the broker, so offsets are planned as
    with new clients. `reset()` after a failed request (a refused or failed client is not
    reused: the next request makes new ones), `close()` when the query stops."""

    def __init__(
        self,
        bootstrap: str,
        *,
        isolation_level: str,
        admin_extra: Mapping[str, Any] | None = None,
        consumer_extra: Mapping[str, Any] | None = None,
        unavailable_s: float = 0.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.isolation_level = check_isolation_level(isolation_level)
        self.admin_extra = dict(admin_extra or {})
        self.consumer_extra = dict(consumer_extra or {})
        self.unavailable_s = unavailable_s
        self._admin: Admin | None = None
        self._offsets: OffsetClient | None = None

    def admin(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self.bootstrap, self.admin_extra)
        return self._admin

    def offsets(self) -> OffsetClient:
        if self._offsets is None:
            self._offsets = OffsetClient(
                self.bootstrap,
                isolation_level=self.isolation_level,
                extra=self.consumer_extra,
                unavailable_s=self.unavailable_s,
            )
        return self._offsets

    def reset(self) -> None:
        """Close the clients; the next request makes new ones."""
        offsets, self._offsets, self._admin = self._offsets, None, None
        if offsets is not None:
            try:
                offsets.close()
            except Exception as e:  # a failed client: nothing left to release
                log.debug("closing the offset client of %s: %s", self.bootstrap, e)

    close = reset


def watermarks(
    bootstrap: str,
    partitions: Iterable[TopicPartition],
    isolation_level: str = "read_committed",
    *,
    extra: Mapping[str, Any] | None = None,
    timeout_s: float = 10.0,
) -> dict[TopicPartition, tuple[int, int]]:
    """(low, high) per partition; high is the last stable offset under read_committed."""
    with OffsetClient(bootstrap, isolation_level, extra=extra, timeout_s=timeout_s) as c:
        return c.watermarks(partitions)


def offsets_for_times(
    bootstrap: str,
    timestamps_ms: Mapping[TopicPartition, int],
    isolation_level: str = "read_committed",
    *,
    extra: Mapping[str, Any] | None = None,
    timeout_s: float = 10.0,
) -> dict[TopicPartition, int | None]:
    """First offset at or after each timestamp (ms since epoch); None when there is none."""
    with OffsetClient(bootstrap, isolation_level, extra=extra, timeout_s=timeout_s) as c:
        return c.offsets_for_times(timestamps_ms)
