"""A Java Iceberg read server, run by tests/interop/java_iceberg.py in the peers environment
(scripts/setup-iceberg-reader.sh: pyspark 4.1 with Iceberg's Spark runtime and the SQLite JDBC
driver) — never in lakesink's own.

One Spark session for the whole process. Requests come one per line on stdin as JSON:

    {"ops": [{"op": "catalog", "name": N, "uri": "jdbc:sqlite:/abs/catalog.db",
              "warehouse": "file:///abs/wh"},
             {"op": "read", "table": "N.db.events", "options": {...}, "out": DIR},
             {"op": "sql", "statements": [SQL, ...], "out": DIR}]}

`catalog` registers an Iceberg JdbcCatalog named N over the SQL catalog that pyiceberg writes
(its rows are keyed by the catalog's name, so N is the pyiceberg catalog's name). A read is
`spark.read.format("iceberg").options(...).load(table)` (versionAsOf, timestampAsOf,
start-snapshot-id/end-snapshot-id for incremental appends); its rows, collected as Arrow, are
written as Parquet under DIR. The reply is one JSON line:
{"results": [{"ok": true} | {"ok": false, "error": "..."}]}.
Everything else Spark prints goes to stderr.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from jvm_server import run_sql, serve, session_builder


def _session(jars: str) -> Any:
    return (
        session_builder("lakesink-java-iceberg-interop", jars, "JAVA_ICEBERG_DRIVER_MEMORY")
        .config(
            "spark.sql.extensions",
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        )
        .getOrCreate()
    )


def _register(spark: Any, op: dict[str, Any]) -> None:
    prefix = f"spark.sql.catalog.{op['name']}"
    spark.conf.set(prefix, "org.apache.iceberg.spark.SparkCatalog")
    spark.conf.set(prefix + ".catalog-impl", "org.apache.iceberg.jdbc.JdbcCatalog")
    spark.conf.set(prefix + ".uri", op["uri"])
    spark.conf.set(prefix + ".warehouse", op["warehouse"])
    spark.conf.set(prefix + ".jdbc.schema-version", "V1")


def _handle(spark: Any, op: dict[str, Any]) -> dict[str, Any]:
    kind = op["op"]
    if kind == "catalog":
        _register(spark, op)
        return {"ok": True}
    if kind == "read":
        df = spark.read.format("iceberg").options(**op.get("options", {})).load(op["table"])
    elif kind == "sql":
        df = run_sql(spark, op["statements"])
        assert df is not None
    else:
        raise ValueError(f"unknown op {kind!r}")
    # collected as Arrow and written by pyarrow: no Spark write job per read
    import pyarrow.parquet as pq

    os.makedirs(op["out"], exist_ok=True)
    pq.write_table(df.toArrow(), os.path.join(op["out"], "rows.parquet"))
    return {"ok": True}


def main() -> int:
    return serve(lambda: _session(sys.argv[1]), _handle)


if __name__ == "__main__":
    sys.exit(main())
