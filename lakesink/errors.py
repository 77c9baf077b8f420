"""The one exception tree of lakesink.

Every error says whether retrying can help (`retriable`). Messages name the bad value and what
would be valid. The CLI maps each class to an exit code (see `lakesink.cli.main`).
"""

from __future__ import annotations


class LakesinkError(Exception):
    """Root of every error lakesink raises on purpose."""

    retriable: bool = False
    exit_code: int = 1


class InternalError(LakesinkError):
    """lakesink reached a state its own code should never produce: a bug, not a mistake in the
    configuration or the data. Report it with the log (`--debug`); nothing was committed by
    the step that raised it."""


class ConfigError(LakesinkError):
    """A configuration key is missing or has a value that is not valid."""

    exit_code = 2


class TableError(LakesinkError):
    """A table on storage is missing, corrupted or not of a kind lakesink supports."""

    exit_code = 3


class TableNotFoundError(TableError):
    """The path holds no table (no `.hoodie/hoodie.properties`)."""


class UnsupportedTableError(TableError):
    """The table's version, type or layout is one lakesink does not write or read."""


class CorruptTableError(TableError):
    """A timeline or metadata file cannot be parsed, or a file it references is missing."""


class ReaderError(TableError):
    """An engine the audit reads the table with (pyiceberg, DuckDB, Spark) failed to read it:
    the table may be unreadable to users of that engine, or the engine's set-up is broken."""


class SchemaMismatchError(TableError):
    """Rows do not match the table's schema."""


class SchemaEvolutionError(SchemaMismatchError):
    """A batch's schema differs from the table's in a way `schema.evolution` does not allow (a
    type change that is not a widening, a new required column, or any change when the key is
    off); the message names the field and the fix."""


class InstantArchivedError(TableError):
    """A time-travel or incremental read reaches back before the archived instants; only
    instants after the archive boundary can be read as of or from."""


class CommitError(LakesinkError):
    """A commit did not land. Nothing it wrote is visible; retrying the batch is safe."""

    retriable = True
    exit_code = 4


class CommitConflictError(CommitError):
    """Another writer completed a commit touching the same file groups since this one began."""


class CommitStateUnknownError(LakesinkError):
    """We do not know whether the commit landed. Never delete its files; look for the commit id."""

    retriable = True
    exit_code = 4


class OffsetError(LakesinkError):
    """Offsets would move backwards, leave a gap, or overlap what is already committed."""

    exit_code = 5


class DataLossError(OffsetError):
    """Committed offsets lie below the log start: the broker deleted records never ingested; or
    a batch was planned beyond where the log now ends: the broker lost acknowledged records."""


class LockError(LakesinkError):
    """The table lock could not be taken in time, or its lease was lost."""

    retriable = True
    exit_code = 6


class HeartbeatExpiredError(LakesinkError):
    """This writer's heartbeat expired; another process may have rolled its instant back."""

    exit_code = 6


class FencedError(LakesinkError):
    """A newer incarnation of this writer exists; this one must never publish again."""

    exit_code = 6


class KafkaError(LakesinkError):
    """The broker could not be reached or refused a request."""

    retriable = True
    exit_code = 7


class KafkaAuthenticationError(KafkaError):
    """The broker refused who we are: wrong user or password, or a TLS certificate that is not
    trusted. Retrying does not help; fix the kafka.sasl.* / kafka.ssl.* settings."""

    retriable = False


class KafkaAuthorizationError(KafkaError):
    """The broker knows who we are but its ACLs do not allow the request. Retrying does not
    help; grant the principal the ACLs the message names."""

    retriable = False


class RecordError(LakesinkError):
    """A Kafka record could not be deserialized or converted (errors.tolerance=none)."""

    exit_code = 8


class SchemaRegistryError(LakesinkError):
    """The schema registry could not be reached (after retrying for schema.registry.retry.s) or
    refused lakesink's requests (wrong credentials, an untrusted certificate)."""


class PendingStoreError(LakesinkError):
    """The pending-commit store is unreachable or holds an inconsistent entry."""

    retriable = True
    exit_code = 9


class MissingExtraError(ConfigError):
    """An optional dependency is not installed; the message names the extra that brings it
    (`pip install 'lakesink[verify]'`)."""
