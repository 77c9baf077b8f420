"""The errors of lakesink's Iceberg layer, each under the one root `LakesinkError`.

A commit that did not land (`CommitError`) is kept apart from one whose outcome is unknown
(`CommitStateUnknownError`, from `lakesink.errors`): after the second, files are never deleted and
the table is searched for the commit id first."""

from __future__ import annotations

from lakesink.errors import CommitError, ConfigError, CorruptTableError, TableError


class CatalogError(TableError):
    """The Iceberg catalog is missing, refuses a request, or holds no such table."""


class CatalogNotFoundError(CatalogError):
    """No catalog where the settings point (a SQLite file that does not exist, with creation
    turned off). Retrying does not help: fix `uri`, or allow `create`."""


class CatalogUnavailableError(CatalogError):
    """The catalog could not be reached (database or REST server down, refused login)."""

    retriable = True


class PartitionSpecError(ConfigError):
    """A partition field in the settings is not one lakesink can build (unknown transform, a
    column that does not exist or has the wrong type for the transform)."""


class SummaryLayoutError(CorruptTableError):
    """A snapshot summary carries lakesink's keys in a layout this version does not read."""


class LostToConcurrentCommitError(CommitError):
    """A maintenance commit (a rewrite's REPLACE, an expiry) did not land: a concurrent commit
    changed what it was planned on. Nothing of it is visible; planning it again on the fresh
    metadata may succeed (`lakesink.formats.iceberg.replan`)."""
