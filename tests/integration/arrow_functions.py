"""`transform.arrow` functions of the integration tests and their plain-Python references.

Spark's Python workers import this module as `arrow_functions`: the tests ship it with
`SparkContext.addPyFile`, and a `lakesink` command run by a test finds it on PYTHONPATH."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

PAID_IN_CENTS = "arrow_functions:paid_in_cents"
REFUSE_PURCHASES = "arrow_functions:refuse_purchases"
KEEP_ALL = "arrow_functions:keep_all"


def keep_all(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Every record as it came (a function that filters nothing)."""
    return batch


def paid_in_cents(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Keeps the events that are not views, drops `payload`, adds `cents` (the amount in whole
    cents, truncated toward zero) and `kind` (the event type upper-cased)."""
    kept = batch.filter(pc.not_equal(batch.column("event_type"), "view"))
    kept = kept.drop_columns(["payload"])
    cents = pc.cast(pc.trunc(pc.multiply(kept.column("amount"), 100.0)), pa.int64())
    kept = kept.append_column("cents", cents)
    return kept.append_column("kind", pc.utf8_upper(kept.column("event_type")))


def paid_in_cents_reference(event: dict[str, Any]) -> dict[str, Any] | None:
    """`paid_in_cents` of one decoded event, record by record (None: filtered out)."""
    if event["event_type"] is None or event["event_type"] == "view":
        return None
    return {
        "event_id": event["event_id"],
        "user_id": event["user_id"],
        "event_type": event["event_type"],
        "cents": math.trunc(event["amount"] * 100.0),
        "kind": event["event_type"].upper(),
    }


def refuse_purchases(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`paid_in_cents` with a bug that shows only on real records: it fails on any batch
    holding a purchase."""
    if pc.any(pc.equal(batch.column("event_type"), "purchase")).as_py():
        raise ValueError("purchases are not expected here")
    return paid_in_cents(batch)
