"""The bucket index: Java's hashes, the bucket of a record key as Hudi parses it, bucket file
ids, and the vectorised path against the scalar one."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakesink.errors import CorruptTableError, RecordError, UnsupportedTableError
from lakesink.formats.hudi.table import bucket as bucket_module
from lakesink.formats.hudi.table.bucket import (
    BucketIndex,
    BucketIndexProperty,
    bucket_file_id,
    bucket_id,
    bucket_id_of_values,
    bucket_ids,
    bucket_of_file_id,
    hash_values,
    is_bucket_file_id,
    java_list_hash,
    java_string_hash,
    new_bucket_file_id,
    partition_bucket_key,
)
from lakesink.formats.hudi.table.files import base_file_name, parse_base_file_name
from lakesink.protocol.instant import InstantTime

# --- Java's String.hashCode and List.hashCode -------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("abc", 96354),  # 97*31^2 + 98*31 + 99
        ("Aa", 2112),  # 65*31 + 97: the classic collision with "BB"
        ("BB", 2112),  # 66*31 + 66
        ("polygenelubricants", -(2**31)),  # the famous Integer.MIN_VALUE hash
        ("é", 233),  # U+00E9: one UTF-16 unit
        ("€", 8364),  # U+20AC: one unit, three UTF-8 bytes
        ("😀", 1772899),  # U+1F600 = surrogates D83D DE00: 55357*31 + 56832
        ("a😀", 97 * 31**2 + 55357 * 31 + 56832),  # 3 units, not 2 characters
        ("Hello World", -862545276),  # overflows past 2^31: negative
    ],
)
def test_java_string_hash_matches_java_on_known_strings(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def _hash_by_definition(text: str) -> int:
    """s[0]*31^(n-1) + ... + s[n-1] over UTF-16 units, then to a signed 32-bit int."""
    raw = text.encode("utf-16-be", "surrogatepass")
    units = [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]
    total = sum(u * 31 ** (len(units) - 1 - i) for i, u in enumerate(units)) % 2**32
    return total - 2**32 if total >= 2**31 else total


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_java_string_hash_is_the_polynomial_over_utf16_units(text: str) -> None:
    assert java_string_hash(text) == _hash_by_definition(text)


def test_java_list_hash_starts_at_one_and_hashes_null_to_zero() -> None:
    assert java_list_hash([]) == 1
    assert java_list_hash([""]) == 31
    assert java_list_hash([None]) == 31  # null and "" hash alike
    assert java_list_hash(["abc"]) == 31 + 96354
    assert java_list_hash(["a", "b"]) == (31 + 97) * 31 + 98
    # 31 + MIN_VALUE wraps to a negative int; & 0x7fffffff keeps 31
    assert java_list_hash(["polygenelubricants"]) == 31 - 2**31
    assert bucket_id_of_values(["polygenelubricants"], 1000) == 31


# --- the hash values Hudi reads out of a record key -------------------------------------------


@pytest.mark.parametrize(
    ("key", "fields", "expected"),
    [
        ("abc", ["id"], ["abc"]),  # a single-field key: the whole key
        ("id:5", ["id"], ["id:5"]),  # ':' without ',': still the whole key
        ("a,b", ["id"], ["a,b"]),  # ',' without ':': the whole key
        ("2024-10-24 10:11:11.234", ["ts"], ["2024-10-24 10:11:11.234"]),
        ("f1:abc,f2:bcd", ["f1", "f2"], ["abc", "bcd"]),
        ("f1:abc,f2:bcd", ["f2", "f1"], ["abc", "bcd"]),  # key order, not hash-field order
        ("f1:abc,f2:bcd", ["f2"], ["bcd"]),
        ("f1:abc,f2:bcd,efg", ["f1", "f2"], ["abc", "bcd,efg"]),  # ',' inside the last value
        ("f1:101,010,f2:x", ["f2"], ["x"]),
        ("f1:a:b,c,f2:d", ["f1", "f2"], ["a:b,c", "d"]),  # ':' inside a value, ',' after
        ("ts:2024-10-24 10:11:11,id:7", ["ts", "id"], ["2024-10-24 10:11:11", "7"]),
        ("a:__null__,b:__empty__", ["a", "b"], [None, ""]),
        ("x:1,y:2", ["z"], ["x:1,y:2"]),  # no hash field present: the whole key
    ],
)
def test_hash_values_parse_the_key_as_hudi_does(
    key: str, fields: list[str], expected: list[str | None]
) -> None:
    assert hash_values(key, fields) == expected


def test_a_key_java_never_finishes_parsing_is_refused() -> None:
    # the last pair is not hashed and its value holds ':': Hudi's parse loops forever
    with pytest.raises(RecordError, match="cannot parse"):
        hash_values("a:1,b:10:00", ["a"])
    assert hash_values("a:1,b:10:00", ["a", "b"]) == ["1", "10:00"]  # hashed: fine


def test_bucket_id_of_known_keys() -> None:
    assert bucket_id("abc", ["id"], 4) == (31 + 96354) % 4 == 1
    # [null, "x"]: (31*1 + 0)*31 + 120 = 1081
    assert bucket_id("a:__null__,b:x", ["a", "b"], 10_000) == 1081
    assert bucket_id("a:__empty__,b:x", ["a", "b"], 10_000) == 1081
    assert bucket_id("a:1,b:x", ["b"], 10_000) == 31 + 120
    assert bucket_id("a:1,b:x", ["b"], 1) == 0


# --- file ids ---------------------------------------------------------------------------------


def test_bucket_file_ids_carry_the_bucket_in_eight_digits() -> None:
    assert bucket_file_id(3) == "00000003-0000-0000-0000-000000000000-0"
    assert bucket_file_id(99_999_999).startswith("99999999-")
    fid = new_bucket_file_id(12, "3f2a9b10-1234-4abc-9def-0123456789ab")
    assert fid == "00000012-1234-4abc-9def-0123456789ab-0"
    assert len(new_bucket_file_id(7)) == len(fid)
    for b in (0, 1, 12, 4095, 99_999_999):
        assert bucket_of_file_id(bucket_file_id(b)) == b
        assert bucket_of_file_id(new_bucket_file_id(b)) == b
    with pytest.raises(ValueError):
        bucket_file_id(100_000_000)
    with pytest.raises(ValueError):
        bucket_file_id(-1)


def test_bucket_file_id_makes_a_valid_base_file_name() -> None:
    t = InstantTime("20240102030405678")
    name = base_file_name(bucket_file_id(5), "0-1-0", t)
    assert bucket_of_file_id(parse_base_file_name(name).file_id) == 5


def test_a_file_id_without_a_bucket_is_refused() -> None:
    assert not is_bucket_file_id("3f2a9b10-1234-4abc-9def-0123456789ab-0")
    with pytest.raises(CorruptTableError, match="does not belong to a bucket"):
        bucket_of_file_id("3f2a9b10-1234-4abc-9def-0123456789ab-0")
    with pytest.raises(CorruptTableError):
        bucket_of_file_id("1234567")


def test_partition_bucket_key_is_hudis_conflict_key() -> None:
    assert partition_bucket_key("dt=2024-01-01", 5) == "dt=2024-01-01_00000005"
    assert partition_bucket_key("", 0) == "_00000000"


# --- the index value --------------------------------------------------------------------------


def test_bucket_index_properties_round_trip() -> None:
    index = BucketIndex(16, ("tenant", "id"), ("id",))
    props = index.properties()
    assert props == {
        "hoodie.index.type": "BUCKET",
        "hoodie.index.bucket.engine": "SIMPLE",
        "hoodie.bucket.index.num.buckets": "16",
        "hoodie.bucket.index.hash.field": "id",
    }
    assert BucketIndex.from_properties(props, ("tenant", "id")) == index
    whole = BucketIndex(8, ("id",))
    assert whole.properties()[BucketIndexProperty.HASH_FIELD] == "id"
    assert BucketIndex.from_properties(whole.properties(), ("id",)) == BucketIndex(
        8, ("id",), ("id",)
    )
    assert BucketIndex.from_properties({"hoodie.index.type": "BLOOM"}, ("id",)) is None
    assert BucketIndex.from_properties({}, ("id",)) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_buckets": 0}, "bucket count"),
        ({"num_buckets": 100_000_001}, "bucket count"),
        ({"num_buckets": True}, "bucket count"),
        ({"record_key_fields": ()}, "at least one"),
        ({"hash_fields": ("other",)}, "not record key fields"),
        ({"record_key_fields": ("a:b",)}, "neither"),
        ({"record_key_fields": ("id", "id")}, "twice"),
    ],
)
def test_bucket_index_refuses_what_hudi_cannot_use(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"num_buckets": 4, "record_key_fields": ("id",), "hash_fields": ()}
    args.update(kwargs)
    with pytest.raises(UnsupportedTableError, match=message):
        BucketIndex(**args)  # type: ignore[arg-type]


def test_a_bucket_count_that_is_not_a_number_is_a_corrupt_table() -> None:
    for text in ("", "x", "²", "-4", "1e3"):
        props = {"hoodie.index.type": "BUCKET", "hoodie.bucket.index.num.buckets": text}
        with pytest.raises(CorruptTableError, match="not a bucket count"):
            BucketIndex.from_properties(props, ("id",))


def test_only_the_simple_engine_is_accepted() -> None:
    props = {"hoodie.index.type": "BUCKET", "hoodie.index.bucket.engine": "CONSISTENT_HASHING"}
    with pytest.raises(UnsupportedTableError, match="SIMPLE"):
        BucketIndex.from_properties(props, ("id",))


# --- the vectorised path ----------------------------------------------------------------------


def _scalar(keys: list[str], index: BucketIndex) -> list[int]:
    return [index.bucket_of(k) for k in keys]


def test_vectorised_buckets_equal_scalar_on_edge_keys() -> None:
    single = ["abc", "", "id:5", "a,b", "x:y,z", "😀é€", "__null__", "polygenelubricants"]
    index = BucketIndex(7, ("id",))
    assert index.buckets_of(pa.array(single)).tolist() == _scalar(single, index)
    composite = [
        "a:1,b:2",
        "a:__null__,b:x",
        "a:é😀,b:,",
        "a:1:2,b:3",
        "zzz",
        "a:,b:",
        "b:1,a:2",
        "a:x,y,b:z",
        "aa:1,b:2",
        ",a:1,b:2",
    ]
    for hash_fields in ((), ("a",), ("b",)):
        index = BucketIndex(13, ("a", "b"), hash_fields)
        assert index.buckets_of(pa.array(composite)).tolist() == _scalar(composite, index)


def test_vectorised_buckets_take_slices_chunks_and_string_types(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bucket_module, "_CHUNK_ROWS", 7)  # many chunks of rows,
    monkeypatch.setattr(bucket_module, "_CHUNK_BYTES", 20)  # each halved for its bytes
    keys = [f"k{i}é" if i % 3 else f"key-{i}" for i in range(20)]
    index = BucketIndex(5, ("id",))
    expected = _scalar(keys, index)
    arr = pa.array(keys)
    assert index.buckets_of(arr).tolist() == expected
    assert index.buckets_of(arr.slice(4, 9)).tolist() == expected[4:13]
    assert index.buckets_of(pa.chunked_array([keys[:7], keys[7:]])).tolist() == expected
    assert index.buckets_of(pa.array(keys, pa.large_string())).tolist() == expected
    assert index.buckets_of(pa.array([], pa.string())).tolist() == []
    assert index.buckets_of(pa.array(["", ""])).tolist() == _scalar(["", ""], index)


def test_vectorised_buckets_refuse_null_keys_and_unparseable_keys() -> None:
    with pytest.raises(Exception, match="null"):
        BucketIndex(4, ("id",)).buckets_of(pa.array(["a", None]))
    with pytest.raises(RecordError):
        BucketIndex(4, ("a", "b"), ("a",)).buckets_of(pa.array(["a:1,b:2", "a:1,b:10:00"]))


def _assert_vectorised_equals_scalar(keys: list[str], index: BucketIndex) -> None:
    """Equal buckets, or both refuse: a key Java Hudi never finishes parsing is refused."""
    try:
        expected = _scalar(keys, index)
    except RecordError:
        with pytest.raises(RecordError):
            index.buckets_of(pa.array(keys, pa.string()))
        return
    assert index.buckets_of(pa.array(keys, pa.string())).tolist() == expected


_ALPHABET = st.sampled_from([*"ab:,_é€😀x0", "__null__", "__empty__", ":", ","])
_VALUE = st.lists(_ALPHABET, max_size=6).map("".join)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(max_size=12) | _VALUE, max_size=30), st.integers(1, 300))
def test_vectorised_equals_scalar_on_random_single_field_keys(
    keys: list[str], num_buckets: int
) -> None:
    _assert_vectorised_equals_scalar(keys, BucketIndex(num_buckets, ("id",)))


@settings(max_examples=150, deadline=None)
@given(
    st.integers(2, 3).flatmap(
        lambda k: st.tuples(
            st.just(k),
            st.lists(st.tuples(*[_VALUE] * k), max_size=25),
            st.sets(st.integers(0, k - 1), min_size=1),
        )
    ),
    st.integers(1, 1000),
)
def test_vectorised_equals_scalar_on_random_composite_keys(
    case: tuple[int, list[tuple[str, ...]], set[int]], num_buckets: int
) -> None:
    k, rows, hashed = case
    fields = ("f1", "f2", "fx")[:k]
    index = BucketIndex(num_buckets, fields, tuple(fields[i] for i in sorted(hashed)))
    keys = [",".join(f"{f}:{v}" for f, v in zip(fields, row, strict=True)) for row in rows]
    _assert_vectorised_equals_scalar(keys, index)


def test_vectorised_path_on_100k_keys_matches_a_sample() -> None:
    rng = np.random.default_rng(29)
    ids = rng.integers(0, 2**40, size=100_000)
    keys = pa.array([f"tenant:t{i % 97},id:{i}" for i in ids.tolist()])
    index = BucketIndex(256, ("tenant", "id"), ("id",))
    got = bucket_ids(keys, ("tenant", "id"), 256, ("id",))
    assert got.dtype == np.int32 and len(got) == 100_000
    sample = rng.integers(0, 100_000, size=200)
    assert [int(got[i]) for i in sample] == [index.bucket_of(keys[int(i)].as_py()) for i in sample]
    assert set(np.unique(got).tolist()) <= set(range(256))
