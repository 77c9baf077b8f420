"""`lakesink table ...` in-process: readable and --json output, errors without tracebacks."""

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


def test_config_docs_prints_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "docs"]) == 0
    assert "`kafka.bootstrap.servers`" in capsys.readouterr().out
