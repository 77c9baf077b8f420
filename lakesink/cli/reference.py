"""Generated reference pages of the documentation site: the CLI (from the argparse parser) and
troubleshooting by error class and exit code (from `lakesink.errors`).

`python -m lakesink.cli.reference` rewrites docs/cli.md, docs/troubleshooting.md and
docs/configuration.md; a test fails when a checked-in page differs from what this renders.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lakesink import errors
from lakesink.errors import LakesinkError
from lakesink.storage import base as storage_base

__all__ = [
    "EXIT_CODES",
    "TROUBLESHOOTING",
    "Remedy",
    "commands",
    "error_classes",
    "render_cli",
    "render_troubleshooting",
    "write_pages",
]


@dataclass(frozen=True, slots=True)
class Remedy:
    """What usually causes an error class and what to do about it."""

    causes: str
    fix: str


EXIT_CODES: dict[int, str] = {
    0: "success (for `verify` and `demo`: the audit found every record exactly once)",
    1: "an error of lakesink's root class with no more specific code",
    2: "configuration: a key is missing or invalid, or an optional package is not installed",
    3: "table: missing, corrupted, unsupported, or rows that do not fit its schema",
    4: "commit: the commit did not land (safe to retry), or its outcome is unknown",
    5: "offsets: they would move backwards, leave a gap, or records were deleted before ingestion",
    6: "lock or fencing: the table lock, the heartbeat, or a newer incarnation of the writer",
    7: "Kafka: the brokers cannot be reached, or refuse who we are or what we ask",
    8: "record: a Kafka record cannot be decoded under `errors.tolerance=none`",
    9: "pending-commit store: unreachable or inconsistent (`commit.mode=async`)",
    10: "`verify` or `demo`: the audit found a duplicate, a gap or a mismatch",
    130: "interrupted (a second Ctrl-C; the first ends `ingest` after its batch, exit code 0)",
}
"""Every exit code of the `lakesink` command and what it means."""

TROUBLESHOOTING: dict[str, Remedy] = {
    "LakesinkError": Remedy(
        "an error lakesink raised on purpose that no subclass describes",
        "read the one-line message; rerun with `--debug` for the traceback and Spark's log",
    ),
    "ConfigError": Remedy(
        "a missing required key (`kafka.bootstrap.servers`, `table.path`, ...), a value of the "
        "wrong type or outside its choices, an unknown key, or keys that contradict each other",
        "the message names the key and what would be valid; check it with "
        "`lakesink config check --config FILE`; every key is in the configuration reference",
    ),
    "MissingExtraError": Remedy(
        "an optional package is not installed: hudi-rs for `verify` and the demo, noida-db for "
        "the demo's embedded broker, psycopg for the PostgreSQL lock and pending-commit store",
        "install the extra the message names, e.g. `pip install 'lakesink[verify]'`, "
        "`'lakesink[demo]'` or `'lakesink[postgres]'`",
    ),
    "StorageError": Remedy(
        "the object store (or the disk) failed a request: the endpoint cannot be reached, the "
        "credentials are refused, the bucket does not exist, or the store kept answering 5xx / "
        "throttling past the retries",
        "check `storage.s3.endpoint`, the credentials and the bucket the message names; for "
        "throttling, run again or raise `storage.retry.max` / `storage.retry.timeout.s`; "
        "nothing half-written is visible, and a rerun resumes from the table's offsets",
    ),
    "StorageUnsupportedError": Remedy(
        "the store does not honour conditional writes (create-if-absent, If-Match), which "
        "lakesink needs to publish commits atomically and to hold its lease lock",
        "use a store with conditional writes (see the object storage page), or a local path",
    ),
    "ObjectNotFoundError": Remedy(
        "a file the table references is not in the store (deleted by hand or by a lifecycle rule)",
        "restore the object or point lakesink at a new table path; `lakesink verify` shows "
        "what the table references",
    ),
    "ObjectExistsError": Remedy(
        "another writer created the same object first (a lost create-if-absent race)",
        "nothing to do: lakesink retries or rolls back; seen alone it means two writers use one "
        "writer id",
    ),
    "ObjectChangedError": Remedy(
        "an object changed between read and replace (its ETag moved): another process renewed "
        "or took over the lease lock",
        "nothing to do for the lock: the writer stops and a restart takes the lock again; check "
        "that two processes do not share a writer id",
    ),
    "TableError": Remedy(
        "the table on storage cannot be used as it is",
        "see the subclass in the message; `lakesink table show PATH` prints what is there",
    ),
    "TableNotFoundError": Remedy(
        "`table.path` (or the PATH argument) points at a folder without "
        "`.hoodie/hoodie.properties`",
        "check the path; `lakesink ingest` creates the table on its first start, "
        "`lakesink table create` creates an empty one",
    ),
    "UnsupportedTableError": Remedy(
        "a table version other than 6 or 8, a layout lakesink does not write, or an operation "
        "the table's type lacks (clustering or a base-file listing of a merge-on-read table, "
        "compaction of a copy-on-write one)",
        "point lakesink at a table of version 6 or 8, or at a new path; rewrite a merge-on-read "
        "table with `lakesink table compact`",
    ),
    "CorruptTableError": Remedy(
        "a timeline or commit file that cannot be parsed, or a file a completed instant "
        "references is missing (deleted by hand or by another tool)",
        "do not delete files under the table by hand; restore the missing file from a copy; "
        "`lakesink table timeline PATH` and `lakesink verify` show what is affected",
    ),
    "ReaderError": Remedy(
        "`lakesink verify` read an Iceberg table with pyiceberg, DuckDB or Spark and that engine "
        "failed: the table may be unreadable for its users, or the engine's set-up is broken "
        "(for Spark: the reader environment `scripts/setup-iceberg-reader.sh` builds)",
        "the message names the engine and what it said; read the table with that engine by hand "
        "to tell a broken table from a broken set-up",
    ),
    "SchemaMismatchError": Remedy(
        "the rows of a batch do not fit the table's schema (a changed `value.schema` or "
        "`transform.sql`, a null in a required column, bytes that are not UTF-8 in a string)",
        "keep the schema compatible with the table, or write to a new table; the message names "
        "the column and, when known, the Kafka record",
    ),
    "SchemaEvolutionError": Remedy(
        "a batch's schema changes the table's in a way `schema.evolution` does not allow: a type "
        "change that is not a widening (int to long, float to double), a new required column, "
        "or any change while the key is `off`",
        "make the new field optional or give it a default, keep the old type, or set "
        "`schema.evolution = add-and-widen`; the message names the field (see Schemas)",
    ),
    "InstantArchivedError": Remedy(
        "a time-travel or incremental read asks for an instant older than the active timeline",
        "read from the oldest active instant the message names, or archive less "
        "(`table.services.archive.*`)",
    ),
    "CommitError": Remedy(
        "a commit did not land; nothing it wrote is visible",
        "restart: the batch is replayed and committed once; look at the cause in the message",
    ),
    "CommitConflictError": Remedy(
        "another writer completed a commit touching the same file groups since this one began",
        "restart the writer (its batch is replayed); give each writer its own `writer.id` and, "
        "for many writers, a PostgreSQL lock",
    ),
    "CommitStateUnknownError": Remedy(
        "storage failed while the completed instant was being published, so it may or may not "
        "be visible",
        "restart: recovery looks for the commit id in the timeline before anything is rolled back",
    ),
    "OffsetError": Remedy(
        "Spark's checkpoint and the table disagree about a writer's offsets (a checkpoint of "
        "another table or writer, a table restored from an older copy), or a re-created topic",
        "keep `writer.id` and `checkpoint.location` with the table; deleting the checkpoint is "
        "safe (offsets come from the table); for a re-created topic start a new `writer.id`",
    ),
    "DataLossError": Remedy(
        "retention or `DeleteRecords` removed records below the writer's committed offsets "
        "before they were ingested; or the broker's log end moved back below a batch planned "
        "before a restart (a broker that lost acknowledged records, an unclean leader election)",
        "raise the topic's retention; to pass over the lost range knowingly set "
        "`kafka.fail.on.data.loss=false` (the gap is recorded and `lakesink status` lists it; a "
        "batch planned beyond the log end then ends at the log end, and records the broker "
        "takes at those offsets later are ingested)",
    ),
    "InternalError": Remedy(
        "lakesink reached a state its own code should never produce (a bug)",
        "rerun with `--debug` and report the traceback and log; nothing the failing step "
        "wrote was committed, and a restart recovers as after a crash",
    ),
    "LockError": Remedy(
        "the table lock was not granted in time (another writer or a table service holds it) "
        "or its lease was lost",
        "retry; raise `lock.timeout.s`; on a cluster use `lock.provider=postgres`",
    ),
    "HeartbeatExpiredError": Remedy(
        "the writer's heartbeat stopped long enough (a paused or overloaded driver) that "
        "another process may have rolled its inflight instant back",
        "restart the writer; raise `heartbeat.tolerance.s` when the driver pauses for long",
    ),
    "FencedError": Remedy(
        "a second process started with the same `writer.id`, so this older one is fenced off",
        "stop the older process; run one process per `writer.id`",
    ),
    "KafkaError": Remedy(
        "the brokers in `kafka.bootstrap.servers` do not answer in time, a listed topic does not "
        "exist, or a request failed",
        "check the address and that the topics exist; `--debug` shows librdkafka's own log",
    ),
    "KafkaAuthenticationError": Remedy(
        "wrong SASL user or password, or a TLS certificate the client does not trust",
        "fix `kafka.sasl.*` / `kafka.ssl.*` (see Secured Kafka clusters); retrying does not help",
    ),
    "KafkaAuthorizationError": Remedy(
        "the principal lacks an ACL the request needs (Describe, Read on the topics)",
        "grant the ACLs the message names; retrying does not help",
    ),
    "RecordError": Remedy(
        "a record value does not decode under `value.format` and `value.schema` with "
        "`errors.tolerance=none`; the message names topic, partition and offset. Or the "
        "`transform.arrow` function failed on a batch of records, or returned columns unlike "
        "its result for an empty batch; the message names the function and the records. With "
        "`write.operation=cdc`: a change event without its key's fields, with an operation "
        "that is not c/r/u/d (Debezium) or not in `cdc.op.values`, or an envelope without "
        "`op`, `after` or `before` where its operation needs them",
        "fix the producer, or set `errors.tolerance=all` with a dead-letter topic or table "
        "(see Bad records); for `transform.arrow`, fix the function and run again: nothing of "
        "the batch was published (see Transformations); for change events, see Change data "
        "capture (`cdc.format`, `cdc.op.field`, `cdc.op.values`)",
    ),
    "SchemaRegistryError": Remedy(
        "the schema registry at `schema.registry.url` did not answer within "
        "`schema.registry.retry.s`, or refused lakesink (wrong credentials, an untrusted "
        "certificate)",
        "check the URL (the Confluent-compatible API's base), "
        "`schema.registry.basic.auth.user.info` and `schema.registry.ssl.ca.location` (see "
        "Schemas); nothing of the batch was published, so run again once it answers",
    ),
    "PendingStoreError": Remedy(
        "the pending-commit store (SQLite beside the table, or PostgreSQL at `postgres.dsn`) "
        "cannot be reached or holds an entry that contradicts the table",
        "check `postgres.dsn` and that the server runs; restart: recovery publishes pending "
        "epochs in order",
    ),
}
"""Causes and fixes per error class (every class of lakesink.errors needs one)."""


def error_classes() -> list[type[LakesinkError]]:
    """Every error class of lakesink.errors, then of the storage layer, in definition order."""
    found: list[type[LakesinkError]] = []
    for module in (errors, storage_base):
        own = [
            c
            for _, c in inspect.getmembers(module, inspect.isclass)
            if issubclass(c, LakesinkError) and c.__module__ == module.__name__
        ]
        found += sorted(own, key=lambda c: inspect.getsourcelines(c)[1])
    return found


def _doc(obj: object) -> str:
    return " ".join((inspect.getdoc(obj) or "").split())


def render_troubleshooting() -> str:
    """The troubleshooting page: exit codes, then each error class with causes and fixes."""
    lines = [
        "# Troubleshooting",
        "",
        "Generated by `python -m lakesink.cli.reference` from `lakesink/errors.py` and the CLI's "
        "exit codes; do not edit by hand.",
        "",
        "Every error lakesink raises on purpose is a `LakesinkError`; the `lakesink` command "
        "prints it as one line (`lakesink: error: ...`, no traceback; `--debug` shows one) and "
        "exits with the code of its class. The Python API raises the same classes. "
        "*Retry helps* says whether running the same thing again can succeed.",
        "",
        "## Exit codes",
        "",
        "| code | meaning |",
        "| --- | --- |",
    ]
    lines += [f"| {code} | {text} |" for code, text in EXIT_CODES.items()]
    lines += ["", "## Errors by class", ""]
    for cls in error_classes():
        remedy = TROUBLESHOOTING.get(cls.__name__)
        if remedy is None:
            raise KeyError(f"{cls.__name__} has no entry in lakesink.cli.reference.TROUBLESHOOTING")
        parent = cls.__mro__[1].__name__
        lines += [
            f"### {cls.__name__}",
            "",
            f"Exit code **{cls.exit_code}** · retry helps: **{'yes' if cls.retriable else 'no'}**"
            + (f" · a kind of `{parent}`" if cls is not LakesinkError else ""),
            "",
            _doc(cls),
            "",
            f"- **Causes:** {remedy.causes}.",
            f"- **Fix:** {remedy.fix}.",
            "",
        ]
    return "\n".join(lines).rstrip("\n") + "\n"


def commands(
    parser: argparse.ArgumentParser, prefix: str = ""
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(full command, help, parser) of every command and subcommand under `parser`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                full = f"{prefix} {name}".strip()
                yield full, helps.get(name, ""), sub
                yield from commands(sub, full)


def _options(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction | argparse._HelpAction):
            continue
        name = ", ".join(f"`{s}`" for s in a.option_strings) or f"`{a.dest}` (positional)"
        if a.choices is not None:
            value = " \\| ".join(str(c) for c in a.choices)
        elif a.nargs == 0:
            value = "flag"
        else:
            value = a.metavar if isinstance(a.metavar, str) else a.dest.upper()
        default = "" if a.default in (None, False, [], argparse.SUPPRESS) else f"`{a.default}`"
        extra = " (required)" if a.required and a.option_strings else ""
        text = (a.help or "").replace("|", "\\|")
        repeat = ""
        if isinstance(a, argparse._AppendAction) and "repeatable" not in text:
            repeat = " (repeatable)"
        rows.append(f"| {name} | {value} | {default} | {text}{extra}{repeat} |")
    return rows


def _usage(parser: argparse.ArgumentParser) -> str:
    """The usage line at a fixed width (argparse otherwise follows the terminal's)."""
    fmt = argparse.HelpFormatter(parser.prog, width=100)
    fmt.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, "")
    return fmt.format_help().strip()


def render_cli(parser: argparse.ArgumentParser | None = None) -> str:
    """The CLI reference: every command and subcommand with every option."""
    if parser is None:
        from lakesink.cli.main import build_parser

        parser = build_parser()
    prog = parser.prog
    lines = [
        "# Command-line reference",
        "",
        f"Generated by `python -m lakesink.cli.reference` from `{prog}`'s argument parser; "
        "do not edit by hand. Exit codes and errors: [Troubleshooting](troubleshooting.md). "
        "Configuration keys for `--config` / `--set`: [Configuration](configuration.md).",
        "",
        f"## {prog}",
        "",
        parser.description or "",
        "",
        "```text",
        _usage(parser),
        "```",
        "",
        "| option | value | default | description |",
        "| --- | --- | --- | --- |",
        *_options(parser),
        "",
    ]
    for full, text, sub in commands(parser):
        rows = _options(sub)
        lines += [f"## {prog} {full}", "", f"{text[:1].upper()}{text[1:]}." if text else "", ""]
        lines += ["```text", _usage(sub), "```", ""]
        if rows:
            lines += ["| option | value | default | description |", "| --- | --- | --- | --- |"]
            lines += [*rows, ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def write_pages(docs_dir: Path) -> list[Path]:
    """Rewrite the generated pages under `docs_dir`; returns the paths written."""
    from lakesink.config import render_reference

    pages = {
        "cli.md": render_cli(),
        "troubleshooting.md": render_troubleshooting(),
        "configuration.md": render_reference(),
    }
    out = []
    for name, text in pages.items():
        path = docs_dir / name
        path.write_text(text)
        out.append(path)
    return out


if __name__ == "__main__":
    docs = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parents[2] / "docs"
    for p in write_pages(docs):
        sys.stdout.write(f"wrote {p}\n")
