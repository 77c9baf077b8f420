"""The JSON batch check's vectorized scans (json_bulk.py) against the plain byte-string tests they
replace, on the same joined values: line feeds and brackets found slice by slice (slices made
tiny here, so values straddle them), one value a line, and the per-value bracket bound."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakesink.kafka import json_bulk
from lakesink.kafka.json_bulk import _all_shallow, _one_value_a_line, _scan, _shallow
from lakesink.kafka.json_values import MAX_DEPTH

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# bytes that matter to the checks, and filler
pieces = st.sampled_from([b"{", b"}", b"[", b"]", b"\n", b"}\n{", b"a", b'"x":1', b"\xff", b" "])
values = st.lists(st.lists(pieces, max_size=12).map(b"".join), min_size=1, max_size=8)


@pytest.fixture(autouse=True)
def tiny_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_bulk, "_SCAN_BYTES", 5)


@FUZZ
@given(values, st.booleans())
def test_scan_finds_what_a_byte_by_byte_search_finds(vals: list[bytes], opens: bool) -> None:
    data = b"\n".join(vals)
    breaks, brackets = _scan(data, opens=opens)
    assert breaks.tolist() == [i for i, b in enumerate(data) if b == ord("\n")]
    if opens:
        assert brackets is not None
        assert brackets.tolist() == [i for i, b in enumerate(data) if b in b"[{"]
    else:
        assert brackets is None


@FUZZ
@given(values)
def test_one_value_a_line_is_the_count_test(vals: list[bytes]) -> None:
    data = b"\n".join(vals)
    if data[:1] != b"{" or data[-1:] != b"}":
        return  # the caller checks both ends first
    n = len(vals)
    breaks, _ = _scan(data, opens=False)
    expected = data.count(b"\n") == n - 1 and data.count(b"}\n{") == n - 1
    assert _one_value_a_line(data, breaks, n) is expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, MAX_DEPTH + 3), min_size=1, max_size=6))
def test_all_shallow_bounds_each_values_brackets(counts: list[int]) -> None:
    """Long values (as the check sees them: the longest over 2 * MAX_DEPTH) with n brackets:
    the bound holds exactly when each value's count is at most MAX_DEPTH."""
    vals = [b"{" + b"[" * c + b"]" * c + b"}" + b" " * (2 * MAX_DEPTH) for c in counts]
    data = b"\n".join(vals)
    breaks, brackets = _scan(data, opens=True)
    assert brackets is not None
    expected = all(map(_shallow, vals))
    assert _all_shallow(breaks, brackets, len(vals)) is expected
    assert expected is all(c + 1 <= MAX_DEPTH for c in counts)
