"""The warm standby keys (standby.*): the active writer's liveness file and the takeover."""

from __future__ import annotations

from lakesink.config.parsers import Key, boolean, positive_float

STANDBY_KEYS: tuple[Key, ...] = (
    Key(
        "standby.liveness.enabled",
        boolean,
        True,
        "The active `lakesink ingest` keeps a liveness file for a warm standby to watch (on an "
        "object store: one PUT per standby.liveness.interval.s); false: none, and no standby "
        "can take this writer over.",
    ),
    Key(
        "standby.liveness.interval.s",
        positive_float,
        1.0,
        "Seconds between renewals of the writer's liveness file, by a background thread of "
        "the active `lakesink ingest` (a warm standby, `ingest --standby`, watches it).",
    ),
    Key(
        "standby.takeover.after.s",
        positive_float,
        4.0,
        "A standby (`ingest --standby`) takes over when the active writer's liveness file has "
        "not been renewed for this many seconds (at least twice standby.liveness.interval.s); "
        "at once when the active writer stopped cleanly.",
    ),
    Key(
        "standby.warmup.query",
        boolean,
        True,
        "A standby runs the ingestion's own query once, one small batch into a scratch table "
        "it then deletes, so the JVM has loaded what the query needs before a takeover; "
        "false: only a tiny job that starts the Python workers.",
    ),
)
