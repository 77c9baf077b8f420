"""lakesink against a secured Apache Kafka: a SASL_SSL listener (SCRAM-SHA-512, a CA and broker
certificate made here with openssl) with ACLs under StandardAuthorizer.

With the right credentials the `lakesink` command ingests exactly once (every client: planning,
task readers, the dead-letter producer, the audit) and prints the password nowhere, Spark's
output included. A wrong password, a CA that did not
sign the broker's certificate and a missing ACL each end in one line that names the broker and
the principal, within seconds, with the Kafka error exit code, and never show the password.
One secured broker serves the whole module.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import audit_config

from lakesink.config import load_config
from lakesink.errors import KafkaAuthenticationError, KafkaAuthorizationError
from lakesink.kafka.client import create_topic
from lakesink.kafka.kafka_server import KafkaServer
from lakesink.kafka.producer import SAMPLE_EVENT_DDL, produce_sample_events

pytestmark = pytest.mark.integration

USER = "lakesink"
PRINCIPAL = f"User:{USER}"
RECORDS = 300
BAD_RECORDS = 5  # not JSON: they go to the dead-letter topic
PARTITIONS = 2
PASSWORD_ENV = "LAKESINK_TEST_SASL_PASSWORD"
CLIENT_CN = "lakesink-client"
KEY_PASSWORD_ENV = "LAKESINK_TEST_SSL_KEY_PASSWORD"


@dataclass(frozen=True)
class SecuredKafka:
    """The module's broker: PLAINTEXT for the super user (ANONYMOUS), SASL_SSL for lakesink."""

    plaintext: str
    sasl_ssl: str
    ssl: str  # mutual TLS: the client certificate names the principal
    certs: Certificates
    password: str
    topic: str  # lakesink may READ and DESCRIBE it
    topic_without_acl: str
    topic_describe_only: str  # lakesink may DESCRIBE it, not READ it
    dead_letter_topic: str  # lakesink may WRITE, READ and DESCRIBE it
    dead_letter_topic_read_only: str  # lakesink may READ and DESCRIBE it, not WRITE it


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@dataclass(frozen=True)
class Certificates:
    ca: Path
    broker_keystore: Path  # PKCS#8 key, then the certificate (ssl.keystore.type=PEM)
    other_ca: Path  # signed nothing
    client_cert: Path  # CN=lakesink-client, signed by ca
    client_key: Path  # encrypted with client_key_password
    client_key_password: str


def make_certificates(d: Path) -> Certificates:
    """A CA; a broker certificate it signs (localhost, 127.0.0.1) in one PEM keystore with its
    key; a client certificate it signs, with an encrypted key; a second CA that signed nothing."""
    d.mkdir(parents=True, exist_ok=True)
    for name, subject in (("ca", "/CN=lakesink test CA"), ("other-ca", "/CN=untrusted CA")):
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", subject,
            "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=d,
        )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
        "-keyout", "broker.key", "-out", "broker.csr", cwd=d,
    )  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl(
        "x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "broker.pem", cwd=d,
    )  # fmt: skip
    keystore = d / "broker-keystore.pem"
    keystore.write_text((d / "broker.key").read_text() + (d / "broker.pem").read_text())
    key_password = "kp-" + secrets.token_urlsafe(12)
    _openssl(
        "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-aes-256-cbc",
        "-pass", f"pass:{key_password}", "-out", "client.key", cwd=d,
    )  # fmt: skip
    _openssl(
        "req", "-new", "-key", "client.key", "-passin", f"pass:{key_password}",
        "-subj", f"/CN={CLIENT_CN}", "-out", "client.csr", cwd=d,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-out", "client.pem", cwd=d,
    )  # fmt: skip
    return Certificates(
        d / "ca.pem", keystore, d / "other-ca.pem", d / "client.pem", d / "client.key", key_password
    )


def grant(plaintext: str, topic: str, *operations: str, principal: str = PRINCIPAL) -> None:
    """`operations` (READ, WRITE, DESCRIBE) on `topic` for `principal` (as the super user)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": plaintext})
    bindings = [
        AclBinding(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.LITERAL,
            principal,
            "*",
            op,
            AclPermissionType.ALLOW,
        )
        for op in (getattr(AclOperation, name) for name in operations)
    ]
    for future in admin.create_acls(bindings).values():
        future.result(30)


@pytest.fixture(scope="module")
def secured_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    d = tmp_path_factory.mktemp("secured-kafka")
    certs = make_certificates(d / "tls")
    password = "pw-" + secrets.token_urlsafe(18)
    server = KafkaServer(
        data_dir=d / "broker",
        extra_listeners={"SASL_SSL": "SASL_SSL", "SSL": "SSL"},
        server_properties={
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "listener.name.sasl_ssl.ssl.keystore.type": "PEM",
            "listener.name.sasl_ssl.ssl.keystore.location": str(certs.broker_keystore),
            "listener.name.ssl.ssl.keystore.type": "PEM",
            "listener.name.ssl.ssl.keystore.location": str(certs.broker_keystore),
            "listener.name.ssl.ssl.truststore.type": "PEM",
            "listener.name.ssl.ssl.truststore.location": str(certs.ca),
            "listener.name.ssl.ssl.client.auth": "required",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS",  # PLAINTEXT and CONTROLLER listeners
            "allow.everyone.if.no.acl.found": "false",
            "auto.create.topics.enable": "false",
        },
        format_args=("--add-scram", f"SCRAM-SHA-512=[name={USER},password={password}]"),
    )
    server.start()
    try:
        plaintext = server.bootstrap_servers
        topic, topic_without_acl = "secured-events", "secured-no-acl"
        topic_describe_only = "secured-describe-only"
        dead_letter_topic, dead_letter_topic_read_only = "secured-dlq", "secured-dlq-read-only"
        for t in (topic, topic_without_acl, topic_describe_only):
            produce_sample_events(plaintext, t, RECORDS, PARTITIONS)
        _produce_bad_records(plaintext, topic, BAD_RECORDS)
        for t in (dead_letter_topic, dead_letter_topic_read_only):
            create_topic(plaintext, t, 1)
        grant(plaintext, topic, "READ", "DESCRIBE")
        grant(plaintext, topic, "READ", "DESCRIBE", principal=f"User:CN={CLIENT_CN}")
        grant(plaintext, topic_describe_only, "DESCRIBE")
        grant(plaintext, dead_letter_topic, "WRITE", "READ", "DESCRIBE")
        grant(plaintext, dead_letter_topic_read_only, "READ", "DESCRIBE")
        yield SecuredKafka(
            plaintext=plaintext,
            sasl_ssl=server.address("SASL_SSL"),
            ssl=server.address("SSL"),
            certs=certs,
            password=password,
            topic=topic,
            topic_without_acl=topic_without_acl,
            topic_describe_only=topic_describe_only,
            dead_letter_topic=dead_letter_topic,
            dead_letter_topic_read_only=dead_letter_topic_read_only,
        )
    finally:
        server.close()


def _produce_bad_records(plaintext: str, topic: str, n: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": plaintext, "acks": "all"})
    for i in range(n):
        producer.produce(topic, f"not json {i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0


def secured_settings(k: SecuredKafka, password: str, ca: Path) -> dict[str, Any]:
    return {
        "kafka.security.protocol": "sasl_ssl",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.username": USER,
        "kafka.sasl.password": password,
        "kafka.ssl.ca.location": str(ca),
    }


def _write_config(
    path: Path,
    k: SecuredKafka,
    topic: str,
    ca: Path,
    table: Path,
    password: str = f"env:{PASSWORD_ENV}",
    **more: str,
) -> Path:
    raw = {
        "kafka.bootstrap.servers": k.sasl_ssl,
        "kafka.topics": topic,
        "value.format": "json",
        "value.schema": SAMPLE_EVENT_DDL,
        "table.path": str(table),
        **secured_settings(k, password, ca),
        **more,
    }
    path.write_text("".join(f'"{key}" = {json.dumps(v)}\n' for key, v in raw.items()))
    return path


def test_right_credentials_ingest_exactly_once_with_dead_letters_and_never_print_the_password(
    secured_kafka: SecuredKafka,
    tmp_path: Path,
    cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    k = secured_kafka
    password_file = tmp_path / "sasl-password"
    password_file.write_text(k.password + "\n")
    conf = _write_config(
        tmp_path / "secured.toml",
        k,
        k.topic,
        k.certs.ca,
        tmp_path / "t",
        password=f"file:{password_file}",
        **{"errors.tolerance": "all", "errors.deadletter.topic": k.dead_letter_topic},
    )
    # the lakesink command as a user runs it: all its output, Spark's included, is checked
    ingest = cli(["ingest", "--once", "--config", str(conf)], timeout_s=150)
    assert ingest.returncode == 0, ingest.stdout
    verify = cli(["verify", "--config", str(conf)])
    assert verify.returncode == 0 and "PASS" in verify.stdout, verify.stdout
    for out in (ingest.stdout, verify.stdout):
        assert k.password not in out
        assert "rdkafka" not in out  # librdkafka's log lines stay behind --debug
    # every client went through SASL_SSL: planning, task readers, the dead-letter producer,
    # and the audit's readers of the topic and of the dead-letter topic
    cfg = load_config(conf)
    assert k.password not in repr(cfg)
    report = audit_config(cfg)
    assert report.ok, report.problems
    assert report.rows_hudi_rs == report.rows_lakesink == RECORDS
    assert report.kafka_records == RECORDS + BAD_RECORDS
    assert report.dead_letters == BAD_RECORDS


@pytest.mark.parametrize(
    ("case", "command", "error"),
    [
        ("wrong-password", "ingest", KafkaAuthenticationError),
        ("wrong-password", "status", KafkaAuthenticationError),
        ("untrusted-certificate", "ingest", KafkaAuthenticationError),
        ("missing-acl", "ingest", KafkaAuthorizationError),
        ("describe-but-no-read-acl", "ingest", KafkaAuthorizationError),
        ("dead-letter-topic-without-write-acl", "ingest", KafkaAuthorizationError),
    ],
)
def test_refusal_is_one_line_naming_broker_and_principal_without_the_secret(
    secured_kafka: SecuredKafka,
    tmp_path: Path,
    cli: Callable[..., subprocess.CompletedProcess[str]],
    case: str,
    command: str,
    error: type[Exception],
) -> None:
    k = secured_kafka
    wrong = "wrong-" + secrets.token_urlsafe(12)
    password = wrong if case == "wrong-password" else k.password
    ca = k.certs.other_ca if case == "untrusted-certificate" else k.certs.ca
    topic = {
        "missing-acl": k.topic_without_acl,
        "describe-but-no-read-acl": k.topic_describe_only,
    }.get(case, k.topic)
    conf = _write_config(tmp_path / "secured.toml", k, topic, ca, tmp_path / "t")
    if case == "dead-letter-topic-without-write-acl":
        with conf.open("a") as f:
            f.write(
                '"errors.tolerance" = "all"\n'
                f'"errors.deadletter.topic" = "{k.dead_letter_topic_read_only}"\n'
            )
    args = [command, "--config", str(conf)] + (["--once"] if command == "ingest" else [])

    started = time.monotonic()
    done = cli(args, env={PASSWORD_ENV: password}, timeout_s=60)
    elapsed = time.monotonic() - started

    out = done.stdout
    assert k.password not in out and wrong not in out
    assert done.returncode == error.exit_code == 7, out  # type: ignore[attr-defined]
    errors = [ln for ln in out.splitlines() if ln.startswith("lakesink: error:")]
    assert len(errors) == 1, out
    line = errors[0]
    assert k.sasl_ssl in line and PRINCIPAL in line, line
    expected = {
        "wrong-password": "refused to authenticate principal",
        "untrusted-certificate": "certificate is not trusted",
        "missing-acl": f"not authorized to describe topic(s) '{k.topic_without_acl}'",
        "describe-but-no-read-acl": f"may not READ topic '{k.topic_describe_only}'",
        "dead-letter-topic-without-write-acl": (
            f"may not WRITE topic '{k.dead_letter_topic_read_only}'"
        ),
    }[case]
    assert expected in line, line
    assert "Traceback" not in out and "rdkafka" not in out, out  # no client log flood
    assert len(out.splitlines()) <= 3, out
    assert elapsed < 20, f"{case}: {elapsed:.1f} s"
    assert not (tmp_path / "t").exists()  # refused before anything was written


def test_mutual_tls_client_certificate_with_encrypted_key_reads_under_its_own_acls(
    secured_kafka: SecuredKafka,
    tmp_path: Path,
    cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    k, c = secured_kafka, secured_kafka.certs
    settings = {
        "kafka.bootstrap.servers": k.ssl,
        "kafka.topics": k.topic,
        "value.schema": SAMPLE_EVENT_DDL,
        "table.path": str(tmp_path / "t"),
        "kafka.security.protocol": "ssl",
        "kafka.ssl.ca.location": str(c.ca),
    }
    client_cert = {
        "kafka.ssl.certificate.location": str(c.client_cert),
        "kafka.ssl.key.location": str(c.client_key),
        "kafka.ssl.key.password": f"env:{KEY_PASSWORD_ENV}",
    }
    env = {KEY_PASSWORD_ENV: c.client_key_password}
    for name, raw in (("mtls", {**settings, **client_cert}), ("no-cert", settings)):
        (tmp_path / f"{name}.toml").write_text(
            "".join(f'"{key}" = {json.dumps(v)}\n' for key, v in raw.items())
        )

    done = cli(["status", "--json", "--config", str(tmp_path / "mtls.toml")], env=env)
    assert done.returncode == 0, done.stdout
    assert c.client_key_password not in done.stdout
    st = json.loads(done.stdout[done.stdout.index("{") :])
    assert sum(p["high_watermark"] for p in st["partitions"]) == RECORDS + BAD_RECORDS

    # the broker requires a client certificate: without one the handshake is refused
    started = time.monotonic()
    refused = cli(["status", "--config", str(tmp_path / "no-cert.toml")], env=env)
    elapsed = time.monotonic() - started
    errors = [ln for ln in refused.stdout.splitlines() if ln.startswith("lakesink: error:")]
    assert refused.returncode == KafkaAuthenticationError.exit_code, refused.stdout
    assert len(errors) == 1 and k.ssl in errors[0] and "User:ANONYMOUS" in errors[0], errors
    assert "kafka.ssl.certificate.location" in errors[0], errors
    assert elapsed < 20, f"{elapsed:.1f} s"
