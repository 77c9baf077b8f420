"""The Spark driver JVM's class-data archive (spark.class.archive): the suite's session made it
with `python -m lakesink.spark.prepare` (conftest), every later driver start maps it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from integration.conftest import SHORT_LIVED_DRIVER_JVM

_START_AND_SHOW_JVM_ARGS = """
import json, sys
from lakesink.spark.session import get_spark
# -Xshare:on: the JVM refuses to start unless it maps the archive
spark = get_spark("local[1]", {"spark.driver.extraJavaOptions": "-Xshare:on"},
                  class_archive_dir=sys.argv[1])
assert spark.range(10).count() == 10
bean = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
print(json.dumps(list(bean.getInputArguments())))
"""


def test_the_archive_is_made_once_whole_and_a_driver_jvm_starts_from_it(
    class_archive_dir: str | None,
) -> None:
    assert class_archive_dir is not None, "python -m lakesink.spark.prepare made no archive"
    folder = Path(class_archive_dir)
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
    jvm_args = json.loads(started.stdout.strip().splitlines()[-1])
    assert f"-XX:SharedArchiveFile={archives[0]}" in jvm_args
    assert "-Xshare:on" in jvm_args
    assert sorted(folder.glob("*.jsa")) == archives and not list(folder.glob("*.part"))
