"""Table services (seed 003): clean, clustering, archival and lazy rollback of failed writes.

Each service that changes the table is its own transaction of the commit engine
(`lakesink.engine.transaction.TableTransaction`), begun under the table lock with a heartbeat,
so it runs beside any number of writers. Services run inline every N commits
(`lakesink.formats.hudi.services.inline`) or from the CLI (`lakesink table clean | cluster |
archive | rollback`).
"""
