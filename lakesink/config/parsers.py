"""What every configuration key is made of: `Key`, and the parsers that turn a raw value (from a
file, the environment or `--set`) into a typed one or refuse it with the reason."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lakesink import security
from lakesink.errors import ConfigError
from lakesink.settings import parse_kv
from lakesink.storage import StorageError, open_storage


@dataclass(frozen=True, slots=True)
class Key:
    """One configuration key: its name, how to parse it, its default and one line of doc."""

    name: str
    parse: Callable[[Any], Any]
    default: Any
    doc: str
    choices: tuple[str, ...] = ()
    required: bool = False
    secret: bool = False
    """A secret (password, key): parsed into a lakesink.secrets.Secret, never printed."""


def choice(*valid: str) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        text = str(v).strip().lower()
        if text not in valid:
            raise ValueError(f"expected one of {', '.join(valid)}")
        return text

    return parse


def boolean(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError("expected true or false")


def whole_number(v: Any, expected: str) -> int:
    """An integer from an int, an integral float (8.0) or a string of digits; anything else,
    2.5 or "2.5" or true included, is refused with `expected` (never truncated)."""
    if isinstance(v, bool):
        raise ValueError(expected)
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if not v.is_integer():
            raise ValueError(expected)
        return int(v)
    text = str(v).strip().replace("_", "")
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise ValueError(expected)
    return int(text)


def positive_int(v: Any) -> int:
    n = whole_number(v, "expected a positive whole number")
    if n <= 0:
        raise ValueError("expected a positive whole number")
    return n


def optional_positive_int(v: Any) -> int | None:
    if v is None or str(v).strip() == "":
        return None
    return positive_int(v)


def positive_float(v: Any) -> float:
    x = float(v)
    if not 0 < x < float("inf"):  # also refuses nan
        raise ValueError("expected a positive number")
    return x


def fraction(v: Any) -> float:
    x = float(v)
    if not 0 <= x <= 1:  # also refuses nan
        raise ValueError("expected a number from 0 to 1")
    return x


def non_negative_int(v: Any) -> int:
    n = whole_number(v, "expected 0 or a positive whole number")
    if n < 0:
        raise ValueError("expected 0 or a positive whole number")
    return n


def non_negative_float(v: Any) -> float:
    x = float(v)
    if not 0 <= x < float("inf"):  # also refuses nan
        raise ValueError("expected 0 or a positive number")
    return x


def optional_port(v: Any) -> int | None:
    if v is None or str(v).strip() == "":
        return None
    n = whole_number(v, "expected a TCP port from 0 to 65535")
    if not 0 <= n <= 65535:
        raise ValueError("expected a TCP port from 0 to 65535")
    return n


def optional_positive_float(v: Any) -> float | None:
    if v is None or str(v).strip() == "":
        return None
    return positive_float(v)


def optional_secret(v: Any) -> security.Secret | None:
    if v is None or (isinstance(v, str) and not v.strip()):
        return None
    return security.resolve_secret(v)


def table_uri(v: Any) -> str:
    text = str(v).strip()
    if not text:
        raise ValueError("expected a path or a URI such as s3://bucket/prefix")
    try:
        open_storage(text)
    except StorageError as e:
        raise ValueError(str(e)) from None
    return text


def str_list(v: Any) -> tuple[str, ...]:
    if isinstance(v, list | tuple):
        return tuple(str(x).strip() for x in v if str(x).strip())
    return tuple(p.strip() for p in str(v).split(",") if p.strip())


def optional_str(v: Any) -> str | None:
    return None if v is None or str(v).strip() == "" else str(v)


def settings_list(v: Any) -> str | None:
    """A 'k=v,k=v' list, checked at load so a malformed item is named with its key."""
    text = optional_str(v)
    try:
        parse_kv(text)
    except ConfigError as e:
        raise ValueError(str(e)) from None
    return text


def schema_ids(v: Any) -> tuple[int, ...]:
    ids = []
    for item in str_list(v):
        if not item.isdigit() or int(item) >= 2**32:
            raise ValueError(
                f"{item!r} is not a schema id; expected whole numbers from 0 to 4294967295, "
                "separated by commas"
            )
        ids.append(int(item))
    return tuple(ids)


def starting_offsets(v: Any) -> str:
    text = str(v).strip().lower()
    if text in ("earliest", "latest") or text.isdigit():
        return text
    raise ValueError("expected earliest, latest or a timestamp in epoch milliseconds")


def table_version(v: Any) -> int:
    n = whole_number(v, "expected 6 or 8")
    if n not in (6, 8):
        raise ValueError("expected 6 or 8")
    return n


WRITER_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def writer_id(v: Any) -> str | None:
    text = optional_str(v)
    if text is not None and not WRITER_ID_RE.match(text):
        raise ValueError("expected letters, digits, '.', '_' or '-' (at most 128)")
    return text
