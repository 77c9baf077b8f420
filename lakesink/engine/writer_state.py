"""A writer's state as every format records it with a commit: the keys of the commit's
metadata (Hudi: the extra map of the commit file; Iceberg: the snapshot summary) that name the
writer, the Kafka offsets it ingested up to and the ids that tie it to a query, a batch and a
backfill. Their spellings are on-disk contracts: never rename one."""

from __future__ import annotations

WRITER_ID_KEY = "lakesink.writer_id"
OFFSETS_KEY = "lakesink.offsets"  # the writer's next offsets after this commit, all partitions
RANGES_KEY = "lakesink.ranges"  # the ranges this commit ingested
SKIPPED_KEY = "lakesink.skipped"  # spans deleted from Kafka before they were read, passed over
# spans cut off the batch at a restart: the broker's log end had moved back below them
LOST_KEY = "lakesink.lost"
TOPIC_IDS_KEY = "lakesink.topic_ids"  # Kafka's id of each topic the offsets belong to
QUERY_ID_KEY = "lakesink.query_id"
BATCH_ID_KEY = "lakesink.batch_id"
COMMIT_ID_KEY = "lakesink.commit_id"
BACKFILL_ID_KEY = "lakesink.backfill.id"  # digest of a backfill's source files
BACKFILL_SOURCE_KEY = "lakesink.backfill.source"  # the first source files of a backfill
