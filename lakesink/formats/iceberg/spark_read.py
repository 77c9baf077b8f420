"""Read an Iceberg table with Spark and Iceberg's own Java runtime, for `lakesink verify`.

This file runs as a script in the Iceberg reader environment (pyspark 4.1 with
iceberg-spark-runtime-4.1_2.13, the SQLite and PostgreSQL JDBC drivers and iceberg-aws-bundle;
`bash scripts/setup-iceberg-reader.sh` builds it), never inside lakesink's own Python: released
Iceberg supports Spark up to 4.1 only.
It imports nothing of lakesink. The request is one JSON object on stdin (so nothing of it, the
catalog's credentials included, shows in the process list):

    {"jars": [...], "catalog": NAME, "catalog_properties": {"catalog-impl": ..., "uri": ...,
     "warehouse": "file:///abs/wh", ...}, "table": "NAME.ns.table", "columns": [...], "out": FILE}

The rows of the table's current snapshot, only `columns`, are written to FILE as Parquet.
Failures end with exit status 1 and one line on stderr that starts with `error:`.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder (lakesink's Iceberg format package) is sys.path[0]: drop it,
# so that no module beside it (inspection.py, errors.py, ...) shadows one of the standard library
# or of pyspark.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import json
from typing import Any


def _session(request: dict[str, Any]) -> Any:
    from pyspark.sql import SparkSession

    prefix = f"spark.sql.catalog.{request['catalog']}"
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("lakesink-verify-iceberg")
        .config("spark.jars", ",".join(request["jars"]))
        .config("spark.driver.memory", os.environ.get("LAKESINK_VERIFY_SPARK_MEMORY", "1g"))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config(prefix, "org.apache.iceberg.spark.SparkCatalog")
    )
    for key, value in request["catalog_properties"].items():
        builder = builder.config(f"{prefix}.{key}", value)
    return builder.getOrCreate()


def main() -> int:
    request = json.loads(sys.stdin.read())
    spark = _session(request)
    try:
        spark.sparkContext.setLogLevel("ERROR")
        rows = spark.read.format("iceberg").load(request["table"]).select(*request["columns"])
        import pyarrow.parquet as pq

        pq.write_table(rows.toArrow(), request["out"])  # collected as Arrow: no Spark write job
    except Exception as e:  # Spark's and Iceberg's errors, reported to the audit in one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"error: {type(e).__name__}: {first[:500]}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
