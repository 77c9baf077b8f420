"""Creating librdkafka clients with lakesink's security settings, and their security failures.

`client_config` turns a configuration (which may hold `Secret`s) into what a confluent-kafka
client takes: secrets revealed, an `error_cb` collecting the client's errors (`ClientErrors`),
and librdkafka's own log lines routed to the `lakesink.kafka.librdkafka` logger at DEBUG level
(shown with `--debug`, never flooding the output otherwise).

librdkafka retries a broker that refuses it for ever and reports why only through error
callbacks. `ClientErrors.raise_security_failure` turns the first such report into a one-line
`KafkaAuthenticationError` or `KafkaAuthorizationError` that names the broker and the principal
and says what to check; no message ever holds a secret (librdkafka's reasons do not either).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from lakesink.errors import (
    ConfigError,
    KafkaAuthenticationError,
    KafkaAuthorizationError,
    KafkaError,
)
from lakesink.security import reveal_all

log = logging.getLogger(__name__)
LIBRDKAFKA_LOGGER = "lakesink.kafka.librdkafka"
"""librdkafka's own log lines go to this Python logger (at DEBUG) instead of straight to stderr;
the CLI shows them only with --debug (a refused broker is otherwise ~200 lines of connection
errors)."""

_librdkafka_log = logging.getLogger(LIBRDKAFKA_LOGGER)

_AUTHENTICATION = -169  # librdkafka: RD_KAFKA_RESP_ERR__AUTHENTICATION
_SSL = -181  # RD_KAFKA_RESP_ERR__SSL
_SASL_AUTHENTICATION_FAILED = 58
_TOPIC_AUTHORIZATION_FAILED = 29
_CLUSTER_AUTHORIZATION_FAILED = 31
AUTHENTICATION_CODES = frozenset({_AUTHENTICATION, _SSL, _SASL_AUTHENTICATION_FAILED})
AUTHORIZATION_CODES = frozenset({_TOPIC_AUTHORIZATION_FAILED, _CLUSTER_AUTHORIZATION_FAILED})


_TRANSIENT_TLS = ("disconnected", "connection reset", "broken pipe", "timed out")


class _DebugLog:
    """A librdkafka `logger`: every line at DEBUG on lakesink.kafka.librdkafka."""

    def log(self, level: int, fmt: str, *args: Any) -> None:
        _librdkafka_log.debug(fmt, *args)


_DEBUG_LOG = _DebugLog()


def principal(config: Mapping[str, Any]) -> str:
    """Who the broker sees: `User:<sasl.username>`, the client certificate, or ANONYMOUS."""
    protocol = str(config.get("security.protocol", "plaintext")).lower()
    if protocol.startswith("sasl_") and config.get("sasl.username"):
        return f"User:{config['sasl.username']}"
    if protocol == "ssl" and config.get("ssl.certificate.location"):
        return f"the subject of client certificate {config['ssl.certificate.location']}"
    return "User:ANONYMOUS"


class ClientErrors:
    """The `error_cb` of one client: keeps the first security failure and the last error.

    Callbacks run inside the client's poll()/consume()/flush() calls, so poll the client
    (`poll(0)`) before asking."""

    def __init__(self, bootstrap: str, config: Mapping[str, Any]) -> None:
        self.bootstrap = bootstrap
        self.principal = principal(config)
        self.security: Any = None
        self.fatal: Any = None
        self.last: str | None = None

    def __call__(self, err: Any) -> None:
        code = err.code()
        if self.security is None and _is_refusal(code, err.str()):
            self.security = err
        if self.fatal is None and err.fatal():
            self.fatal = err
        self.last = one_line(err.str())
        log.debug("Kafka client error on %s: %s", self.bootstrap, self.last)

    def raise_security_failure(self) -> None:
        """Raise the security failure seen so far, if any (else return)."""
        if self.security is not None:
            raise security_error(self.bootstrap, self.principal, self.security)

    def raise_failure(self) -> None:
        """Raise the security failure or the fatal error seen so far, if any."""
        self.raise_security_failure()
        if self.fatal is not None:
            raise KafkaError(
                f"Kafka client for {self.bootstrap} failed: {one_line(self.fatal.str())}"
            )


def _tls_alert(text: str) -> bool:
    """A TLS alert the broker sent (e.g. "alert bad certificate" when it requires a client
    certificate; with TLS 1.3 it arrives after the handshake, as a transport error)."""
    return "ssl" in text and "alert" in text


def _is_refusal(code: int, text: str) -> bool:
    """Whether an error says the broker refuses this client (not a passing network fault):
    a TLS error counts when the handshake failed for a reason other than a broken connection
    (a broker restarting mid-handshake must not end a read), or the broker sent a TLS alert."""
    lowered = text.lower()
    if _tls_alert(lowered):
        return True
    if code == _SSL:
        return "handshake" in lowered and not any(w in lowered for w in _TRANSIENT_TLS)
    return code in AUTHENTICATION_CODES or code in AUTHORIZATION_CODES


def client_config(config: Mapping[str, Any], errors: ClientErrors | None = None) -> dict[str, Any]:
    """What a confluent-kafka client constructor takes: secrets revealed, librdkafka's log
    lines at DEBUG on lakesink.kafka.librdkafka, and `errors` as the error callback."""
    out = reveal_all(config)
    out.setdefault("logger", _DEBUG_LOG)
    if errors is not None:
        out["error_cb"] = errors
    return out


C = TypeVar("C")


def new_client(
    factory: Callable[[dict[str, Any]], C],
    config: Mapping[str, Any],
    errors: ClientErrors | None = None,
) -> C:
    """`factory(client_config(config, errors))` (Consumer, Producer, AdminClient); settings
    librdkafka refuses (e.g. a CA file that holds no certificate) raise ConfigError."""
    try:
        return factory(client_config(config, errors))
    except Exception as e:
        from confluent_kafka import KafkaException

        if not isinstance(e, KafkaException | ValueError):
            raise
        err = e.args[0] if e.args else e
        reason = one_line(err.str() if hasattr(err, "str") else str(err))
        raise ConfigError(
            f"cannot create a Kafka client for {config.get('bootstrap.servers')}: {reason}; "
            "check the kafka.* settings (lakesink config check)"
        ) from None


_BROKER_PREFIX = re.compile(r"^(?:[a-z_]+://)?(\S+?)(?:/[^\s:]*)?: ")
_AFTER = re.compile(r"\s*\(after \d+ms in state \w+\)")
_INSTALL_HINT = re.compile(r"\s*\((?:brew )?install [^)]*\)")


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def _reason(err: Any) -> tuple[str | None, str]:
    """(broker host:port named by librdkafka or None, the reason without noise)."""
    text = one_line(err.str())
    broker = None
    m = _BROKER_PREFIX.match(text)
    if m and ":" in m.group(1):
        broker, text = m.group(1), text[m.end() :]
    text = _INSTALL_HINT.sub("", _AFTER.sub("", text))
    return broker, text


def security_error(bootstrap: str, who: str, err: Any) -> KafkaError:
    """A broker's refusal as lakesink's one-line error naming broker and principal."""
    code = err.code()
    broker, reason = _reason(err)
    where = f"Kafka broker {broker or bootstrap}"
    if code == _SSL and (
        "certificate verify failed" in reason or "could not be verified" in reason
    ):
        return KafkaAuthenticationError(
            f"TLS handshake with {where} failed for principal {who}: the broker's certificate "
            f"is not trusted ({reason}); set kafka.ssl.ca.location to the CA that signed it"
        )
    if _tls_alert(reason.lower()):
        return KafkaAuthenticationError(
            f"{where} refused the TLS connection of principal {who} ({reason}); if it requires "
            "client certificates, set kafka.ssl.certificate.location and kafka.ssl.key.location "
            "to one its CA signed"
        )
    if code == _SSL:
        return KafkaAuthenticationError(
            f"TLS handshake with {where} failed for principal {who}: {reason}"
        )
    if code in AUTHENTICATION_CODES:
        return KafkaAuthenticationError(
            f"{where} refused to authenticate principal {who}: {reason}; check "
            "kafka.sasl.username, kafka.sasl.password and kafka.sasl.mechanism"
        )
    return KafkaAuthorizationError(f"principal {who} is not authorized on {where}: {reason}")


def not_authorized(bootstrap: str, who: str, topics: list[str], operations: str) -> KafkaError:
    """The error for topics the broker hides from this principal. Kafka answers the same for a
    topic that does not exist, so as not to tell an unauthorized client which topics exist."""
    names = ", ".join(repr(t) for t in topics)
    return KafkaAuthorizationError(
        f"principal {who} is not authorized to describe topic(s) {names} on Kafka broker "
        f"{bootstrap} (or they do not exist): grant it {operations} ACLs on them"
    )
