"""A commit conflict of a table written by key is retried in a many-table ingestion whichever
table it is, not only when the first table (by name) is written by key."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from lakesink.errors import CommitConflictError
from lakesink.spark import sink as sink_module
from lakesink.spark.routing import RoutingSink


def _routing_sink(operations: dict[str, str]) -> Any:
    """A RoutingSink over tables of these operation types, with no Spark behind it: only the
    retry loop of `_commit_batch` runs."""
    sink: Any = object.__new__(RoutingSink)
    sink.routed = {
        name: SimpleNamespace(coordinator=SimpleNamespace(operation_type=op))
        for name, op in sorted(operations.items())
    }
    first = sink.routed[min(operations)]
    sink.coordinator = first.coordinator
    return sink


def _conflict_once(sink: Any) -> list[int]:
    calls: list[int] = []

    def once(batch_df: Any, batch_id: int, ranges: Any) -> str:
        calls.append(batch_id)
        if len(calls) == 1:
            raise CommitConflictError("bucket 3 rewritten by another writer")
        return "landed"

    sink._commit_batch_once = once
    return calls


def test_a_conflict_in_a_keyed_table_after_an_append_table_is_written_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sink_module.time, "sleep", lambda s: None)
    sink = _routing_sink({"a_events": "INSERT", "b_accounts": "UPSERT"})
    calls = _conflict_once(sink)
    assert sink._commit_batch(None, 7, []) == "landed"
    assert calls == [7, 7]


def test_a_conflict_where_no_table_is_written_by_key_fails_the_batch() -> None:
    sink = _routing_sink({"a_events": "INSERT", "b_clicks": "INSERT"})
    calls = _conflict_once(sink)
    with pytest.raises(CommitConflictError):
        sink._commit_batch(None, 7, [])
    assert calls == [7]
