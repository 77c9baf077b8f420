"""Which class-data archive a Spark start maps or writes (the JVM itself is the integration
test's): file names, the claim a writing run holds, stray parts, the JVM options."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from lakesink.config import SparkStart, build_config
from lakesink.errors import ConfigError
from lakesink.spark.class_archive import (
    JAVA_OPTIONS_KEY,
    ClassArchive,
    archive_path,
    class_archive_for,
    with_java_options,
)
from lakesink.spark.session import QUICK_JIT_OPTION, ingestion_spark_start, with_driver_jit
from lakesink.spark.worker_python import compiled_worker_python


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(proc.stdout)


def test_the_archive_name_follows_the_class_path_settings_only(tmp_path: Path) -> None:
    base = archive_path(tmp_path, {"spark.sql.shuffle.partitions": "2"})
    assert base is not None and base.parent == tmp_path and base.suffix == ".jsa"
    assert archive_path(tmp_path, {"spark.driver.memory": "8g"}) == base
    assert archive_path(tmp_path, {"spark.jars": "/opt/extra.jar"}) != base
    assert archive_path(tmp_path, {"spark.driver.extraClassPath": "/opt/x"}) != base


def test_a_start_without_an_archive_claims_the_writing_and_a_second_start_neither_writes_nor_maps(
    tmp_path: Path,
) -> None:
    first = class_archive_for(tmp_path, {})
    assert first is not None and first.writing and first.part is not None
    assert first.part.exists() and str(os.getpid()) in first.part.name
    assert f"-XX:ArchiveClassesAtExit={first.part}" in first.java_options()
    # this process is alive and writing: another start must not write the same archive
    assert class_archive_for(tmp_path, {}) is None


def test_an_existing_archive_is_mapped(tmp_path: Path) -> None:
    path = archive_path(tmp_path, {})
    assert path is not None
    path.write_bytes(b"archive")
    archive = class_archive_for(tmp_path, {})
    assert archive is not None and not archive.writing
    assert archive.java_options().startswith(f"-XX:SharedArchiveFile={path} ")
    assert "-Xlog:cds=off" in archive.java_options()  # a mismatch is no output of the user's


def test_the_part_of_a_run_that_died_is_removed_and_the_next_start_writes_again(
    tmp_path: Path,
) -> None:
    path = archive_path(tmp_path, {})
    assert path is not None
    stray = tmp_path / f"{path.name}.{_dead_pid()}.part"
    stray.write_bytes(b"half an archive")
    archive = class_archive_for(tmp_path, {})
    assert not stray.exists()
    assert archive is not None and archive.writing and not path.exists()


def test_the_archive_options_follow_the_users_own_driver_options() -> None:
    archive = ClassArchive(Path("/a/x.jsa"), None)
    out = with_java_options({JAVA_OPTIONS_KEY: "-Duser.timezone=UTC", "k": "v"}, archive)
    assert out[JAVA_OPTIONS_KEY].startswith("-Duser.timezone=UTC -XX:SharedArchiveFile=/a/x.jsa")
    assert out["k"] == "v"
    assert with_java_options({}, archive)[JAVA_OPTIONS_KEY].startswith("-XX:SharedArchive")


def test_the_archive_keys_and_their_environment_variables() -> None:
    cfg = build_config(
        {
            "kafka.bootstrap.servers": "h:1",
            "kafka.topics": "t",
            "value.schema": "a INT",
            "table.path": "/t",
        }
    )
    assert cfg.spark_start == SparkStart("~/.cache/lakesink/spark", True, True)
    off = cfg.with_overrides({"spark.class.archive": "false"})
    assert off.spark_start.class_archive is False
    assert SparkStart.from_env({}) == cfg.spark_start
    env = {"LAKESINK_SPARK_START_CACHE_DIR": "/c", "LAKESINK_SPARK_PYTHON_WORKERS_COMPILED": "no"}
    assert SparkStart.from_env(env) == SparkStart("/c", True, False)
    assert SparkStart.from_env({"LAKESINK_SPARK_DRIVER_JIT": "FULL"}).jit == "full"


def test_the_quick_jit_goes_before_the_users_own_driver_options_so_theirs_win() -> None:
    own = {JAVA_OPTIONS_KEY: "-XX:TieredStopAtLevel=4 -Dx=1", "k": "v"}
    out = with_driver_jit(own, "quick")
    assert out[JAVA_OPTIONS_KEY] == f"{QUICK_JIT_OPTION} -XX:TieredStopAtLevel=4 -Dx=1"
    assert out["k"] == "v" and own[JAVA_OPTIONS_KEY] == "-XX:TieredStopAtLevel=4 -Dx=1"
    assert with_driver_jit({}, "quick") == {JAVA_OPTIONS_KEY: QUICK_JIT_OPTION}
    assert with_driver_jit({}, "auto") == {JAVA_OPTIONS_KEY: QUICK_JIT_OPTION}  # no ingestion
    assert with_driver_jit(own, "full") == own


_BASE = {
    "kafka.bootstrap.servers": "h:1",
    "kafka.topics": "t",
    "value.schema": "a INT",
    "table.path": "/t",
}


@pytest.mark.parametrize(
    ("settings", "jit"),
    [
        ({}, "quick"),  # the direct path: the JVM carries no records
        ({"write.path": "dataframe"}, "full"),
        ({"transform.sql": "SELECT * FROM batch"}, "full"),
        ({"write.path": "dataframe", "spark.driver.jit": "quick"}, "quick"),  # a choice stands
        ({"spark.driver.jit": "full"}, "full"),
    ],
)
def test_an_ingestion_compiles_quick_unless_its_rows_go_through_a_dataframe(
    settings: dict[str, str], jit: str
) -> None:
    cfg = build_config({**_BASE, **settings})
    assert cfg.spark_start.jit == settings.get("spark.driver.jit", "auto")
    assert ingestion_spark_start(cfg) == dataclasses.replace(cfg.spark_start, jit=jit)


def test_a_jit_other_than_auto_quick_or_full_is_named_with_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"spark\.driver\.jit.*auto, quick, full"):
        build_config({**_BASE, "spark.driver.jit": "c2"})


def test_the_worker_interpreter_drops_only_sparks_zips_and_runs_this_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("SPARK_HOME", raising=False)
    script = compiled_worker_python(tmp_path, "local[2]")
    assert script is not None and Path(script).parent == tmp_path
    assert compiled_worker_python(tmp_path, "local[2]") == script  # made once
    zips = [str(p) for p in (Path(pyspark.__file__).parent / "python" / "lib").glob("*.zip")]
    assert zips
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "a.py").touch()
    globbed = f"{tmp_path}/g/*"  # an entry the shell must not expand
    shown = subprocess.run(
        [script, "-c", "import os, sys; print(os.environ['PYTHONPATH']); print(sys.executable)"],
        env={**os.environ, "PYTHONPATH": ":".join([*zips, "/kept/one", "/kept two", globbed])},
        capture_output=True,
        text=True,
        check=True,
    )
    path, exe = shown.stdout.splitlines()
    assert path == f"/kept/one:/kept two:{globbed}" and exe == sys.executable
    # where Spark's zip could differ from site-packages, or the user chose: Spark's own way
    assert compiled_worker_python(tmp_path, "spark://h:7077") is None
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    assert compiled_worker_python(tmp_path, "local[2]") is None
    monkeypatch.delenv("SPARK_HOME")
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    assert compiled_worker_python(tmp_path, "local[2]") is None


def test_another_install_of_the_same_spark_gets_an_archive_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the JVM refuses an archive whose jar paths or times differ: another venv with the same
    # jars, or a reinstall, must not map this one's archive (it would only start slower)
    def install(name: str) -> Path:
        jars = tmp_path / name / "pyspark" / "jars"
        jars.mkdir(parents=True)
        for jar in ("spark-core.jar", "spark-sql.jar"):
            (jars / jar).write_bytes(b"same bytes")
            os.utime(jars / jar, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
        return jars.parent / "__init__.py"

    names = {}
    for venv in ("venv-a", "venv-b"):
        monkeypatch.setattr(pyspark, "__file__", str(install(venv)))
        names[venv] = archive_path(tmp_path, {})
    assert names["venv-a"] != names["venv-b"]
    (tmp_path / "venv-b" / "pyspark" / "jars" / "spark-sql.jar").touch()  # reinstalled
    assert archive_path(tmp_path, {}) != names["venv-b"]


def test_a_writing_start_removes_archives_unused_for_30_days_and_mapping_marks_one_used(
    tmp_path: Path,
) -> None:
    old_unused = tmp_path / "spark-4.0.0-0000000000000000.jsa"
    recent = tmp_path / "spark-4.0.0-1111111111111111.jsa"
    for f in (old_unused, recent):
        f.write_bytes(b"archive")
    forty_days = 40 * 86400
    os.utime(old_unused, (0, old_unused.stat().st_mtime - forty_days))
    os.utime(recent, (0, recent.stat().st_mtime - 5 * 86400))
    writer = class_archive_for(tmp_path, {})
    assert writer is not None and writer.writing
    assert not old_unused.exists() and recent.exists()
    # a start that maps an archive bumps its time, so the next pruning keeps it
    path = archive_path(tmp_path, {})
    assert path is not None
    path.write_bytes(b"archive")
    os.utime(path, (0, path.stat().st_mtime - forty_days))
    assert class_archive_for(tmp_path, {}) is not None
    assert path.stat().st_mtime > os.path.getmtime(recent)
