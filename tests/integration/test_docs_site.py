"""The documentation site builds in strict mode, carries every CLI command and option, every
configuration key and every error class, and a broken link fails the build."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lakesink.cli.main import build_parser
from lakesink.cli.reference import commands, error_classes
from lakesink.config import KEYS

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[2]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def _text(site: Path) -> str:
    pages = [p.read_text() for p in site.glob("*.html")]
    return html.unescape(re.sub(r"<[^>]+>", "", "\n".join(pages)))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = _build(ROOT / "mkdocs.yml", out)
    assert built.returncode == 0, built.stderr
    return out


def test_site_has_every_page_of_the_nav_and_the_benchmarks(site: Path) -> None:
    for page in ("index", "getting-started", "concepts", "operations", "configuration", "cli"):
        assert (site / f"{page}.html").is_file()
    bench = (site / "benchmarks.html").read_text()
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    assert html.escape(readme.splitlines()[0].lstrip("# ")) in bench


def test_site_has_every_cli_command_and_option(site: Path) -> None:
    text = _text(site)
    parser = build_parser()
    found = list(commands(parser))
    assert len(found) > 10
    for full, _, sub in found:
        assert f"lakesink {full}" in text
        for action in sub._actions:
            for opt in action.option_strings:
                assert opt in text, f"{opt} of lakesink {full}"


def test_site_has_every_configuration_key(site: Path) -> None:
    text = _text(site)
    assert len(KEYS) > 30
    missing = [k.name for k in KEYS if k.name not in text]
    assert not missing


def test_site_has_every_error_class_and_the_mermaid_diagram(site: Path) -> None:
    text = _text(site)
    assert all(c.__name__ in text for c in error_classes())
    assert 'class="mermaid"' in (site / "concepts.html").read_text()


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    (docs / "operations.md").write_text(
        (docs / "operations.md").read_text() + "\nSee [nowhere](no-such-page.md).\n"
    )
    config = (ROOT / "mkdocs.yml").read_text()
    config = config.replace("docs_dir: docs", f"docs_dir: {docs}")
    config = config.replace("scripts/mkdocs_hooks.py", str(ROOT / "scripts" / "mkdocs_hooks.py"))
    (tmp_path / "mkdocs.yml").write_text(config)
    built = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    assert "no-such-page.md" in built.stderr
