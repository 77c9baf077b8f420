"""A class-data archive of Spark's driver JVM: a lighter start for every later run.

Most of a Spark driver's start is the JVM loading and verifying Spark's classes (~25k). The JVM
can map them from an archive a previous run wrote (Java's AppCDS: `-XX:ArchiveClassesAtExit`,
then `-XX:SharedArchiveFile`), which here cut a session's start from 8.3-10.2 s to 6.2-6.8 s.
The archive is per JVM, Spark install and class path (its file name says which), lives in
`spark.start.cache.dir`, and is made once per machine by the first run that finds none: that
run's JVM writes it when it exits, to a file of its own, which becomes the archive only after
the JVM exited cleanly (a run killed meanwhile leaves a stray part that a later start removes).
The JVM checks an archive before it maps it and ignores one that does not match, so a stale or
foreign file costs the start it would have saved, never correctness. A start that maps an archive
marks it used; a run that writes one removes the archives unused for 30 days (an upgraded JDK or
Spark, a deleted virtualenv), so the folder does not grow by ~150 MB per install for ever.

`python -m lakesink.spark.prepare [DIR]` makes the archive at once (a container image's
build step, or a test session before its first Spark start).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

JAVA_OPTIONS_KEY = "spark.driver.extraJavaOptions"
# The JVM reports archive mismatches and the classes it cannot archive (signed jars) on stdout;
# neither is the user's business: a mismatch only means a slower start.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
_PART = ".part"
_STRAY_PART_AGE_S = 3600.0
_DUMP_WAIT_S = 180.0
# An archive no start mapped for this long belongs to a JDK, Spark or virtualenv that is gone
# (~150 MB each): the next run that writes an archive removes it. Mapping one marks it used.
_UNUSED_ARCHIVE_AGE_S = 30 * 86400.0
_MARK_USED_EVERY_S = 86400.0
# Settings that change the driver's class path: a different one needs an archive of its own.
_CLASS_PATH_KEYS = (
    "spark.jars",
    "spark.jars.packages",
    "spark.driver.extraClassPath",
    "spark.jars.excludes",
    "spark.jars.repositories",
)


def _java_executable() -> Path | None:
    """The `java` Spark's launcher runs: $JAVA_HOME/bin/java, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def _fingerprint(settings: Mapping[str, str]) -> str | None:
    """What the archive must match: the JVM build, Spark's jars and the class-path settings."""
    import pyspark

    java = _java_executable()
    if java is None:
        return None
    parts = [str(java)]
    modules = java.parent.parent / "lib" / "modules"  # the JDK's own classes
    for path in (java, modules):
        with contextlib.suppress(OSError):
            st = path.stat()
            parts.append(f"{path.name}:{st.st_size}:{st.st_mtime_ns}")
    # the JVM checks each jar's path, size and time: another install of the same Spark (another
    # venv) or a reinstall needs an archive of its own
    jars = (Path(pyspark.__file__).parent / "jars").resolve()
    parts.append(str(jars))
    with contextlib.suppress(OSError):
        parts.extend(
            sorted(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in jars.iterdir())
        )
    parts.extend(f"{k}={settings.get(k, '')}" for k in _CLASS_PATH_KEYS)
    parts.append(os.environ.get("SPARK_HOME", ""))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class ClassArchive:
    """The archive for one JVM + Spark + class path, and whether this start maps or writes it."""

    path: Path
    part: Path | None  # set when this run's JVM writes the archive at exit

    @property
    def writing(self) -> bool:
        return self.part is not None

    def java_options(self) -> str:
        if self.part is not None:
            return f"-XX:ArchiveClassesAtExit={self.part} {_QUIET}"
        return f"-XX:SharedArchiveFile={self.path} {_QUIET}"

    def promote_when_the_jvm_exits(self, spark: Any) -> None:
        """At interpreter exit: stop Spark, end its JVM (EOF on its stdin, as pyspark arranges),
        wait while it writes the archive, and make it the archive if the JVM exited cleanly."""
        if self.part is None:
            return
        part = self.part

        def finish() -> None:
            from pyspark import SparkContext

            proc = getattr(SparkContext._gateway, "proc", None)
            with contextlib.suppress(Exception):
                spark.stop()
            if proc is None or proc.stdin is None:
                return
            print(
                "lakesink: saving Spark's classes for faster starts (once per machine): "
                f"{self.path}",
                file=sys.stderr,
                flush=True,
            )
            with contextlib.suppress(Exception):
                proc.stdin.close()
            try:
                code = proc.wait(timeout=_DUMP_WAIT_S)
            except subprocess.TimeoutExpired:  # a slow dump: the next start's to retry
                return
            if code == 0 and part.exists() and part.stat().st_size > 0:
                os.replace(part, self.path)
            else:
                part.unlink(missing_ok=True)

        atexit.register(finish)


def _someone_is_writing(directory: Path, name: str) -> bool:
    """True if a live process is writing `name`; stray parts of dead ones are removed."""
    busy = False
    for part in directory.glob(f"{name}.*{_PART}"):
        pid_text = part.name[len(name) + 1 : -len(_PART)]
        try:
            age = time.time() - part.stat().st_mtime
        except OSError:
            continue
        if pid_text.isdigit() and _alive(int(pid_text)) and age < 86400:
            busy = True
        elif age > _STRAY_PART_AGE_S or not (pid_text.isdigit() and _alive(int(pid_text))):
            part.unlink(missing_ok=True)
    return busy


def _mark_used(path: Path) -> None:
    """Bump the archive's time (at most daily) so that pruning sees it in use."""
    with contextlib.suppress(OSError):
        if time.time() - path.stat().st_mtime > _MARK_USED_EVERY_S:
            os.utime(path)


def _remove_unused_archives(directory: Path, keep: str) -> None:
    """Remove the archives no start has mapped for _UNUSED_ARCHIVE_AGE_S."""
    for old in directory.glob("spark-*.jsa"):
        with contextlib.suppress(OSError):
            if old.name != keep and time.time() - old.stat().st_mtime > _UNUSED_ARCHIVE_AGE_S:
                old.unlink()
                log.info("removed a class archive unused for 30 days: %s", old)


def archive_path(directory: str | Path, settings: Mapping[str, str]) -> Path | None:
    """Where the archive for these settings is (or would be); None if no `java` is found."""
    import pyspark

    fingerprint = _fingerprint(settings)
    if fingerprint is None:
        return None
    return (
        Path(directory).expanduser().absolute() / f"spark-{pyspark.__version__}-{fingerprint}.jsa"
    )


def class_archive_for(directory: str | Path, settings: Mapping[str, str]) -> ClassArchive | None:
    """The archive this start should map, or write if there is none yet (None: neither: no
    `java` found, the folder cannot be made, or another live process is writing it now)."""
    path = archive_path(directory, settings)
    if path is None:
        return None
    folder, name = path.parent, path.name
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.debug("no class archive: %s", exc)
        return None
    if path.exists():
        _mark_used(path)
        return ClassArchive(path, None)
    if _someone_is_writing(folder, name):
        return None
    _remove_unused_archives(folder, keep=name)
    part = folder / f"{name}.{os.getpid()}{_PART}"
    try:
        part.touch()  # claims the writing for this process (the JVM overwrites it at exit)
    except OSError as exc:
        log.debug("no class archive: %s", exc)
        return None
    return ClassArchive(path, part)


def with_driver_java_options(
    settings: Mapping[str, str], *, before: str = "", after: str = ""
) -> dict[str, str]:
    """`settings` with JVM options put before and after the driver's own (of a repeated -XX
    flag the JVM takes the last)."""
    out = dict(settings)
    out[JAVA_OPTIONS_KEY] = " ".join(
        o for o in (before, settings.get(JAVA_OPTIONS_KEY, ""), after) if o
    )
    return out


def with_java_options(settings: Mapping[str, str], archive: ClassArchive) -> dict[str, str]:
    """`settings` with the archive's options added to the driver's own JVM options."""
    return with_driver_java_options(settings, after=archive.java_options())
