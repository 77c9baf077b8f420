"""`python -m lakesink.spark.prepare [DIR]`: make the Spark driver JVM's class-data archive
now (lakesink.spark.class_archive), not at the end of the first run: a container image's build
step, or a test session before its first Spark start. A no-op if the archive exists."""

from __future__ import annotations

import dataclasses
import sys

from lakesink.config import SparkStart
from lakesink.spark.class_archive import archive_path
from lakesink.spark.session import SESSION_DEFAULTS, get_spark


def main(argv: list[str] | None = None) -> int:
    """Make the archive now by one small Spark job (a no-op if it exists)."""
    args = sys.argv[1:] if argv is None else argv
    start = SparkStart.from_env()
    if args:
        start = dataclasses.replace(start, cache_dir=args[0])
    if not start.class_archive:
        print("lakesink: spark.class.archive is false: nothing to prepare", file=sys.stderr)
        return 0
    directory = start.cache_dir
    path = archive_path(directory, SESSION_DEFAULTS)
    if path is None:
        print("lakesink: no java found: no class-data archive", file=sys.stderr)
        return 1
    if path.exists():
        print(path)
        return 0
    spark = get_spark("local[1]", start=start)
    # what every ingestion's driver loads: SQL planning, a shuffle, Arrow batches to a Python
    # worker and back
    counts = spark.range(1000).selectExpr("id % 7 AS k").groupBy("k").count()
    counts.mapInArrow(lambda batches: batches, counts.schema).collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
