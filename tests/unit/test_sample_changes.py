"""The demo's sample change stream: decoded by lakesink's change deserializer and folded by key
under the ordering rule, it leaves exactly the rows the stream says the database holds."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lakesink.engine.fold import fold_by_key
from lakesink.kafka.changes import ChangeDeserializer
from lakesink.kafka.sample_changes import ACCOUNTS_DDL, sample_changes
from lakesink.protocol.mutation import (
    OPERATION_COLUMN,
    SOURCE_POSITION_COLUMN,
    RowOperation,
)
from lakesink.settings import DEFAULT_OP_VALUES, parse_op_values


def deserializer() -> ChangeDeserializer:
    return ChangeDeserializer.configured(
        value_format="json",
        schema=ACCOUNTS_DDL,
        schema_file=None,
        key_columns=("id",),
        cdc_format="debezium",
        ordering_field=None,
        op_field="op",
        op_values=parse_op_values(DEFAULT_OP_VALUES),
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fold_of_the_sample_stream_is_the_rows_it_leaves(seed: int) -> None:
    stream = sample_changes(40, 400, 3, seed=seed)
    counts = stream.counts
    assert counts["d"] == counts["tombstone"] > 0 and counts["u"] > counts["c"] > 40
    values = [r.value for r in stream.records]
    decoded = deserializer().decode(values)
    assert not decoded.failures
    assert decoded.skipped == frozenset(i for i, v in enumerate(values) if v is None)
    rows = decoded.table
    # the Kafka coordinates the fold breaks ties with: the records' partitions and offsets
    kept = [r for r in stream.records if r.value is not None]
    offsets: dict[int, int] = {}
    partition, offset = [], []
    for r in stream.records:
        if r.value is not None:
            partition.append(r.partition)
            offset.append(offsets.get(r.partition, 0))
        offsets[r.partition] = offsets.get(r.partition, 0) + 1
    assert len(partition) == len(kept) == rows.num_rows
    rows = rows.append_column("kafka_partition", pa.array(partition, pa.int32()))
    rows = rows.append_column("kafka_offset", pa.array(offset, pa.int64()))
    folded = fold_by_key(rows, ("id",), SOURCE_POSITION_COLUMN)
    live = folded.filter(pc.not_equal(folded.column(OPERATION_COLUMN), RowOperation.DELETE.code))
    got = {r["id"]: (r["owner"], r["balance"], r["updated_at"]) for r in live.to_pylist()}
    want = {k: (r["owner"], r["balance"], r["updated_at"]) for k, r in stream.rows.items()}
    assert got == want
    assert all(isinstance(b, Decimal) for _, b, _ in got.values())


def test_the_sample_stream_is_the_same_for_the_same_seed_and_refuses_bad_sizes() -> None:
    assert sample_changes(5, 30, 2, seed=7).records == sample_changes(5, 30, 2, seed=7).records
    with pytest.raises(ValueError, match="accounts >= 1"):
        sample_changes(0, 10, 2)
