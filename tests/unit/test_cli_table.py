"""`lakesink table ...`, `config docs` and `ingest`'s early refusals in-process: readable and --json
output, errors without tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from lakesink.cli.main import main
from lakesink.formats.hudi.table.hudi_table import HudiTable
from lakesink.formats.hudi.table.metadata import CommitMetadata
from lakesink.formats.hudi.table.writer import PartitionedWriter
from lakesink.protocol.instant import Action, InstantTime


def _table_with_one_commit(path: Path) -> HudiTable:
    assert (
        main(
            [
                "table",
                "create",
                str(path),
                "--name",
                "events",
                "--record-key",
                "id",
                "--partition-by",
                "kind",
            ]
        )
        == 0
    )
    table = HudiTable.open(path)
    t = InstantTime.from_epoch_ms(1_700_000_000_000)
    inflight = table.timeline().begin(Action.COMMIT, t)
    writer = PartitionedWriter(table, t, "0-0-0")
    writer.write(pa.table({"id": [1, 2, 3], "kind": ["a", "b", "a"]}))
    schema = writer.avro_schema
    files = writer.close()
    table.timeline().publish(inflight, CommitMetadata("INSERT", tuple(files), {}, schema or "", {}))
    return table


def test_show_timeline_files_readable_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "events"
    _table_with_one_commit(path)
    capsys.readouterr()
    assert main(["table", "show", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["name"] == "events" and info["files"] == 2 and info["completed"] == 1
    assert main(["table", "files", str(path)]) == 0
    out = capsys.readouterr().out
    assert "kind=a" in out and "kind=b" in out
    assert main(["table", "timeline", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["action"], r["state"], r["records"]) for r in rows] == [("commit", "completed", "3")]


def test_not_a_table_is_one_line_with_the_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["table", "show", str(tmp_path / "nothing")])
    err = capsys.readouterr().err
    assert code == 3
    assert str(tmp_path / "nothing") in err and "Traceback" not in err


def test_version_names_the_installed_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"lakesink {version('lakesink')}"


def test_config_docs_prints_every_key_as_a_terminal_table(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from lakesink.config import render_reference
    from lakesink.config.reference import documented_keys

    monkeypatch.setenv("COLUMNS", "90")
    assert main(["config", "docs"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["KEY", "DEFAULT", "DESCRIPTION"]
    starts = {line.split()[0] for line in lines[1:] if line and not line[0].isspace()}
    # one row per key (each table's route keys too), continuation lines indented
    assert starts == {k.name for k in documented_keys()}
    # no Markdown, no Python reprs: defaults as a configuration file writes them
    assert "`" not in out and "| ---" not in out
    starting = next(line for line in lines if line.startswith("kafka.starting.offsets "))
    assert starting.split()[1] == "earliest"
    loss = next(line for line in lines if line.startswith("kafka.fail.on.data.loss "))
    assert loss.split()[1] == "true"
    long_words = [line for line in lines if len(line) > 90 and " " in line.strip()]
    assert not long_words, long_words  # wrapped to the terminal (a lone long key may overflow)
    assert main(["config", "docs", "--markdown"]) == 0
    assert capsys.readouterr().out == render_reference()


@pytest.mark.parametrize("under", [False, True])
def test_ingest_refuses_a_table_path_that_is_a_file_before_kafka_or_spark(
    under: bool,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lakesink.cli import ingest

    def no_brokers(*args: object) -> None:
        raise AssertionError("the brokers were asked before the table path was checked")

    monkeypatch.setattr(ingest, "check_brokers", no_brokers)
    afile = tmp_path / "events.parquet"
    afile.write_bytes(b"not a table")
    table = afile / "t" if under else afile
    sets = {
        "kafka.bootstrap.servers": "127.0.0.1:1",
        "kafka.topics": "t",
        "value.format": "raw",
        "table.path": str(table),
    }
    code = main(["ingest", "--once", *(a for k, v in sets.items() for a in ("--set", f"{k}={v}"))])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"lakesink: error: table.path={table} ")
    assert "a file, not a directory" in err[0] and (str(afile) in err[0])
    assert afile.read_bytes() == b"not a table"


def test_a_path_under_an_unknown_users_home_is_one_line_naming_the_key(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from lakesink.cli import ingest

    def no_brokers(*args: object) -> None:
        raise AssertionError("the brokers were asked before the paths were checked")

    monkeypatch.setattr(ingest, "check_brokers", no_brokers)
    sets = {
        "kafka.bootstrap.servers": "127.0.0.1:1",
        "kafka.topics": "t",
        "value.format": "raw",
        "table.path": "/tmp/lakesink-unused-table",
        "checkpoint.location": "~lakesink-no-such-user/cp",
    }
    code = main(["ingest", "--once", *(a for k, v in sets.items() for a in ("--set", f"{k}={v}"))])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("lakesink: error: checkpoint.location=~lakesink-no-such-user/cp: ")
    assert "names no user's home directory" in err[0]
