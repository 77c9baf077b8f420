"""lakesink's optional dependencies and the extras that install them.

The core package (Spark, Arrow, Kafka client) never imports an optional dependency when a module
is imported: each is imported where it is used, through `require`, so that a missing one ends in
a `MissingExtraError` naming the extra to install instead of an ImportError at start.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.util import find_spec
from types import ModuleType

from lakesink.errors import MissingExtraError

__all__ = ["EXTRAS", "Extra", "is_installed", "missing", "require"]


@dataclass(frozen=True, slots=True)
class Extra:
    """One optional dependency: its import name, its distribution name and its extra."""

    module: str
    distribution: str
    extra: str


EXTRAS: dict[str, Extra] = {
    e.module: e
    for e in (
        Extra("hudi", "hudi", "verify"),
        Extra("noida_db", "noida-db", "demo"),
        Extra("obstore", "obstore", "s3"),
        Extra("psycopg", "psycopg", "postgres"),
        Extra("pyiceberg", "pyiceberg", "iceberg"),
    )
}
"""Optional modules by import name."""


def missing(module: str, purpose: str) -> MissingExtraError:
    """The error for `purpose` needing the optional `module`, naming the extra to install."""
    e = EXTRAS[module]
    return MissingExtraError(
        f"{purpose} needs the '{e.distribution}' package, which is not installed: "
        f"pip install 'lakesink[{e.extra}]'"
    )


def is_installed(module: str) -> bool:
    """Whether the optional `module` can be imported (without importing it)."""
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, purpose: str) -> ModuleType:
    """Import the optional `module`, or raise `MissingExtraError` naming its extra."""
    if module not in EXTRAS:
        raise KeyError(f"{module!r} is not an optional dependency of lakesink")
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise missing(module, purpose) from e
