"""The commit engine: the one way anything changes a table, in no format's terms.

`lakesink.engine.transaction.TableTransaction` begins, stages, commits (with requirements and
the conflict rules) and aborts every change — streaming batches, backfills, clustering,
cleans — over a table format (`lakesink.engine.format.TableFormat`: the lock, heartbeats, instants
and rollback are the format's; Hudi's in `lakesink.formats.hudi.format`, Iceberg's in
`lakesink.formats.iceberg.format`). The streaming `Coordinator` and the async committer drive one
transaction per batch; what a format keeps beside its commits (Hudi's intents, recovery and
pre-commit marks) is its coordinator subclass's (`lakesink.formats.<format>.coordinator`).
Imports no format (tests/layering.py), nothing of `lakesink.spark` or `lakesink.cli`.
"""
