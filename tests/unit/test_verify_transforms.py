"""`lakesink verify` with a transformation it cannot apply (transform.sql, transform.python):
a failing report says that records the transformation filtered count as missing."""

from __future__ import annotations

from typing import Any

import pytest

from lakesink.cli import verify
from lakesink.config import build_config
from lakesink.formats.hudi.audit import AuditReport

BASE = {
    "kafka.bootstrap.servers": "127.0.0.1:9092",
    "kafka.topics": "events",
    "value.schema": "id BIGINT",
    "table.path": "/tmp/t",
}


def _failing(*_: Any, **__: Any) -> AuditReport:
    return AuditReport("w", problems=["3 Kafka records of committed ranges are not in the table"])


def test_a_failing_verify_with_transform_sql_says_it_cannot_apply_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(verify, "audit_config", _failing)
    cfg = build_config({**BASE, "transform.sql": "SELECT * FROM rows WHERE id > 1"})
    assert verify.run_verify(cfg, as_json=False) == 10
    assert "transform.sql is set and verify cannot apply it" in capsys.readouterr().out


def test_without_such_a_transformation_the_report_is_unchanged(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(verify, "audit_config", _failing)
    assert verify.run_verify(build_config(BASE), as_json=False) == 10
    assert "cannot apply" not in capsys.readouterr().out
