"""Spark's Python workers, started from compiled pyspark.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` (and py4j's zip) first on every Python worker's
path. With pip-installed Spark that zip holds the same pyspark as the interpreter's
site-packages, but only as source: Python cannot cache what it compiles from a zip, so every
worker, daemon and Python data source runner compiles pyspark again, about 1.1 s of CPU per
process here (1.9 s against 0.9 s to import what a worker needs), several processes per query
start. The interpreter lakesink hands Spark for its workers (`PYSPARK_PYTHON`) is then a small
script that drops those two zips from PYTHONPATH and runs this interpreter, which imports the
same pyspark compiled once. Only where the zip and site-packages cannot differ: a local master,
Spark from pip (SPARK_HOME unset or pyspark's own folder), `PYSPARK_PYTHON` not set by the user.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import sys
from pathlib import Path

WORKER_PYTHON_ENV = "PYSPARK_PYTHON"


def _spark_zips() -> list[str]:
    import pyspark

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    return sorted(str(p) for p in lib.glob("*.zip"))


def _pip_installed_spark() -> bool:
    import pyspark

    home = os.environ.get("SPARK_HOME")
    own = Path(pyspark.__file__).parent
    return not home or Path(home).resolve() == own.resolve()


def _script(zips: list[str]) -> str:
    drops = "|".join(shlex.quote(z) for z in zips)
    return f"""#!/bin/sh
# lakesink: Spark's Python workers import pyspark compiled from this interpreter's
# site-packages, not from Spark's zips (compiled again at every start):
# lakesink/spark/worker_python.py
set -f  # PYTHONPATH entries are split, never globbed
kept=""
IFS=:
for entry in $PYTHONPATH; do
  case "$entry" in
    {drops}) ;;
    *) kept="${{kept:+$kept:}}$entry" ;;
  esac
done
unset IFS
PYTHONPATH="$kept" exec {shlex.quote(sys.executable)} "$@"
"""


def compiled_worker_python(folder: str | Path, master: str) -> str | None:
    """The path of the worker interpreter script in `folder` (made on first use), or None where
    Spark's own choice stands (see the module doc)."""
    if not master.startswith("local") or os.environ.get(WORKER_PYTHON_ENV):
        return None
    if not _pip_installed_spark():
        return None
    zips = _spark_zips()
    if not zips:
        return None  # nothing on the workers' path to step around
    text = _script(zips)
    name = f"python-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    path = Path(folder).expanduser().absolute() / name
    if path.exists():
        return str(path)
    part = path.with_name(f"{name}.{os.getpid()}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part.write_text(text)
        part.chmod(0o755)
        os.replace(part, path)
    except OSError:
        with contextlib.suppress(OSError):
            part.unlink()
        return None
    return str(path)
