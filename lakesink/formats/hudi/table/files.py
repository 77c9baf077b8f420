"""Hudi base-file naming: `<fileId>_<writeToken>_<instantTime>.parquet`."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from lakesink.errors import CorruptTableError
from lakesink.protocol.instant import InstantTime

BASE_FILE_EXTENSION = ".parquet"
_TOKEN_RE = re.compile(r"^\d+-\d+-\d+$")
_FILE_ID_RE = re.compile(r"^[A-Za-z0-9-]+$")


def new_file_id() -> str:
    """A fresh file-group id in Hudi's style: a UUID plus `-0` (never contains `_`)."""
    return f"{uuid.uuid4()}-0"


def write_token(task_partition_id: int, stage_id: int, attempt_id: int) -> str:
    """Hudi's write token `<taskPartitionId>-<stageId>-<taskAttemptId>`."""
    for label, v in (
        ("task partition", task_partition_id),
        ("stage", stage_id),
        ("attempt", attempt_id),
    ):
        if v < 0:
            raise ValueError(f"{label} id {v} is negative")
    return f"{task_partition_id}-{stage_id}-{attempt_id}"


def base_file_name(file_id: str, token: str, instant_time: InstantTime | str) -> str:
    """The base file name for one file slice."""
    if not _FILE_ID_RE.match(file_id):
        raise ValueError(f"file id {file_id!r} is not valid: use letters, digits and '-' only")
    if not _TOKEN_RE.match(token):
        raise ValueError(f"write token {token!r} is not valid: expected 'p-s-a' digits")
    return f"{file_id}_{token}_{InstantTime(str(instant_time))}{BASE_FILE_EXTENSION}"


@dataclass(frozen=True, slots=True)
class BaseFileName:
    """The parts of a base file name."""

    file_id: str
    write_token: str
    instant_time: InstantTime

    @property
    def name(self) -> str:
        return base_file_name(self.file_id, self.write_token, self.instant_time)


def parse_base_file_name(name: str) -> BaseFileName:
    """Split a base file name; CorruptTableError naming it if it is not one."""
    if not name.endswith(BASE_FILE_EXTENSION):
        raise CorruptTableError(
            f"{name!r} is not a base file name: no {BASE_FILE_EXTENSION} extension"
        )
    parts = name[: -len(BASE_FILE_EXTENSION)].split("_")
    if len(parts) != 3 or not _FILE_ID_RE.match(parts[0]) or not _TOKEN_RE.match(parts[1]):
        raise CorruptTableError(
            f"{name!r} is not a base file name; expected <fileId>_<p-s-a>_<instantTime>.parquet"
        )
    return BaseFileName(parts[0], parts[1], InstantTime(parts[2]))


def is_base_file_name(name: str) -> bool:
    try:
        parse_base_file_name(name)
    except CorruptTableError:
        return False
    return True
