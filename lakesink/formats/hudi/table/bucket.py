"""Hudi's simple bucket index: the bucket of a record key, and the file id of a bucket.

A bucket-indexed table holds, in each partition, at most one file group per bucket, and the
first 8 characters of its file id are the bucket number, zero-padded. The bucket of a record is
a function of its `_hoodie_record_key` string alone, so a writer finds the file group of a key
without looking anything up: `(List<String>.hashCode() & 0x7fffffff) % num_buckets`, where the
list holds the key's values for the hash fields as Hudi's `KeyGenUtils.extractRecordKeysByFields`
parses them out of the key string (Hudi 1.x; the hash is Java's, over UTF-16 code units, with
32-bit overflow). Changing the number of buckets of a table that holds data sends existing keys to
other buckets: see `BucketIndex`.

A leaf module: it imports nothing else of the table.
"""

from __future__ import annotations

import enum
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from lakesink.errors import (
    CorruptTableError,
    RecordError,
    SchemaMismatchError,
    UnsupportedTableError,
)

__all__ = [
    "MAX_BUCKETS",
    "BucketIndex",
    "BucketIndexProperty",
    "bucket_file_id",
    "bucket_id",
    "bucket_id_of_values",
    "bucket_id_str",
    "bucket_ids",
    "bucket_of_file_id",
    "hash_values",
    "is_bucket_file_id",
    "java_list_hash",
    "java_string_hash",
    "new_bucket_file_id",
    "partition_bucket_key",
]

MAX_BUCKETS = 100_000_000
"""Hudi reads a bucket back from the first 8 characters of a file id: 8 digits at most."""

# Hudi's placeholders inside a complex key (KeyGenerator.NULL/EMPTY_RECORDKEY_PLACEHOLDER): the
# bucket hash sees null and "" for them, both of hash 0.
NULL_PLACEHOLDER = "__null__"
EMPTY_PLACEHOLDER = "__empty__"
# The suffix of the one file id per bucket that Hudi uses under non-blocking concurrency
# control (BucketIdentifier.CONSTANT_FILE_ID_SUFFIX), then "-0" as every first file of a group.
FIXED_FILE_ID_SUFFIX = "-0000-0000-0000-000000000000-0"
_BUCKET_PREFIX = re.compile(r"^[0-9]{8}")

_MASK32 = 0xFFFFFFFF
_INV31 = pow(31, -1, 1 << 32)  # 31 is odd, hence invertible modulo 2^32
_COLON, _COMMA = ord(":"), ord(",")
_CHUNK_ROWS = 1 << 16  # bound the temporaries (and the power tables) of the vectorised path
_CHUNK_BYTES = 1 << 22


class BucketIndexProperty(enum.StrEnum):
    """Hudi's write configuration of a simple bucket index. Java Hudi keeps no bucket-index key
    of its own in `hoodie.properties` (1.2.0): every Java writer of the table must be given these;
    Spark SQL also merges `hoodie.properties` into its write configuration, so lakesink writes
    them there as well (`BucketIndex.properties`)."""

    INDEX_TYPE = "hoodie.index.type"  # BUCKET
    ENGINE = "hoodie.index.bucket.engine"  # SIMPLE (the default); CONSISTENT_HASHING resizes
    NUM_BUCKETS = "hoodie.bucket.index.num.buckets"  # Hudi's default 256
    HASH_FIELD = "hoodie.bucket.index.hash.field"  # default: the record key fields


def _check_field_names(fields: Iterable[str], what: str) -> None:
    for f in fields:
        if not f or "," in f or ":" in f:
            raise UnsupportedTableError(
                f"{what} {f!r} is not valid for a bucket index: a key field name must be "
                "non-empty and hold neither ',' nor ':' (they separate the parts of a Hudi key)"
            )


@dataclass(frozen=True, slots=True)
class BucketIndex:
    """A table's simple bucket index: `num_buckets` file groups per partition, a key's bucket
    hashed from its values for `hash_fields` (a subset of the record key fields, all of them
    when empty).

    The count is fixed for the table's life: writers find a bucket's file group by the number
    in its file id, never by looking for the key. Under another count most stored keys hash to
    another bucket, so an update lands in a second file group while the old version stays in the
    first (the key is then stored twice, and a delete misses it); with fewer buckets the file
    groups of the higher buckets are never reached again. Hudi (1.2.0) has no in-place change
    for the simple engine: the data is rewritten (its partition-level bucket index rewrites whole
    partitions with insert_overwrite while every writer is stopped); only its CONSISTENT_HASHING
    engine splits and merges buckets.
    """

    num_buckets: int
    record_key_fields: tuple[str, ...]
    hash_fields: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.num_buckets, bool) or not 1 <= self.num_buckets <= MAX_BUCKETS:
            raise UnsupportedTableError(
                f"bucket count {self.num_buckets!r} is not valid; use 1 to {MAX_BUCKETS:,}"
            )
        if not self.record_key_fields:
            raise UnsupportedTableError("a bucket index needs at least one record key field")
        _check_field_names(self.record_key_fields, "record key field")
        _check_field_names(self.hash_fields, "bucket hash field")
        for fields, what in ((self.record_key_fields, "record key"), (self.hash_fields, "hash")):
            if len(set(fields)) != len(fields):
                raise UnsupportedTableError(f"{what} fields {list(fields)} name a field twice")
        extra = [f for f in self.hash_fields if f not in self.record_key_fields]
        if extra:
            raise UnsupportedTableError(
                f"bucket hash fields {extra} are not record key fields "
                f"{list(self.record_key_fields)}; Hudi requires a subset of them"
            )

    @property
    def effective_hash_fields(self) -> tuple[str, ...]:
        return self.hash_fields or self.record_key_fields

    def bucket_of(self, record_key: str) -> int:
        """The bucket of one `_hoodie_record_key`."""
        return bucket_id(record_key, self.effective_hash_fields, self.num_buckets)

    def buckets_of(self, record_keys: pa.Array | pa.ChunkedArray) -> np.ndarray[Any, Any]:
        """The bucket of each key of a column of `_hoodie_record_key` strings (int32)."""
        return bucket_ids(
            record_keys, self.record_key_fields, self.num_buckets, self.effective_hash_fields
        )

    def properties(self) -> dict[str, str]:
        """The write configuration a Java Hudi writer needs to keep this table's layout."""
        p = BucketIndexProperty
        return {
            p.INDEX_TYPE: "BUCKET",
            p.ENGINE: "SIMPLE",
            p.NUM_BUCKETS: str(self.num_buckets),
            p.HASH_FIELD: ",".join(self.effective_hash_fields),
        }

    @classmethod
    def from_properties(
        cls, props: Mapping[str, str], record_key_fields: tuple[str, ...]
    ) -> BucketIndex | None:
        """The bucket index that `props` declare, None when they declare none."""
        p = BucketIndexProperty
        if props.get(p.INDEX_TYPE, "").strip().upper() != "BUCKET":
            return None
        engine = props.get(p.ENGINE, "SIMPLE").strip().upper()
        if engine != "SIMPLE":
            raise UnsupportedTableError(
                f"{p.ENGINE.value}={engine!r} is not supported; lakesink writes only SIMPLE"
            )
        text = props.get(p.NUM_BUCKETS, "256").strip()
        if not re.fullmatch(r"[0-9]{1,9}", text):
            raise CorruptTableError(f"{p.NUM_BUCKETS.value}={text!r} is not a bucket count")
        fields = tuple(f.strip() for f in props.get(p.HASH_FIELD, "").split(",") if f.strip())
        return cls(int(text), record_key_fields, fields)


# --- Java's hashes ---------------------------------------------------------------------------


def _utf16_units(s: str) -> memoryview:
    return memoryview(s.encode("utf-16-le", "surrogatepass")).cast("H")


def _string_hash_u32(s: str) -> int:
    h = 0
    for unit in _utf16_units(s):
        h = (31 * h + unit) & _MASK32
    return h


def _signed(h: int) -> int:
    return h - (1 << 32) if h & 0x80000000 else h


def java_string_hash(s: str) -> int:
    """Java's `String.hashCode()`: over UTF-16 code units (a character beyond the BMP counts as
    its two surrogates), as a signed 32-bit int."""
    return _signed(_string_hash_u32(s))


def java_list_hash(values: Sequence[str | None]) -> int:
    """Java's `List<String>.hashCode()` (a null element hashes to 0), signed 32-bit."""
    h = 1
    for v in values:
        h = (31 * h + (_string_hash_u32(v) if v is not None else 0)) & _MASK32
    return _signed(h)


def bucket_id_of_values(values: Sequence[str | None], num_buckets: int) -> int:
    """The bucket of a key whose hash-field values are `values` (in record key order)."""
    return (java_list_hash(values) & 0x7FFFFFFF) % num_buckets


# --- the key string ---------------------------------------------------------------------------


def _placeholder(value: str) -> str | None:
    if value == NULL_PLACEHOLDER:
        return None
    return "" if value == EMPTY_PLACEHOLDER else value


def hash_values(record_key: str, hash_fields: Sequence[str]) -> list[str | None]:
    """The values the bucket hash reads out of a `_hoodie_record_key`, exactly as Hudi 1.x's
    `KeyGenUtils.extractRecordKeysByFields` does: the whole key unless it holds both ',' and
    ':'; else the values of the `f:v` pairs whose field is a hash field, in key order, a value
    running to the last ',' before the next ':' (so a value may hold ',', and ':' when no ','
    follows it). `__null__` and `__empty__` stand for null and "".

    RecordError for a key on which Hudi's parse never ends: when a pair that is not hashed
    (typically the last one) has a value holding ':' with no ',' before the key's last ':', Java
    Hudi (1.2.0) searches round and round, so no Java writer can place that key; lakesink
    refuses it rather than choose a bucket of its own."""
    if "," not in record_key or ":" not in record_key:
        return [record_key]
    every = not hash_fields or (len(hash_fields) == 1 and not hash_fields[0])
    values: list[str | None] = []
    n = len(record_key)
    done = 0
    while done < n:
        sep1 = record_key.find(":", done)  # found: a ':' always follows `done` here
        field = record_key[done:sep1]
        sep2 = record_key.find(":", sep1 + 1)
        if every or field in hash_fields:
            if sep2 < 0:
                value, done = record_key[sep1 + 1 :], n
            else:
                comma = _last_comma(record_key, sep2)
                while comma < sep1 and sep2 > 0:  # the ':' lies inside the value: look further
                    sep2 = record_key.find(":", sep2 + 1)
                    comma = _last_comma(record_key, sep2)
                if comma > 0:
                    value, done = record_key[sep1 + 1 : comma], comma + 1
                else:
                    value, done = record_key[sep1 + 1 :], n
            values.append(_placeholder(value))
        elif sep2 < 0:
            done = n
        else:
            comma = _last_comma(record_key, sep2)
            while comma < sep1:
                sep2 = record_key.find(":", sep2 + 1)
                if sep2 < 0:  # Java searches again from the start here, round and round
                    raise RecordError(
                        f"record key {record_key!r}: Hudi's bucket index cannot parse it (the "
                        f"value of {field!r}, not a bucket hash field, holds ':' with no ',' "
                        "after it; Java Hudi never finishes such a key)"
                    )
                comma = _last_comma(record_key, sep2)
            done = comma + 1
    return values or [record_key]


def _last_comma(text: str, at: int) -> int:
    """Java's `text.lastIndexOf(",", at)`: -1 when `at` is negative."""
    return text.rfind(",", 0, at + 1) if at >= 0 else -1


def bucket_id(record_key: str, hash_fields: Sequence[str], num_buckets: int) -> int:
    """The bucket of a `_hoodie_record_key`, as Hudi's `BucketIdentifier.getBucketId`."""
    return bucket_id_of_values(hash_values(record_key, hash_fields), num_buckets)


# --- file ids ---------------------------------------------------------------------------------


def bucket_id_str(bucket: int) -> str:
    """Hudi's `bucketIdStr`: the bucket number in 8 digits, zero-padded."""
    if not 0 <= bucket < MAX_BUCKETS:
        raise ValueError(f"bucket {bucket} is out of range 0..{MAX_BUCKETS - 1}")
    return f"{bucket:08d}"


def bucket_file_id(bucket: int) -> str:
    """The one file id of a bucket: `<bucket, 8 digits>-0000-0000-0000-000000000000-0`.

    The same in every partition and for every writer (Hudi's choice under non-blocking
    concurrency control): two writers creating the bucket's file group write the same file id,
    so the conflict rule per file group catches them, and a retried batch finds it again."""
    return bucket_id_str(bucket) + FIXED_FILE_ID_SUFFIX


def new_bucket_file_id(bucket: int, random_uuid: str | None = None) -> str:
    """A file id as Hudi's Spark writer makes one for a new bucket: a UUID whose first 8
    characters are the bucket number, then `-0` (the first file of the group)."""
    text = random_uuid if random_uuid is not None else str(uuid.uuid4())
    return f"{bucket_id_str(bucket)}{text[8:]}-0"


def is_bucket_file_id(file_id: str) -> bool:
    """Whether `file_id` starts with an 8-digit bucket number."""
    return _BUCKET_PREFIX.match(file_id) is not None


def bucket_of_file_id(file_id: str) -> int:
    """The bucket of a file group, from its id (Hudi's `bucketIdFromFileId`)."""
    if not is_bucket_file_id(file_id):
        raise CorruptTableError(
            f"file group {file_id!r} does not belong to a bucket: a bucket-indexed table's "
            "file ids start with the 8-digit bucket number; was this table written without "
            "the bucket index?"
        )
    return int(file_id[:8])


def partition_bucket_key(partition_path: str, bucket: int) -> str:
    """`<partition>_<bucket, 8 digits>`: what Hudi's bucket-index conflict resolution compares
    (`BucketIndexConcurrentFileWritesConflictResolutionStrategy`), so that two writers of one
    bucket conflict whatever file ids they chose."""
    return f"{partition_path}_{bucket_id_str(bucket)}"


# --- the vectorised path ----------------------------------------------------------------------


def bucket_ids(
    record_keys: pa.Array | pa.ChunkedArray,
    record_key_fields: Sequence[str],
    num_buckets: int,
    hash_fields: Sequence[str] = (),
) -> np.ndarray[Any, Any]:
    """`bucket_id` of every key of a string column of `_hoodie_record_key`s, as int32.

    Vectorised over the UTF-16 code units of the whole column: a key's Java hash is
    `31^(b-1) * (S[b] - S[a])` (mod 2^32) from one prefix sum `S[i] = sum(u[j] * 31^-j)`, so every
    substring hash costs O(1). Keys made of the record key fields in order with no ':' inside a
    value (every key lakesink writes whose values hold no ':') are parsed here; any other key goes
    through `bucket_id`, exactly as Hudi parses it."""
    index = BucketIndex(num_buckets, tuple(record_key_fields), tuple(hash_fields))
    chunks = record_keys.chunks if isinstance(record_keys, pa.ChunkedArray) else [record_keys]
    parts = [
        _bucket_ids_chunk(c.slice(i, _CHUNK_ROWS), index)
        for c in chunks
        for i in range(0, len(c), _CHUNK_ROWS)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def _bucket_ids_chunk(keys: pa.Array, index: BucketIndex) -> np.ndarray[Any, Any]:
    n = len(keys)
    if keys.null_count:
        raise SchemaMismatchError(
            f"{keys.null_count} record key(s) are null; every row needs a record key before "
            "its bucket can be found"
        )
    if not pa.types.is_string(keys.type):
        keys = keys.cast(pa.string())
    if n > 1 and _byte_size(keys) > _CHUNK_BYTES:  # long keys: halve until the chunk is small
        half = n // 2
        return np.concatenate(
            (
                _bucket_ids_chunk(keys.slice(0, half), index),
                _bucket_ids_chunk(keys.slice(half), index),
            )
        )
    units, starts, ends = _utf16_column(keys)
    hasher = _SubstringHash(units)
    fields = index.record_key_fields
    if len(fields) == 1:
        has_colon = _counts(np.flatnonzero(units == _COLON), starts, ends) > 0
        has_comma = _counts(np.flatnonzero(units == _COMMA), starts, ends) > 0
        regular = ~(has_colon & has_comma)
        rows = np.flatnonzero(regular)
        h = np.full(n, 0, dtype=np.uint32)
        h[rows] = np.uint32(31) + hasher.hash(starts[rows], ends[rows])
    else:
        h, regular = _complex_keys(units, starts, ends, hasher, index)
    out = ((h & np.uint32(0x7FFFFFFF)).astype(np.int64) % index.num_buckets).astype(np.int32)
    for i in np.flatnonzero(~regular):  # keys Hudi parses its own way: one by one
        out[i] = bucket_id(keys[int(i)].as_py(), index.effective_hash_fields, index.num_buckets)
    return out


def _byte_size(keys: pa.Array) -> int:
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int32)
    return int(offsets[keys.offset + len(keys)]) - int(offsets[keys.offset])


def _counts(
    at: np.ndarray[Any, Any], starts: np.ndarray[Any, Any], ends: np.ndarray[Any, Any]
) -> Any:
    """How many of the sorted positions `at` lie in each [start, end) (separators are rare)."""
    return np.searchsorted(at, ends) - np.searchsorted(at, starts)


def _complex_keys(
    units: np.ndarray[Any, Any],
    starts: np.ndarray[Any, Any],
    ends: np.ndarray[Any, Any],
    hasher: _SubstringHash,
    index: BucketIndex,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """List hashes of keys `f1:v1,...,fk:vk` with exactly k ':' (one after each field name, in
    record key order); the mask of those keys. Hudi's parse of such a key gives back v1..vk."""
    fields = index.record_key_fields
    k = len(fields)
    n = len(starts)
    colon_at = np.flatnonzero(units == _COLON)
    first = np.searchsorted(colon_at, starts)
    regular = (np.searchsorted(colon_at, ends) - first) == k
    rows = np.flatnonzero(regular)
    colons = [colon_at[first[rows] + j] for j in range(k)]
    ok = np.ones(len(rows), dtype=bool)
    for j, f in enumerate(fields):  # the text before each ':' is ",<field>" (or "<field>" first)
        text = (f if j == 0 else "," + f).encode("ascii", "backslashreplace")
        expected = np.frombuffer(text, dtype=np.uint8).astype(np.uint32)
        begin = colons[j] - len(expected)
        if j == 0:
            ok &= begin == starts[rows]
        window = np.clip(begin[:, None] + np.arange(len(expected)), 0, max(len(units) - 1, 0))
        ok &= (units[window] == expected).all(axis=1) if len(units) else False
    regular[rows[~ok]] = False
    rows, colons = rows[ok], [c[ok] for c in colons]
    selected = set(index.effective_hash_fields)
    h = np.full(n, 1, dtype=np.uint32)
    hr = np.full(len(rows), 1, dtype=np.uint32)
    for j, f in enumerate(fields):
        if f not in selected:
            continue
        a = colons[j] + 1
        b = ends[rows] if j == k - 1 else colons[j + 1] - len(fields[j + 1]) - 1
        hv = hasher.hash(a, b)
        for placeholder in (NULL_PLACEHOLDER, EMPTY_PLACEHOLDER):  # stand for null and ""
            hv[_equals(units, a, b, placeholder)] = 0
        hr = hr * np.uint32(31) + hv
    h[rows] = hr
    return h, regular


def _equals(
    units: np.ndarray[Any, Any], a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], text: str
) -> np.ndarray[Any, Any]:
    """Which substrings [a, b) of `units` are `text` (ASCII)."""
    expected = np.frombuffer(text.encode("ascii"), dtype=np.uint8).astype(np.uint32)
    same: np.ndarray[Any, Any] = (b - a) == len(expected)
    at = np.flatnonzero(same)
    if len(at):
        window = a[at][:, None] + np.arange(len(expected))
        same[at] = (units[window] == expected).all(axis=1)
    return same


class _SubstringHash:
    """Java string hashes of any substring of one array of UTF-16 code units, in O(1) each."""

    def __init__(self, units: np.ndarray[Any, Any]) -> None:
        self._pow, inverse = _powers(len(units) + 1)
        self._prefix = np.empty(len(units) + 1, dtype=np.uint32)
        self._prefix[0] = 0
        np.cumsum(units * inverse[: len(units)], dtype=np.uint32, out=self._prefix[1:])

    def hash(self, a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Hashes of [a, b) for each pair (0 for an empty range): `31^(b-1) * (S[b] - S[a])`."""
        last = np.maximum(b - 1, 0)
        out: np.ndarray[Any, Any] = self._pow[last] * (self._prefix[b] - self._prefix[a])
        out[b <= a] = 0
        return out


_POWERS: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] = (
    np.ones(1, dtype=np.uint32),
    np.ones(1, dtype=np.uint32),
)


def _powers(size: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """`31^i` and `31^-i` modulo 2^32 for i < at least `size`, computed once and grown."""
    global _POWERS
    powers = _POWERS  # one read: another thread may replace it, never change it
    if len(powers[0]) >= size:
        return powers
    n = max(size, 2 * len(powers[0]))
    grown = []
    for base in (31, _INV31):
        table = np.empty(n, dtype=np.uint32)
        table[0] = 1
        np.cumprod(np.full(n - 1, base, dtype=np.uint32), dtype=np.uint32, out=table[1:])
        grown.append(table)
    _POWERS = (grown[0], grown[1])
    return _POWERS


def _utf16_column(
    keys: pa.Array,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The UTF-16 code units of every string of `keys`, one array, with each string's start and
    end in it. Pure ASCII (the common case) is taken as it is; otherwise the UTF-8 is decoded,
    a character beyond the BMP becoming its two surrogates."""
    offsets_buf, data_buf = keys.buffers()[1], keys.buffers()[2]
    offsets = np.frombuffer(offsets_buf, dtype=np.int32)[keys.offset : keys.offset + len(keys) + 1]
    offsets = offsets.astype(np.int64)
    base, top = (int(offsets[0]), int(offsets[-1])) if len(offsets) else (0, 0)
    data = (
        np.frombuffer(data_buf, dtype=np.uint8)[base:top]
        if data_buf is not None and top > base
        else np.zeros(0, dtype=np.uint8)
    )
    byte_starts, byte_ends = offsets[:-1] - base, offsets[1:] - base
    if not (data >= 0x80).any():  # ASCII: bytes are the code units
        return data, byte_starts, byte_ends
    lead = (data & 0xC0) != 0x80
    at = np.flatnonzero(lead)
    padded = np.concatenate((data, np.zeros(3, dtype=np.uint8))).astype(np.uint32)
    b0, b1, b2, b3 = (padded[at + i] for i in range(4))
    cp = np.where(
        b0 < 0x80,
        b0,
        np.where(
            b0 < 0xE0,
            ((b0 & 0x1F) << 6) | (b1 & 0x3F),
            np.where(
                b0 < 0xF0,
                ((b0 & 0x0F) << 12) | ((b1 & 0x3F) << 6) | (b2 & 0x3F),
                ((b0 & 0x07) << 18) | ((b1 & 0x3F) << 12) | ((b2 & 0x3F) << 6) | (b3 & 0x3F),
            ),
        ),
    )
    wide = cp >= 0x10000
    width = np.where(wide, 2, 1)
    per_byte = np.zeros(len(data), dtype=np.int64)
    per_byte[at] = width
    before = np.concatenate(([0], np.cumsum(per_byte)))  # code units before each byte
    units = np.zeros(int(before[-1]), dtype=np.uint32)
    pos = before[at]
    units[pos[~wide]] = cp[~wide]
    c = cp[wide] - 0x10000
    units[pos[wide]] = 0xD800 + (c >> 10)
    units[pos[wide] + 1] = 0xDC00 + (c & 0x3FF)
    return units, before[byte_starts], before[byte_ends]
