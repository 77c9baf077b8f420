"""The file groups of a table and their slices, the values that the file-system view, the
archive and the table services share (a leaf module: it imports nothing else of the table).

A FileGroup contains the file slices written for one file id within one partition; a
FileSlice is one base file of it, written by one instant.
"""

from __future__ import annotations

from dataclasses import dataclass

from lakesink.protocol.instant import InstantTime


@dataclass(frozen=True, slots=True, order=True)
class FileSlice:
    """One base file of a file group, written by one instant."""

    partition_path: str
    file_id: str
    instant_time: InstantTime
    path: str  # relative to the table base path
    file_size_bytes: int = 0
    num_records: int = 0

    @property
    def base_file_name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True)
class FileGroup:
    """The slices of one file id in one partition, oldest first."""

    partition_path: str
    file_id: str
    slices: tuple[FileSlice, ...]

    @property
    def latest(self) -> FileSlice:
        return self.slices[-1]
