"""A `spark-submit` application that ingests Kafka topics with lakesink's committing sink in a
streaming query of its own, e.g. on a standalone cluster:

    spark-submit --master spark://host:7077 examples/spark_submit_app.py \\
        --bootstrap-servers broker:9092 --topic events --table /data/lakehouse/events --once

Executors need lakesink installed in the same Python environment (PYSPARK_PYTHON). Exit codes
are the `lakesink` command's: 0 done, 2 configuration, 7 Kafka, 8 a bad record, ...
"""

from __future__ import annotations

import argparse
import logging
import sys

from pyspark.sql import SparkSession

import lakesink

EVENT_SCHEMA = (
    "event_id BIGINT, user_id BIGINT, event_type STRING, amount DOUBLE, ts TIMESTAMP, "
    "payload STRING"
)

log = logging.getLogger("spark_submit_app")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--once", action="store_true", help="stop when caught up")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    spark = SparkSession.builder.appName("lakesink-spark-submit").getOrCreate()
    config = {
        "kafka.bootstrap.servers": args.bootstrap_servers,
        "kafka.topics": args.topic,
        "value.format": "json",
        "value.schema": EVENT_SCHEMA,
        "table.path": args.table,
        "metrics.port": args.metrics_port,
    }
    try:
        with lakesink.sink(spark, config) as sink:
            query = (
                lakesink.read_stream(spark, config)
                .writeStream.foreachBatch(sink)
                .option("checkpointLocation", sink.checkpoint_location)
                .trigger(processingTime="1 second")
                .queryName("lakesink-ingest")
                .start()
            )
            try:
                if args.once:
                    sink.await_caught_up(query)
                else:
                    sink.await_termination(query)
            finally:
                query.stop()
            sink.check()
            print(
                f"ingested {sink.stats.records} records in {sink.stats.batches} commits; "
                f"committed offsets {sink.committed}"
            )
    except lakesink.LakesinkError as e:
        log.error("lakesink: %s", e)
        return e.exit_code
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
