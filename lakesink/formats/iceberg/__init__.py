"""Apache Iceberg tables below lakesink's commit engine, with pyiceberg (the `iceberg` extra).

- `catalog`: open a catalog (SQL on SQLite or PostgreSQL, REST) from `CatalogSettings`;
- `schema`: decoded Arrow schema -> Iceberg schema with field ids; partition fields;
- `datafiles`: what a Spark task does — write Parquet data files, return descriptions;
- `snapshots`: lakesink's snapshot summary (writer, commit id, offsets, VTTS), the lineage walk
  and the append requirement;
- `table`: `IcebergTable`, the operations the engine calls (committed offsets, append with a
  requirement, abort, expire snapshots, remove orphan files);
- `maintenance`: the files a table references, orphan removal.

No module imports pyiceberg when it is imported: a missing extra is a MissingExtraError naming
`lakesink[iceberg]` when the first Iceberg operation runs.
"""
