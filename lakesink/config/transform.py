"""The transformation keys (transform.*): SQL, a DataFrame function or an Arrow function."""

from __future__ import annotations

from lakesink.config.parsers import Key, optional_str

TRANSFORM_KEYS: tuple[Key, ...] = (
    Key(
        "transform.sql",
        optional_str,
        None,
        "Spark SQL over the view 'source', e.g. 'SELECT *, amount * 100 AS cents FROM source'.",
    ),
    Key(
        "transform.python",
        optional_str,
        None,
        "A function 'module:function' taking and returning a DataFrame.",
    ),
    Key(
        "transform.arrow",
        optional_str,
        None,
        "A function 'module:function' taking a pyarrow.RecordBatch of decoded records and "
        "returning a RecordBatch or Table, applied in the Spark tasks (keeps the direct path); "
        "pure per record, it must take an empty batch and keep kafka_topic, kafka_partition "
        "and kafka_offset.",
    ),
)
