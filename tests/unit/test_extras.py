"""Optional dependencies: a missing extra is a MissingExtraError naming what to install, and no
lakesink module imports an optional package when it is imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lakesink.errors import ConfigError, LakesinkError, MissingExtraError
from lakesink.extras import EXTRAS, is_installed, require

ROOT = Path(__file__).parents[2]


def _block(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """Make `import module` fail as it does when the package is not installed."""
    monkeypatch.setitem(sys.modules, module, None)


@pytest.mark.parametrize(
    ("module", "extra"),
    [
        ("hudi", "verify"),
        ("noida_db", "demo"),
        ("psycopg", "postgres"),
        ("obstore", "s3"),
        ("pyiceberg", "iceberg"),
    ],
)
def test_require_missing_module_raises_missing_extra_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, extra: str
) -> None:
    _block(monkeypatch, module)
    with pytest.raises(MissingExtraError) as e:
        require(module, "something")
    assert f"pip install 'lakesink[{extra}]'" in str(e.value)
    assert isinstance(e.value, ConfigError) and e.value.exit_code == 2
    assert not is_installed(module)


def test_require_installed_module_returns_it() -> None:
    assert require("hudi", "x").__name__ == "hudi"
    assert all(is_installed(m) for m in EXTRAS)


def test_require_of_a_module_that_is_no_extra_is_a_programming_error() -> None:
    with pytest.raises(KeyError):
        require("json", "x")


def test_hudi_rs_read_without_verify_extra_names_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from lakesink.formats.hudi.audit import read_with_hudi_rs

    _block(monkeypatch, "hudi")
    with pytest.raises(MissingExtraError, match=r"lakesink\[verify\]"):
        read_with_hudi_rs(str(tmp_path))


def test_embedded_broker_without_demo_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from lakesink.kafka.embedded_broker import BINARY_ENV, noida_db_binary

    monkeypatch.delenv(BINARY_ENV, raising=False)
    _block(monkeypatch, "noida_db")
    with pytest.raises(MissingExtraError, match=r"lakesink\[demo\]"):
        noida_db_binary()


@pytest.mark.parametrize(
    "module_path", ["lakesink.formats.hudi.concurrency.pg_lock", "lakesink.engine.pending.postgres"]
)
def test_postgres_backends_without_postgres_extra_name_it(
    monkeypatch: pytest.MonkeyPatch, module_path: str
) -> None:
    import importlib

    mod = importlib.import_module(module_path)
    _block(monkeypatch, "psycopg")
    with pytest.raises(MissingExtraError, match=r"lakesink\[postgres\]"):
        mod._psycopg()


@pytest.mark.parametrize(("module", "extra"), [("hudi", "verify"), ("noida_db", "demo")])
def test_cli_demo_without_an_extra_exits_2_naming_it_before_starting_anything(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    module: str,
    extra: str,
) -> None:
    from lakesink.cli.main import main
    from lakesink.kafka.embedded_broker import BINARY_ENV

    monkeypatch.delenv(BINARY_ENV, raising=False)
    _block(monkeypatch, module)
    assert main(["demo", "--events", "10", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"pip install 'lakesink[{extra}]'" in err
    assert "Traceback" not in err
    assert not any(tmp_path.iterdir()), "nothing may be written when an extra is missing"


def test_every_lakesink_module_imports_without_the_optional_packages() -> None:
    blocked = sorted(EXTRAS)
    code = (
        "import sys, importlib, pkgutil\n"
        f"for m in {blocked!r}: sys.modules[m] = None\n"
        "import lakesink\n"
        "names = [m.name for m in pkgutil.walk_packages(lakesink.__path__, 'lakesink.')]\n"
        "for n in names: importlib.import_module(n)\n"
        f"leaked = [m for m in {blocked!r} if sys.modules.get(m) is not None]\n"
        "assert not leaked, leaked\n"
        "print(len(names))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) > 50  # every module was imported, not an empty walk


def test_missing_extra_is_a_lakesink_error_with_the_configuration_exit_code() -> None:
    assert issubclass(MissingExtraError, LakesinkError)
    assert MissingExtraError.exit_code == 2 and not MissingExtraError.retriable


def test_object_store_table_without_s3_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from lakesink.storage import open_storage

    _block(monkeypatch, "obstore")
    with pytest.raises(MissingExtraError, match=r"lakesink\[s3\]"):
        open_storage("s3://bucket/events", {"storage.s3.region": "us-east-1"})


def test_iceberg_catalog_without_iceberg_extra_names_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from lakesink.formats.iceberg.catalog import CatalogSettings, open_catalog

    _block(monkeypatch, "pyiceberg")
    with pytest.raises(MissingExtraError, match=r"lakesink\[iceberg\]"):
        open_catalog(CatalogSettings(warehouse=str(tmp_path)))
    assert not any(tmp_path.iterdir()), "nothing may be written when an extra is missing"
