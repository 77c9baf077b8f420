"""pyproject.toml declares ranges and extras; the two lock files agree with it: the newest lock
pins every dependency inside its range, the oldest lock pins every core dependency at its
lower bound (what scripts/check-oldest.sh proves in CI)."""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins(name: str) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "requirements" / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" not in line:
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate():
            pins[req.name.lower()] = Version(next(iter(req.specifier)).version)
    return pins


def _requirements(*groups: str) -> list[Requirement]:
    reqs = [Requirement(r) for r in PROJECT["dependencies"]]
    for g in groups:
        reqs += [Requirement(r) for r in PROJECT["optional-dependencies"][g]]
    return [r for r in reqs if r.name != "lakesink"]


def _lower_bound(req: Requirement) -> Version:
    bounds = [Version(s.version) for s in req.specifier if s.operator in (">=", "==")]
    assert bounds, f"{req} has no lower bound"
    return max(bounds)


def test_core_dependencies_are_ranges_with_both_ends() -> None:
    for req in _requirements():
        ops = {s.operator for s in req.specifier}
        assert ops == {">=", "<"}, f"{req}: a library declares a range, not a pin"


def test_demo_broker_and_hudi_rs_are_extras_not_core_dependencies() -> None:
    core = {r.name for r in _requirements()}
    assert not core & {"noida-db", "hudi", "psycopg"}
    extras = PROJECT["optional-dependencies"]
    assert {"postgres", "s3", "demo", "verify", "test", "bench", "docs"} <= set(extras)
    assert [Requirement(r).name for r in extras["demo"]] == ["noida-db"]
    assert [Requirement(r).name for r in extras["verify"]] == ["hudi"]


def test_python_declared_only_as_far_as_ci_runs_it() -> None:
    assert PROJECT["requires-python"] == ">=3.11,<3.12"


@pytest.mark.parametrize("group", ["postgres", "demo", "verify", "test", "bench", "docs"])
def test_newest_lock_pins_every_dependency_inside_its_range(group: str) -> None:
    pins = _pins("lock.txt")
    for req in _requirements(group):
        assert req.name.lower() in pins, f"{req.name} is not in requirements/lock.txt"
        assert req.specifier.contains(pins[req.name.lower()]), (
            f"lock.txt pins {req.name}=={pins[req.name.lower()]} outside {req}: "
            "run bash scripts/lock.sh"
        )


def test_oldest_lock_pins_every_direct_dependency_at_its_lower_bound() -> None:
    pins = _pins("lock-oldest.txt")
    for req in _requirements("postgres", "demo", "verify", "test"):
        assert req.name.lower() in pins, f"{req.name} is not in requirements/lock-oldest.txt"
        lowest = _lower_bound(req)
        pinned = pins[req.name.lower()]
        # the lowest version that exists with a wheel may lie above a round lower bound
        assert req.specifier.contains(pinned) and pinned.release[:2] == lowest.release[:2], (
            f"lock-oldest.txt pins {req.name}=={pinned}, not the lower bound of {req}: "
            "run bash scripts/lock.sh"
        )


@pytest.mark.parametrize("name", ["lock.txt", "lock-oldest.txt"])
def test_locks_were_resolved_from_the_current_dependencies(name: str) -> None:
    keys = ("requires-python", "dependencies", "optional-dependencies")
    canonical = json.dumps({k: PROJECT.get(k) for k in keys}, sort_keys=True)
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    lock = (ROOT / "requirements" / name).read_text()
    assert f"# resolved from pyproject.toml dependencies sha256 {digest}" in lock, (
        f"pyproject.toml's dependencies changed since requirements/{name} was resolved: "
        "run bash scripts/lock.sh"
    )
