"""The transformation of benchmarks/bench_transforms.py, written both ways: as a `transform.arrow`
function over a pyarrow RecordBatch and as a `transform.python` function over a Spark DataFrame.
Both add `cents` (the amount in whole cents, truncated) and `kind` (the event type
upper-cased) to every record. Spark's Python workers import this module (the benchmark puts
benchmarks/ on PYTHONPATH)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

ARROW = "transform_functions:cents_and_kind_arrow"
DATAFRAME = "transform_functions:cents_and_kind_dataframe"


def cents_and_kind_arrow(batch: pa.RecordBatch) -> pa.RecordBatch:
    cents = pc.cast(pc.trunc(pc.multiply(batch.column("amount"), 100.0)), pa.int64())
    batch = batch.append_column("cents", cents)
    return batch.append_column("kind", pc.utf8_upper(batch.column("event_type")))


def cents_and_kind_dataframe(df: Any) -> Any:
    from pyspark.sql import functions as F

    cents = F.expr("CAST(amount * 100.0 AS BIGINT)")  # Spark truncates toward zero
    return df.withColumn("cents", cents).withColumn("kind", F.upper(F.col("event_type")))
