"""Base-file names and write tokens."""

from __future__ import annotations

import pytest

from lakesink.errors import CorruptTableError
from lakesink.formats.hudi.table.files import (
    BaseFileName,
    base_file_name,
    is_base_file_name,
    new_file_id,
    parse_base_file_name,
    write_token,
)
from lakesink.protocol.instant import InstantTime

T = InstantTime("20240102030405678")


def test_new_file_id_has_no_underscore_and_is_unique() -> None:
    ids = {new_file_id() for _ in range(100)}
    assert len(ids) == 100
    assert all("_" not in i and i.endswith("-0") for i in ids)


def test_base_file_name_round_trips() -> None:
    fid = new_file_id()
    name = base_file_name(fid, write_token(3, 1, 0), T)
    assert name == f"{fid}_3-1-0_{T}.parquet"
    assert parse_base_file_name(name) == BaseFileName(fid, "3-1-0", T)
    assert parse_base_file_name(name).name == name


@pytest.mark.parametrize(
    "name",
    [
        "abc_0-1-0_20240102030405678.log",
        "abc_0-1_20240102030405678.parquet",
        "a_b_0-1-0_20240102030405678.parquet",
        "abc_0-1-0_2024.parquet",
        ".hoodie_partition_metadata",
    ],
)
def test_parse_rejects_malformed_names(name: str) -> None:
    assert not is_base_file_name(name)
    with pytest.raises(CorruptTableError, match=r"base file name|instant time"):
        parse_base_file_name(name)


def test_bad_file_id_and_token_are_refused() -> None:
    with pytest.raises(ValueError, match="file id"):
        base_file_name("a_b", "0-1-0", T)
    with pytest.raises(ValueError, match="write token"):
        base_file_name("ab", "0-1", T)
    with pytest.raises(ValueError, match="negative"):
        write_token(-1, 0, 0)
