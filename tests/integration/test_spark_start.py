"""A lighter Spark start: the driver JVM's class-data archive (spark.class.archive), which the
suite's session made with `python -m lakesink.spark.prepare` (conftest) and every later start
maps, Python workers that import compiled pyspark (spark.python.workers.compiled), and the
Python workers' warm-up job (spark.python.workers.warmup), and the driver JVM's client-compiler-only
JIT (spark.driver.jit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from integration.conftest import SHORT_LIVED_DRIVER_JVM

from lakesink.config import SparkStart

_START_AND_SHOW_JVM_ARGS = """
import json, sys
from lakesink.config import SparkStart
from lakesink.spark.session import get_spark
# -Xshare:on: the JVM refuses to start unless it maps the archive
spark = get_spark("local[1]", {"spark.driver.extraJavaOptions": "-Xshare:on"},
                  start=SparkStart(sys.argv[1]))
assert spark.range(10).count() == 10
management = spark._jvm.java.lang.management.ManagementFactory
bean = management.getRuntimeMXBean()
hotspot = management.getPlatformMXBean(
    spark._jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
top_tier = hotspot.getVMOption("TieredStopAtLevel").getValue()
print(json.dumps([list(bean.getInputArguments()), top_tier]))
"""


def test_the_archive_is_made_once_whole_and_a_driver_jvm_starts_from_it(
    spark_start: SparkStart,
) -> None:
    assert spark_start.class_archive, "python -m lakesink.spark.prepare made no archive"
    folder = Path(spark_start.cache_dir)
    archives = sorted(folder.glob("*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 10_000_000, archives
    assert not list(folder.glob("*.part")), "a finished archive leaves no part behind"
    # a second prepare finds it and starts no Spark
    again = subprocess.run(
        [sys.executable, "-m", "lakesink.spark.prepare", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert again.stdout.strip() == str(archives[0])

    started = subprocess.run(
        [sys.executable, "-c", _START_AND_SHOW_JVM_ARGS, str(folder)],
        env={**os.environ, **SHORT_LIVED_DRIVER_JVM},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-3000:]
    jvm_args, top_tier = json.loads(started.stdout.strip().splitlines()[-1])
    assert f"-XX:SharedArchiveFile={archives[0]}" in jvm_args
    assert "-Xshare:on" in jvm_args
    # spark.driver.jit=auto, not an ingestion: the client compiler only, before the user's options
    assert top_tier == "1"
    assert jvm_args.index("-XX:TieredStopAtLevel=1") < jvm_args.index("-Xshare:on")
    assert sorted(folder.glob("*.jsa")) == archives and not list(folder.glob("*.part"))


def test_python_workers_import_pyspark_compiled_from_site_packages_not_from_sparks_zip(
    spark: Any,
) -> None:
    import pyarrow as pa

    def where(batches: Any) -> Any:
        import pyspark

        for _ in batches:
            yield pa.RecordBatch.from_pydict({"module": [pyspark.__file__]})

    found = spark.range(4, numPartitions=2).mapInArrow(where, "module STRING").collect()
    modules = {row.module for row in found}
    assert modules and all(".zip" not in m and m.endswith("__init__.py") for m in modules), modules
    assert modules == {pyspark_file()}


def pyspark_file() -> str:
    import pyspark

    return str(pyspark.__file__)


def test_checkpoints_are_written_through_the_file_system_manager_that_forks_nothing(
    spark: Any, tmp_path: Path
) -> None:
    manager = spark.conf.get("spark.sql.streaming.checkpointFileManagerClass")
    assert manager.endswith(".FileSystemBasedCheckpointFileManager"), manager
    query = (
        spark.readStream.format("rate").option("rowsPerSecond", 5).load()
        .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination(120)
    assert query.exception() is None
    assert (tmp_path / "ck" / "offsets" / "0").exists() and (tmp_path / "ck" / "commits").exists()


def test_the_worker_warmup_imports_the_task_modules_in_workers_the_next_job_reuses(
    spark: Any,
) -> None:
    from lakesink.spark import worker_warmup
    from lakesink.spark.worker_warmup import JOB_GROUP, TASK_MODULES, WorkerWarmup

    sc = spark.sparkContext
    worker_warmup._warmed.discard(sc.applicationId)  # an ingestion earlier may have warmed
    warmup = WorkerWarmup.start(spark)
    assert warmup is not None
    warmup.thread.join(120)
    assert not warmup.thread.is_alive()
    jobs = [
        sc.statusTracker().getJobInfo(j) for j in sc.statusTracker().getJobIdsForGroup(JOB_GROUP)
    ]
    assert jobs and all(j is not None and j.status == "SUCCEEDED" for j in jobs), jobs
    assert WorkerWarmup.start(spark) is None  # once per Spark application
    warmup.stop()  # finished: nothing to cancel

    def loaded(_: Any) -> Any:
        import os
        import sys

        yield os.getpid(), all(m in sys.modules for m in TASK_MODULES)

    slots = sc.defaultParallelism
    found = sc.parallelize(range(slots), slots).mapPartitions(loaded).collect()
    # the next job's tasks run in workers that already hold every module a task imports
    assert found and all(ok for _pid, ok in found), found


def test_stopping_a_running_warmup_cancels_its_job(spark: Any) -> None:
    from lakesink.spark import worker_warmup
    from lakesink.spark.worker_warmup import WorkerWarmup

    sc = spark.sparkContext
    worker_warmup._warmed.discard(sc.applicationId)
    warmup = WorkerWarmup.start(spark)
    assert warmup is not None
    warmup.stop()  # at once: cancels the job if it still runs, waits for the thread
    assert not warmup.thread.is_alive()
    assert sc.parallelize(range(4), 2).count() == 4  # the session is unharmed
