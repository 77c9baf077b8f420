"""The generated reference pages: checked in and current, and complete (every command, option,
error class and exit code)."""

from __future__ import annotations

import argparse
from pathlib import Path

from lakesink.cli.main import build_parser
from lakesink.cli.reference import (
    EXIT_CODES,
    TROUBLESHOOTING,
    commands,
    error_classes,
    render_cli,
    render_troubleshooting,
)
from lakesink.errors import LakesinkError

DOCS = Path(__file__).parents[2] / "docs"


def test_checked_in_cli_reference_is_current() -> None:
    assert (DOCS / "cli.md").read_text() == render_cli(), "run: python -m lakesink.cli.reference"


def test_checked_in_troubleshooting_is_current() -> None:
    assert (DOCS / "troubleshooting.md").read_text() == render_troubleshooting(), (
        "run: python -m lakesink.cli.reference"
    )


def test_cli_reference_has_every_command_and_option() -> None:
    parser = build_parser()
    page = render_cli(parser)
    found = list(commands(parser))
    assert {"demo", "ingest", "status", "verify", "config docs", "table clean", "backfill"} <= {
        c for c, _, _ in found
    }
    for full, _, sub in found:
        assert f"## lakesink {full}\n" in page
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue  # -h/--help: in every usage line
            for opt in action.option_strings:
                assert f"`{opt}`" in page


def test_every_error_class_has_causes_fixes_and_a_documented_exit_code() -> None:
    classes = error_classes()
    assert classes[0] is LakesinkError and len(classes) > 15
    assert {c.__name__ for c in classes} == set(TROUBLESHOOTING)
    page = render_troubleshooting()
    for cls in classes:
        assert cls.exit_code in EXIT_CODES
        assert f"### {cls.__name__}\n" in page
    for code in EXIT_CODES:
        assert f"| {code} |" in page


def test_exit_codes_match_what_the_cli_returns() -> None:
    import inspect

    from lakesink.cli import demo, main, verify

    # codes the CLI returns itself, beside the error classes' codes
    for module, code in ((verify, 10), (demo, 10), (main, 130)):
        assert f"return {code}" in inspect.getsource(module) or f"else {code}" in (
            inspect.getsource(module)
        )
        assert code in EXIT_CODES


def test_configuration_reference_keeps_placeholders_in_code_and_defaults_as_files_say() -> None:
    """Markdown reads `<name>` outside code as an HTML tag and drops it from the page; the
    defaults read as a TOML file would write them (no Python reprs, no empty code spans)."""
    import re

    from lakesink.config import render_reference

    text = render_reference()
    outside_code = re.sub(r"`[^`]*`", "", text)
    assert not re.findall(r"<[^<>\s]+>", outside_code)
    assert "`<table.path>/.hoodie/.lakesink/checkpoints/<writer.id>`" in text
    assert "``" not in text and "`'" not in text and "`True`" not in text
    assert "| `kafka.fail.on.data.loss` | `true` |" in text


def test_the_site_check_finds_lost_placeholders_and_steps_merged_into_a_paragraph() -> None:
    """scripts/check_docs_html.py (run by scripts/build-docs.sh) on planted mistakes."""
    import importlib.util

    path = Path(__file__).parents[2] / "scripts" / "check_docs_html.py"
    spec = importlib.util.spec_from_file_location("check_docs_html", path)
    assert spec is not None and spec.loader is not None
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    md = "a <table.path>/x and MAP<STRING, T>, `<in code>`, a <br> and <b>bold</b>\n"
    assert check.lost_placeholders(md) == ["<STRING,>", "<table.path>"]
    assert check.lost_placeholders("```\n<fenced>\n```\n") == []
    merged = "<p>2. Write it:\nmore text.\n3. Check it: run</p><p>4. Alone</p>"
    assert check.merged_steps(merged) == ["3. Check it: run"]
