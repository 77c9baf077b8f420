"""The layers of lakesink, checked from the modules' own imports (tests/layering.py): the
rules of docs/architecture.md hold and the package has no import cycle. The checker itself is
tested on small synthetic packages with planted violations, so a rule that could never fail is
caught here."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from layering import (
    BELOW_THE_EDGE,
    CONFIG_READERS,
    PENDING,
    REPO_ROOT,
    RULES,
    ImportEdge,
    ImportGraph,
    Rule,
    build_graph,
    main,
    report,
)


@pytest.fixture(scope="module")
def lakesink_graph() -> ImportGraph:
    return build_graph(REPO_ROOT / "lakesink")


def _rule(rule_id: str) -> Rule:
    return next(r for r in RULES if r.id == rule_id)


def _package(root: Path, files: dict[str, str], name: str = "lakesink") -> ImportGraph:
    """A package `name` under `root` with `files` (path relative to the package: source);
    every folder gets an `__init__.py` unless `files` gives one."""
    pkg = root / name
    for rel, source in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source), encoding="utf-8")
    for folder in [pkg, *(p for p in pkg.rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    return build_graph(pkg)


def _pairs(edges: list[ImportEdge]) -> set[tuple[str, str]]:
    return {(e.importer, e.imported) for e in edges}


# ---------------------------------------------------------------------------------------------
# lakesink itself
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_layer_rule_has_no_violation_in_lakesink(lakesink_graph: ImportGraph, rule: Rule) -> None:
    bad = [e for e in rule.violations(lakesink_graph) if (e.importer, e.imported) not in PENDING]
    assert not bad, f"{rule.name}:\n" + "\n".join(e.describe() for e in bad)


def test_pending_layer_debt_lists_only_imports_that_still_break_a_rule(
    lakesink_graph: ImportGraph,
) -> None:
    # tests/layering_pending.txt may only shrink: an import moved behind the registry or into
    # its format must leave the list, so that it cannot come back unnoticed.
    breaking = {(e.importer, e.imported) for r in RULES for e in r.violations(lakesink_graph)}
    assert sorted(PENDING - breaking) == []


def test_lakesink_has_no_import_cycle(lakesink_graph: ImportGraph) -> None:
    cycles = lakesink_graph.cycles()
    assert not cycles, "\n".join(
        " -> ".join(lakesink_graph.shortest_cycle(c))
        + "\n  "
        + "\n  ".join(e.describe() for e in lakesink_graph.cycle_edges(c))
        for c in cycles
    )


def test_lakesink_imports_all_name_modules_that_exist(lakesink_graph: ImportGraph) -> None:
    assert not lakesink_graph.unresolved


def test_lakesink_graph_sees_module_level_and_lazy_imports(lakesink_graph: ImportGraph) -> None:
    # Guards the checks above against a graph that silently finds nothing: the package's
    # front door imports its API module, and some imports are made inside functions.
    assert ("lakesink", "lakesink.api") in _pairs(lakesink_graph.edges_of(frozenset({"module"})))
    assert lakesink_graph.edges_of(frozenset({"function"}))
    assert set(lakesink_graph.modules) >= {
        "lakesink",
        "lakesink.errors",
        "lakesink.formats.hudi.table.view",
    }


# ---------------------------------------------------------------------------------------------
# the checker on synthetic packages
# ---------------------------------------------------------------------------------------------

CLEAN = {
    "errors.py": "class LakesinkError(Exception): ...\n",
    "extras.py": "from lakesink.errors import LakesinkError\n",
    "protocol/offsets.py": "from lakesink.errors import LakesinkError\n",
    "protocol/instant.py": "from .offsets import LakesinkError\n",
    "storage/local.py": "from lakesink.errors import LakesinkError\nfrom lakesink import extras\n",
    "kafka/reader.py": "from lakesink.protocol.offsets import LakesinkError\n",
    "engine/transaction.py": "from lakesink.storage import local\n"
    "from lakesink.kafka import reader\n",
    "formats/hudi/table/view.py": "from lakesink.protocol import instant\n"
    "from lakesink import storage\n",
    "formats/hudi/plugin.py": "from lakesink.engine import transaction\nfrom .table import view\n",
    "formats/iceberg/plugin.py": "from lakesink.engine.transaction import view\n",
    "formats/registry.py": "from lakesink.formats.hudi import plugin\n"
    "from lakesink.formats.iceberg import plugin as p\n",
    "spark/sink.py": "from lakesink.formats import registry\n"
    "from lakesink.engine import transaction\n",
    "cli/main.py": "from lakesink.spark import sink\n"
    "from lakesink.formats.registry import plugin\n"
    "from lakesink import config\n",
    "settings.py": "from lakesink.storage import local\n",
    "config.py": "from lakesink import settings\n",
}


def test_rules_find_nothing_in_a_package_layered_as_designed(tmp_path: Path) -> None:
    graph = _package(tmp_path, CLEAN)
    assert graph.edges  # the imports above were all seen ...
    assert {r.id: r.violations(graph) for r in RULES} == {r.id: [] for r in RULES}
    assert graph.cycles() == [] and graph.unresolved == ()  # ... and none breaks a rule


PLANTED = [
    # errors is the root: it may not even import protocol.
    ("errors", "errors.py", "from lakesink.protocol import offsets\n",
     "lakesink.protocol.offsets"),
    # protocol: a lazy import inside a function counts.
    ("protocol", "protocol/commit.py", "def f():\n    from lakesink.engine import transaction\n",
     "lakesink.engine.transaction"),
    # protocol: a typing-only import counts for the rules too.
    ("protocol", "protocol/commit.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import lakesink.metrics\n",
     "lakesink.metrics"),
    # storage: anything but errors and extras, here through a relative import.
    ("storage", "storage/objectstore.py", "from ..kafka import reader\n", "lakesink.kafka.reader"),
    ("kafka", "kafka/planning.py", "from lakesink.engine.transaction import x\n",
     "lakesink.engine.transaction"),
    # engine: no format, even lazily inside a method, and nothing above.
    ("engine", "engine/coordinator.py",
     "class C:\n    def run(self):\n        from lakesink.formats.hudi.table import view\n",
     "lakesink.formats.hudi.table.view"),
    ("engine", "engine/coordinator.py", "from ..formats import registry\n",
     "lakesink.formats.registry"),
    ("engine", "engine/coordinator.py", "import lakesink.spark.sink\n", "lakesink.spark.sink"),
    # a format never imports another format, nor anything above the formats.
    ("hudi", "formats/hudi/audit.py", "from lakesink.formats.iceberg import plugin\n",
     "lakesink.formats.iceberg.plugin"),
    ("iceberg", "formats/iceberg/audit.py", "from lakesink.formats.hudi.table.view import x\n",
     "lakesink.formats.hudi.table.view"),
    ("iceberg", "formats/iceberg/inspection.py", "from lakesink.cli import main\n",
     "lakesink.cli.main"),
    # spark and cli reach a format through the registry only.
    ("registry", "spark/direct.py", "from lakesink.formats.hudi.table import view\n",
     "lakesink.formats.hudi.table.view"),
    ("registry", "cli/status.py", "def f():\n    import lakesink.formats.iceberg.plugin\n",
     "lakesink.formats.iceberg.plugin"),
    ("spark", "spark/pipeline.py", "from lakesink.cli import main\n", "lakesink.cli.main"),
    # the configuration registry stays at the edge: not even a format's type hints read it ...
    ("config", "formats/hudi/plugin.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lakesink.config import C\n",
     "lakesink.config"),
    # ... nor the typed settings built from it, nor kafka lazily, nor the protocol.
    ("config", "settings.py", "from lakesink import config\n", "lakesink.config"),
    ("config", "kafka/reader.py", "def f():\n    import lakesink.config\n", "lakesink.config"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("rule_id", "module", "source", "imported"),
    PLANTED,
    ids=[f"{rule_id}-{module}" for rule_id, module, _, _ in PLANTED],
)
def test_rule_finds_a_planted_violation(
    tmp_path: Path, rule_id: str, module: str, source: str, imported: str
) -> None:
    planted = {**CLEAN, "metrics.py": "", "config.py": "", module: source}
    graph = _package(tmp_path, planted)
    importer = "lakesink." + module.removesuffix(".py").replace("/", ".")
    assert _pairs(_rule(rule_id).violations(graph)) == {(importer, imported)}
    assert {r.id for r in RULES if r.violations(graph)} == {rule_id}
    assert graph.unresolved == ()


def test_every_top_level_module_is_either_a_config_reader_or_below_the_edge(
    lakesink_graph: ImportGraph,
) -> None:
    top = {m.split(".")[1] for m in lakesink_graph.modules if "." in m}
    assert top == set(CONFIG_READERS) | set(BELOW_THE_EDGE)
    assert not set(CONFIG_READERS) & set(BELOW_THE_EDGE)


def test_every_layer_rule_is_proven_by_a_planted_violation() -> None:
    assert {r.id for r in RULES} == {rule_id for rule_id, _, _, _ in PLANTED}


def test_cycle_finder_sees_a_cycle_hidden_in_a_lazy_import(tmp_path: Path) -> None:
    graph = _package(
        tmp_path,
        {
            "a.py": "from lakesink.b import g\n",
            "b.py": "def g():\n    from lakesink.c import h\n",
            "c.py": "from lakesink import a\n",
            "d.py": "from lakesink import a\n",
        },
    )
    assert graph.cycles() == [["lakesink.a", "lakesink.b", "lakesink.c"]]
    assert graph.shortest_cycle(["lakesink.a", "lakesink.b", "lakesink.c"]) == [
        "lakesink.a",
        "lakesink.b",
        "lakesink.c",
        "lakesink.a",
    ]
    assert [e.kind for e in graph.cycle_edges(["lakesink.a", "lakesink.b", "lakesink.c"])] == [
        "module",
        "function",
        "module",
    ]


def test_cycle_finder_sees_a_cycle_through_a_package_init(tmp_path: Path) -> None:
    # `from lakesink.x import Name` runs lakesink/x/__init__.py, which imports the importer.
    graph = _package(
        tmp_path,
        {
            "x/__init__.py": "from lakesink.x.impl import Thing\n",
            "x/impl.py": "from lakesink.y import helper\n",
            "y.py": "from lakesink.x import Thing\n",
        },
    )
    assert graph.cycles() == [["lakesink.x", "lakesink.x.impl", "lakesink.y"]]


def test_typing_only_import_closes_no_cycle_but_is_listed(tmp_path: Path) -> None:
    graph = _package(
        tmp_path,
        {
            "a.py": "from lakesink.b import B\n",
            "b.py": "import typing\nif typing.TYPE_CHECKING:\n    from lakesink.a import A\n"
            "else:\n    import lakesink.c\n",
            "c.py": "",
        },
    )
    assert graph.cycles() == []
    assert _pairs(graph.edges_of(frozenset({"type_checking"}))) == {("lakesink.b", "lakesink.a")}
    assert ("lakesink.b", "lakesink.c") in _pairs(graph.edges_of(frozenset({"module"})))
    assert graph.cycles(frozenset({"module", "function", "type_checking"})) == [
        ["lakesink.a", "lakesink.b"]
    ]
    text, problems = report(graph, ())
    assert not problems
    assert "lakesink.b -> lakesink.a (line 3, type_checking)" in text


def test_relative_imports_resolve_to_modules_of_the_package(tmp_path: Path) -> None:
    graph = _package(
        tmp_path,
        {
            "formats/hudi/table/view.py": "from .files import name\nfrom . import markers\n"
            "from ....protocol.instant import T\nfrom .... import errors\n",
            "formats/hudi/table/files.py": "",
            "formats/hudi/table/markers.py": "",
            "protocol/instant.py": "",
            "errors.py": "",
            "formats/hudi/table/__init__.py": "from .view import name\n",
        },
    )
    assert _pairs([e for e in graph.edges if e.importer == "lakesink.formats.hudi.table.view"]) == {
        ("lakesink.formats.hudi.table.view", "lakesink.formats.hudi.table.files"),
        ("lakesink.formats.hudi.table.view", "lakesink.formats.hudi.table.markers"),
        ("lakesink.formats.hudi.table.view", "lakesink.protocol.instant"),
        ("lakesink.formats.hudi.table.view", "lakesink.errors"),
    }
    assert ("lakesink.formats.hudi.table", "lakesink.formats.hudi.table.view") in _pairs(
        list(graph.edges)
    )


def test_import_of_a_module_that_does_not_exist_is_reported(tmp_path: Path) -> None:
    graph = _package(tmp_path, {"a.py": "import os\nfrom lakesink.gone import x\n"})
    assert graph.unresolved == ("lakesink.a line 2: lakesink.gone",)
    assert report(graph, ())[1]


def test_report_names_cycles_and_violations_and_main_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _package(
        tmp_path,
        {
            **CLEAN,
            "engine/clean.py": "from lakesink.spark.sink import x\n",
            "spark/sink.py": "def f():\n    from lakesink.engine import clean\n",
        },
    )
    assert main(["--root", str(tmp_path), "--package", "lakesink"]) == 1
    out = capsys.readouterr().out
    assert "Import cycles (strongly connected components): 1" in out
    assert "lakesink.engine.clean, lakesink.spark.sink" in out
    assert "lakesink.spark.sink -> lakesink.engine.clean (line 2, function)" in out
    assert "[engine] the engine imports no format and nothing above it: 1 violations" in out
    assert "lakesink.engine.clean -> lakesink.spark.sink (line 1, module)" in out


def test_report_script_runs_from_the_command_line_and_exits_0_on_a_clean_package(
    tmp_path: Path,
) -> None:
    _package(tmp_path, CLEAN)
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tests" / "layering.py"), "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Import cycles (strongly connected components): 0" in done.stdout
