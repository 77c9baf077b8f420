"""The file groups of a table and their slices, the values that the file-system view, the
archive and the table services share (a leaf module: it imports nothing else of the table).

A FileGroup contains the file slices written for one file id within one partition; a
FileSlice is one base file of it, written by one instant, with the log files written over it
since (merge-on-read); a group whose first writes went to log files has a slice without a
base file.
"""

from __future__ import annotations

from dataclasses import dataclass

from lakesink.protocol.instant import InstantTime


@dataclass(frozen=True, slots=True, order=True)
class FileSlice:
    """One base file of a file group, written by one instant, and its log files."""

    partition_path: str
    file_id: str
    instant_time: InstantTime
    path: str  # relative to the table base path; "" for a slice of log files only
    file_size_bytes: int = 0
    num_records: int = 0
    log_paths: tuple[str, ...] = ()
    """The slice's log files (relative paths) in the order readers apply them."""

    @property
    def base_file_name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def has_base_file(self) -> bool:
        return bool(self.path)


@dataclass(frozen=True, slots=True)
class FileGroup:
    """The slices of one file id in one partition, oldest first."""

    partition_path: str
    file_id: str
    slices: tuple[FileSlice, ...]

    @property
    def latest(self) -> FileSlice:
        return self.slices[-1]
