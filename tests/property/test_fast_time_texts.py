"""The JSON decoder's check of date and timestamp texts (json_bulk.py): a column of texts of one
length and shape is checked against its first text with numpy instead of the regex. On fuzzed
columns, built to have one shape as often as not, the check answers what the regex answers."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lakesink.kafka.json_bulk import _DATE_ONLY, _TS_NTZ, _TS_UTC, _all_match, _one_shape_matches

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

PATTERNS = {"utc": (_TS_UTC, True), "ntz": (_TS_NTZ, True), "date": (_DATE_ONLY, False)}

# two-digit groups and years at and beyond the pattern's ranges; the first text of a column is
# drawn from valid ones, so that the one-shape proof applies as often as not
two = st.sampled_from(
    ["00", "01", "09", "12", "19", "20", "23", "24", "29", "30", "59", "60", "99"]
)
valid_two = st.sampled_from(["00", "09", "12", "23", "59"])
year = st.sampled_from(["0000", "0001", "0010", "0100", "1970", "2024", "9999"])
valid_year = st.sampled_from(["0001", "1970", "9999"])
# shapes the patterns accept, more often than shapes they refuse
sep = st.sampled_from(["T", "T", " ", "t", "_"])
fraction = st.sampled_from(["", "", ".5", ".005000", ".", ".1234567"])
zone_form = st.sampled_from(["", "", "Z", "Z", "+hh:mm", "-hh:mm", "z", "+hhmm"])
# same-width bytes a text may carry in a wrong place
stray = st.sampled_from(list("-:T Z+.9a/\n"))


@st.composite
def time_text(draw: st.DrawFn, kind: str, shape: tuple[str, str, str], valid: bool) -> str:
    y, d2 = (valid_year, valid_two) if valid else (year, two)
    date = f"{draw(y)}-{draw(d2)}-{draw(d2)}"
    if kind == "date":
        return date
    separator, frac, form = shape
    zone = form.replace("hh", draw(d2)).replace("mm", draw(d2))
    return f"{date}{separator}{draw(d2)}:{draw(d2)}:{draw(d2)}{frac}{zone}"


@st.composite
def columns(draw: st.DrawFn) -> tuple[str, pa.ChunkedArray]:
    kind = draw(st.sampled_from(sorted(PATTERNS)))
    shape = (draw(sep), draw(fraction), draw(zone_form))
    rows: list[str | None] = [draw(time_text(kind, shape, valid=True))]
    for _ in range(draw(st.integers(0, 7))):
        row: str | None = draw(time_text(kind, shape, valid=draw(st.booleans())))
        if draw(st.booleans()):  # one byte in a wrong place, the width kept
            at = draw(st.integers(0, len(row) - 1))
            row = row[:at] + draw(stray) + row[at + 1 :]
        if draw(st.integers(0, 12)) == 0:
            row = draw(st.sampled_from([None, "2024-01-01T00:00:00.1Z", "\u00e92024-01-01"]))
        rows.append(row)
    cut = draw(st.integers(0, len(rows)))
    chunks = [pa.array(rows[:cut], pa.string()), pa.array(rows[cut:], pa.string())]
    return kind, pa.chunked_array([c for c in chunks if len(c)], pa.string())


def regex_answer(col: pa.ChunkedArray, pattern: str) -> bool:
    ok = pc.match_substring_regex(col, pattern)
    return bool(ok.null_count == col.null_count and pc.all(ok).as_py())


@FUZZ
@given(columns())
@example(("utc", pa.chunked_array([["2024-01-01T23:59:59.005000Z"] * 3])))
@example(("utc", pa.chunked_array([["2024-01-01T23:59:59Z", "2024-01-01T24:00:00Z"]])))
@example(("utc", pa.chunked_array([["2024-01-01T00:00:00+05:30", "2024-01-01T00:00:00+24:30"]])))
@example(("date", pa.chunked_array([["2024-01-01", "0000-01-01"]])))
@example(("ntz", pa.chunked_array([["2024-01-01 00:00:00", "2024-01-01 00:60:00"]])))
@example(("ntz", pa.chunked_array([["2024-01-01 00:00:00.5", "2024-01-01 00:00:60.5"]])))
@example(("utc", pa.chunked_array([["2024-01-01T00:00:00-05:30", "2024-01-01T00:00:00-05:60"]])))
def test_the_one_shape_check_answers_as_the_regex(case: tuple[str, pa.ChunkedArray]) -> None:
    kind, col = case
    pattern, clock = PATTERNS[kind]
    expected = regex_answer(col, pattern)
    assert _all_match(col, pattern, clock=clock) is expected
    if _one_shape_matches(col, pattern, clock=clock):  # the proof never claims what is false
        assert expected


def test_the_usual_column_is_proven_without_the_regex() -> None:
    """Texts of one producer's format take the numpy proof (else it would never be used)."""
    texts = [
        f"2024-01-{d:02d}T{h:02d}:{m:02d}:59.{d:06d}Z"
        for d in (1, 9, 31)
        for h, m in ((0, 0), (23, 59))
    ]
    assert _one_shape_matches(pa.chunked_array([texts]), _TS_UTC, clock=True)
    assert _one_shape_matches(
        pa.chunked_array([["1970-01-01", "2024-12-31"]]), _DATE_ONLY, clock=False
    )
