"""Kafka security settings and secrets: values that are used but never printed.

The `kafka.security.*`, `kafka.sasl.*` and `kafka.ssl.*` configuration keys (registered by the
configuration) map onto librdkafka settings that EVERY client lakesink creates gets: planning
and admin clients on the driver, readers in Spark tasks, the dead-letter producer, the audit and
`lakesink status` (`KafkaSettings.client_config` in lakesink.settings).

Secrets: a secret-typed key (e.g. `kafka.sasl.password`) takes one of:
- `env:NAME`: the value of environment variable NAME, read when the configuration is loaded;
- `file:/path`: the content of that file (one trailing newline removed), read at load time;
- anything else: the value itself (keep it out of files others can read; prefer env: or file:).
Setting the key through its environment variable (LAKESINK_KAFKA_SASL_PASSWORD) works as well.

The resolved value is a `Secret`: its repr and str show only where it came from, so printing a
configuration, logging it or putting it in an error message never shows the secret. Code that
hands the value to a client calls `reveal()` at the last moment.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

MASK = "****"

ENV_PREFIX = "env:"
FILE_PREFIX = "file:"

SENSITIVE_WORDS = ("password", "secret")
"""Client property names holding any of these words carry secrets (sasl.password, ...)."""

SENSITIVE_PROPERTIES = frozenset({"ssl.key.pem", "ssl_key", "sasl.oauthbearer.config"})
"""librdkafka properties that carry secrets without saying so in their name."""


def is_sensitive_property(name: str) -> bool:
    """Whether a client property (librdkafka name) holds a secret."""
    lowered = name.strip().lower()
    return lowered in SENSITIVE_PROPERTIES or any(w in lowered for w in SENSITIVE_WORDS)


@dataclass(frozen=True, slots=True)
class Secret:
    """A secret string; `source` says where it came from (`config`, `env:NAME`, `file:/path`)."""

    _value: str = field(repr=False)
    source: str = "config"

    def reveal(self) -> str:
        """The secret itself: only to hand it to a client, never to print or log it."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK!r}, source={self.source!r})"

    def __str__(self) -> str:
        return MASK

    def __format__(self, spec: str) -> str:
        return format(MASK, spec)


def resolve_secret(raw: Any, environ: Mapping[str, str] | None = None) -> Secret:
    """A raw configuration value as a Secret, reading `env:NAME` and `file:/path` references.

    Raises ValueError with a message that names the variable or file, never the value."""
    if isinstance(raw, Secret):
        return raw
    if not isinstance(raw, str):
        raise ValueError(f"expected a string (or env:NAME, file:/path), not {type(raw).__name__}")
    text = raw.strip()
    if text.startswith(ENV_PREFIX):
        name = text[len(ENV_PREFIX) :].strip()
        env = os.environ if environ is None else environ
        if not name:
            raise ValueError("env: needs the name of an environment variable, e.g. env:KAFKA_PW")
        if name not in env:
            raise ValueError(f"environment variable {name} is not set")
        value = env[name]
        source = f"{ENV_PREFIX}{name}"
    elif text.startswith(FILE_PREFIX):
        path = expand_user(text[len(FILE_PREFIX) :].strip())
        try:
            value = path.read_text()
        except OSError as e:
            raise ValueError(f"cannot read secret file {path}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise ValueError(f"secret file {path} is not UTF-8 text") from None
        value = value[:-1] if value.endswith("\n") else value
        value = value[:-1] if value.endswith("\r") else value
        source = f"{FILE_PREFIX}{path}"
    else:
        value, source = raw, "config"
    if not value:
        raise ValueError(f"the secret from {source} is empty")
    return Secret(value, source)


def reveal_all(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a client configuration with every Secret replaced by its value."""
    return {k: v.reveal() if isinstance(v, Secret) else v for k, v in config.items()}


def masked(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a client configuration safe to print: secrets and sensitive properties masked."""
    return {
        k: MASK if isinstance(v, Secret) or is_sensitive_property(k) else v
        for k, v in config.items()
    }


# --- configuration keys: parsers, checks, librdkafka mapping ---------------------------------

SECURITY_PROTOCOLS = ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
ENDPOINT_IDENTIFICATION = ("https", "none")

TYPED_PROPERTIES: Mapping[str, str] = {
    "security.protocol": "kafka.security.protocol",
    "sasl.mechanism": "kafka.sasl.mechanism",
    "sasl.mechanisms": "kafka.sasl.mechanism",
    "sasl.username": "kafka.sasl.username",
    "sasl.password": "kafka.sasl.password",
    "ssl.ca.location": "kafka.ssl.ca.location",
    "ssl.certificate.location": "kafka.ssl.certificate.location",
    "ssl.key.location": "kafka.ssl.key.location",
    "ssl.key.password": "kafka.ssl.key.password",
    "ssl.endpoint.identification.algorithm": "kafka.ssl.endpoint.identification",
}
"""librdkafka property -> the lakesink key that sets it (for every client)."""


class ConfigView(Protocol):
    def __getitem__(self, key: str) -> Any: ...


def parse_sasl_mechanism(v: Any) -> str | None:
    if v is None or str(v).strip() == "":
        return None
    text = str(v).strip().upper()
    if text not in SASL_MECHANISMS:
        raise ValueError(f"expected one of {', '.join(SASL_MECHANISMS)}")
    return text


def parse_secret(v: Any) -> Secret | None:
    if v is None or (isinstance(v, str) and v.strip() == ""):
        return None
    return resolve_secret(v)


def expand_user(text: str) -> Path:
    """`text` as a path with `~` and `~user` expanded; ValueError (not Python's RuntimeError)
    when it names a user without a home directory."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        user = text.split("/", 1)[0]
        raise ValueError(f"{text}: {user} names no user's home directory") from None


def parse_file(v: Any) -> str | None:
    """A path of a readable file (certificates, keys), checked when the config is loaded."""
    if v is None or str(v).strip() == "":
        return None
    path = expand_user(str(v).strip())
    try:
        is_file = path.is_file()
    except (OSError, ValueError) as e:  # a name too long for the file system, a NUL byte
        raise ValueError(f"not a usable file path: {e}") from None
    if not is_file:
        raise ValueError(f"no such file: {path}")
    try:
        with path.open("rb"):
            pass
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    return str(path)


_SETTING_START = re.compile(r"\s*[A-Za-z_][\w.\-]*\s*=")


def split_settings(text: str | None) -> list[str]:
    """The 'k=v' items of a 'k=v,k=v' list. A comma starts a new item only where a setting name
    and '=' follow it; otherwise it belongs to the value, so lists such as
    spark.jars=a.jar,b.jar or ssl.cipher.suites=A,B and -Dx=1,-Dy=2 Java options keep their
    commas. Blank items are dropped; an item without '=' is returned as is (the caller names
    it as malformed)."""
    items: list[str] = []
    for piece in (text or "").split(","):
        if items and "=" in items[-1] and not _SETTING_START.match(piece) and piece.strip():
            items[-1] += "," + piece
        elif piece.strip():
            items.append(piece)
    return items


def parse_client_properties(key: str, text: str | None, *, consumer_only: bool) -> dict[str, str]:
    """'k=v,k=v' librdkafka settings of `key`; refuses secrets (they would print with the
    config) and settings a typed key owns. Messages never show a value."""
    out: dict[str, str] = {}
    for i, item in enumerate(split_settings(text)):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep:
            shown = repr(item) if not is_sensitive_property(item) else f"item {i + 1}"
            raise ValueError(f"{key}: {shown} is not of the form key=value")
        if is_sensitive_property(name):
            raise ValueError(
                f"{key} may not hold {name} (it would be printed with the configuration); "
                "use kafka.sasl.password or kafka.ssl.key.password, which read env:NAME or "
                "file:/path"
            )
        if name in TYPED_PROPERTIES:
            raise ValueError(f"{key} may not set {name}; use {TYPED_PROPERTIES[name]}")
        if consumer_only and (name.startswith(("ssl.", "sasl.")) or name == "security.protocol"):
            raise ValueError(
                f"{key} may not set {name}: every client needs it; put it in kafka.client.config"
            )
        out[name] = value.strip()
    return out


def check_security(cfg: ConfigView) -> None:
    """Combinations of the security keys; raises ValueError naming the keys."""
    protocol = cfg["kafka.security.protocol"]
    sasl_keys = ("kafka.sasl.mechanism", "kafka.sasl.username", "kafka.sasl.password")
    ssl_keys = (
        "kafka.ssl.ca.location",
        "kafka.ssl.certificate.location",
        "kafka.ssl.key.location",
        "kafka.ssl.key.password",
    )
    if protocol.startswith("sasl_"):
        missing = [k for k in sasl_keys if not cfg[k]]
        if missing:
            raise ValueError(f"kafka.security.protocol={protocol} needs {', '.join(missing)}")
    else:
        stray = [k for k in sasl_keys if cfg[k]]
        if stray:
            raise ValueError(
                f"{', '.join(stray)} need kafka.security.protocol=sasl_ssl or sasl_plaintext "
                f"(it is {protocol})"
            )
    if protocol not in ("ssl", "sasl_ssl"):
        stray = [k for k in ssl_keys if cfg[k]]
        if stray:
            raise ValueError(
                f"{', '.join(stray)} need kafka.security.protocol=ssl or sasl_ssl "
                f"(it is {protocol})"
            )
    if bool(cfg["kafka.ssl.certificate.location"]) != bool(cfg["kafka.ssl.key.location"]):
        raise ValueError(
            "a client certificate needs both kafka.ssl.certificate.location and "
            "kafka.ssl.key.location"
        )
    if cfg["kafka.ssl.key.password"] and not cfg["kafka.ssl.key.location"]:
        raise ValueError("kafka.ssl.key.password needs kafka.ssl.key.location")
    parse_client_properties("kafka.client.config", cfg["kafka.client.config"], consumer_only=False)
    parse_client_properties(
        "kafka.consumer.config", cfg["kafka.consumer.config"], consumer_only=True
    )


def client_settings(cfg: ConfigView) -> dict[str, Any]:
    """The librdkafka settings every client gets; secrets as Secret objects (reveal_all them
    when creating a client). Empty for a plaintext cluster with no kafka.client.config."""
    out: dict[str, Any] = {}
    protocol = cfg["kafka.security.protocol"]
    if protocol != "plaintext":
        out["security.protocol"] = protocol
    for prop, key in TYPED_PROPERTIES.items():
        if prop in ("security.protocol", "sasl.mechanisms"):
            continue
        value = cfg[key]
        if value is None:
            continue
        if key == "kafka.ssl.endpoint.identification" and protocol not in ("ssl", "sasl_ssl"):
            continue
        out[prop] = value
    out.update(
        parse_client_properties(
            "kafka.client.config", cfg["kafka.client.config"], consumer_only=False
        )
    )
    return out


def _choice(*valid: str) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        text = str(v).strip().lower()
        if text not in valid:
            raise ValueError(f"expected one of {', '.join(valid)}")
        return text

    return parse


def _optional_str(v: Any) -> str | None:
    return None if v is None or str(v).strip() == "" else str(v)


@dataclass(frozen=True, slots=True)
class KeySpec:
    """A configuration key of this module; the configuration registry registers each as a
    Key."""

    name: str
    parse: Callable[[Any], Any]
    default: Any
    doc: str
    secret: bool = False


KEY_SPECS: tuple[KeySpec, ...] = (
    KeySpec(
        "kafka.security.protocol",
        _choice(*SECURITY_PROTOCOLS),
        "plaintext",
        "How clients talk to the brokers: plaintext, ssl, sasl_plaintext or sasl_ssl.",
    ),
    KeySpec(
        "kafka.sasl.mechanism",
        parse_sasl_mechanism,
        None,
        "SASL mechanism (sasl_* protocols): PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.",
    ),
    KeySpec(
        "kafka.sasl.username", _optional_str, None, "SASL user name; the principal is User:<it>."
    ),
    KeySpec(
        "kafka.sasl.password",
        parse_secret,
        None,
        "SASL password (secret: env:NAME or file:/path read it from there; never printed).",
        secret=True,
    ),
    KeySpec(
        "kafka.ssl.ca.location",
        parse_file,
        None,
        "PEM file of the CA(s) that signed the brokers' certificates (default: system CAs).",
    ),
    KeySpec(
        "kafka.ssl.certificate.location",
        parse_file,
        None,
        "PEM file of this client's certificate, for brokers that ask for one (mutual TLS).",
    ),
    KeySpec(
        "kafka.ssl.key.location",
        parse_file,
        None,
        "PEM file of the private key of kafka.ssl.certificate.location.",
    ),
    KeySpec(
        "kafka.ssl.key.password",
        parse_secret,
        None,
        "Password of an encrypted kafka.ssl.key.location (secret: env:NAME or file:/path).",
        secret=True,
    ),
    KeySpec(
        "kafka.ssl.endpoint.identification",
        _choice(*ENDPOINT_IDENTIFICATION),
        "https",
        "https: the broker's certificate must name the host connected to; none: do not check.",
    ),
    KeySpec(
        "kafka.client.config",
        _optional_str,
        None,
        "Extra librdkafka settings of every client (consumers, producers, admin), 'k=v,k=v' "
        "(e.g. ssl.cipher.suites=...); secrets are refused here: use the secret keys.",
    ),
)
