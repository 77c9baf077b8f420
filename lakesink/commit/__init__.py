"""The commit engine: the one way anything changes a table.

`lakesink.commit.transaction.TableTransaction` begins, stages, commits (with requirements and
the conflict rules) and aborts every change — streaming batches, backfills, clustering,
cleans — over a table format (`lakesink.commit.format.TableFormat`; the Hudi table in
`lakesink.commit.hudi`). The streaming `Coordinator` and the async committer drive one
transaction per batch. Imports nothing of `lakesink.spark`, `lakesink.services` or
`lakesink.cli`.
"""
