# %% [markdown]
# # lakesink in a notebook
#
# Ingest Kafka topics into a Hudi table exactly once with the SparkSession you already have,
# watch it, then read the table back. Every cell runs as is in Jupyter (or `python notebook.py`);
# set EXAMPLE_BOOTSTRAP_SERVERS, EXAMPLE_TOPIC and EXAMPLE_TABLE to point it elsewhere.

# %%
import logging
import os

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import lakesink

logging.basicConfig(level=logging.WARNING)  # lakesink logs; it never prints
spark = SparkSession.builder.master("local[2]").appName("notebook").getOrCreate()

# %% The configuration: any lakesink key (docs/configuration.md), as a dict
config = {
    "kafka.bootstrap.servers": os.environ.get("EXAMPLE_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
    "kafka.topics": os.environ.get("EXAMPLE_TOPIC", "events"),
    "value.format": "json",
    "value.schema": "event_id BIGINT, user_id BIGINT, event_type STRING, amount DOUBLE, "
    "ts TIMESTAMP, payload STRING",
    "table.path": os.environ.get("EXAMPLE_TABLE", "lakehouse/notebook_events"),
    "transform.sql": "SELECT *, amount * 100 AS amount_cents FROM source",
}

# %% Ingest what is in the topics now, then stop (drop once=True to keep ingesting)
handle = lakesink.ingest(spark, config, once=True)
handle.await_termination()
status = handle.status()
print(f"{status.records} records in {status.batches} commits; committed {status.committed}")
handle.stop()

# %% Read the table back, with Spark
events = lakesink.read(spark, config["table.path"])
events.groupBy("event_type").agg(F.count("*").alias("events"), F.sum("amount_cents")).show()

# %% Every row carries its Kafka coordinates: nothing twice, nothing missing
per_partition = events.groupBy("kafka_partition").agg(
    F.count("*").alias("rows"),
    F.countDistinct("kafka_offset").alias("distinct_offsets"),
    F.max("kafka_offset").alias("last_offset"),
)
per_partition.orderBy("kafka_partition").show()
