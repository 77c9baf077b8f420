"""Run the notebook API example against an installed lakesink (scripts/check-wheel.sh runs this
with the clean venv's Python, outside the checkout): start the embedded broker, produce sample
events, run examples/notebook.py as a script, then count the table's rows with hudi-rs. Exits
non-zero, saying why, on any difference. (examples/spark_submit_app.py runs under spark-submit
on a standalone cluster in the test suite: tests/integration/test_api_examples.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import hudi
import pyarrow.compute as pc

import lakesink
from lakesink.kafka.embedded_broker import EmbeddedBroker
from lakesink.kafka.producer import produce_sample_events

EVENTS = 1000


def distinct_offsets(table: Path) -> int:
    batches = hudi.HudiTableBuilder.from_base_uri(str(table)).build().read()
    if not batches:
        return 0
    import pyarrow as pa

    rows = pa.Table.from_batches(batches)
    keys = pc.binary_join_element_wise(
        pc.cast(rows["kafka_partition"], pa.string()),
        pc.cast(rows["kafka_offset"], pa.string()),
        ":",
    )
    if len(pc.unique(keys)) != rows.num_rows:
        sys.exit(f"wheel examples: {table} holds duplicate Kafka offsets")
    return rows.num_rows


def run(cmd: list[str], env: dict[str, str], what: str) -> str:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        sys.exit(f"wheel examples: {what} exited {done.returncode}")
    return done.stdout


def main() -> None:
    examples = Path(sys.argv[1]).resolve()
    if not lakesink.__file__ or "site-packages" not in lakesink.__file__:
        sys.exit(f"wheel examples: lakesink imported from {lakesink.__file__}, not the wheel")
    work = Path(tempfile.mkdtemp(prefix="lakesink-wheel-examples-"))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    with EmbeddedBroker(data_dir=work / "broker") as broker:
        bootstrap = broker.bootstrap_servers
        produce_sample_events(bootstrap, "notebook", EVENTS, 2)

        notebook_table = work / "notebook_events"
        out = run(
            [sys.executable, str(examples / "notebook.py")],
            {
                **env,
                "EXAMPLE_BOOTSTRAP_SERVERS": bootstrap,
                "EXAMPLE_TOPIC": "notebook",
                "EXAMPLE_TABLE": str(notebook_table),
            },
            "examples/notebook.py",
        )
        if f"{EVENTS} records" not in out:
            sys.exit(f"wheel examples: notebook.py did not report {EVENTS} records:\n{out}")

    found = distinct_offsets(notebook_table)
    if found != EVENTS:
        sys.exit(f"wheel examples: hudi-rs reads {found} rows from {notebook_table}, not {EVENTS}")
    print(f"wheel examples: notebook.py ingested {EVENTS} records once")


if __name__ == "__main__":
    main()
