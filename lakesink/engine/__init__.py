"""The commit engine: the one way anything changes a table.

`lakesink.engine.transaction.TableTransaction` begins, stages, commits (with requirements and
the conflict rules) and aborts every change — streaming batches, backfills, clustering,
cleans — over a table format (`lakesink.engine.format.TableFormat`; the Hudi table in
`lakesink.formats.hudi.format`). The streaming `Coordinator` and the async committer drive one
transaction per batch. Imports nothing of `lakesink.spark`, `lakesink.formats.hudi.services` or
`lakesink.cli`.
"""
