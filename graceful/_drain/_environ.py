"""Options from code, the environment and defaults: one prefix (``GRACEFUL_``), one way to resolve.

A server that loads the middleware by name (``vllm serve --middleware
graceful.GracefulMiddleware`` calls it with the app alone) can only be configured from
its environment. Each package declares its options once, each with an :class:`Env`: how
its variable (``GRACEFUL_`` + the option's name in capitals) is read, and what the
documentation says its value is. The drain's are in ``_options``, the middleware's in
``graceful/_asgi/_options.py``. A value given in code wins; a variable fills an option the
code leaves unset; else the default. A wrong value is refused with the variable's name,
the value and the fix. This module knows the readers every package shares; a package
with values of its own kind (paths, header names) writes its readers itself.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._durations import parse_duration
from ._errors import ConfigError

__all__ = [
    "PREFIX",
    "UNSET",
    "Env",
    "count",
    "duration",
    "flag",
    "from_environ",
    "is_none",
    "named_object",
    "optional_duration",
    "resolve",
    "table_rows",
    "variable",
    "whole_seconds",
]

PREFIX = "GRACEFUL_"

# Marks an option the caller did not pass: it then comes from the environment, else its default.
UNSET: Any = type("Unset", (), {"__repr__": lambda self: "<from the environment, else the default>"})()

Reader = Callable[[str, str], Any]  # (variable, raw text) -> the option's value; raises ConfigError


class Env:
    """How one option's variable is read (``read``), and its value as the documentation states it."""

    __slots__ = ("read", "value")

    def __init__(self, read: Reader, value: str) -> None:
        self.read = read
        self.value = value


def variable(option: str) -> str:
    return PREFIX + option.upper()


def from_environ(
    table: Mapping[str, Env], options: Iterable[str], environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The options among ``options`` whose variables are set (and not empty), read by ``table``."""
    env = os.environ if environ is None else environ
    found: dict[str, Any] = {}
    for option in options:
        var = variable(option)
        raw = env.get(var, "").strip()
        if raw:
            found[option] = table[option].read(var, raw)
    return found


def resolve(table: Mapping[str, Env], given: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Every option of ``table``: as given in code (not ``UNSET``), else from its variable, else its default."""
    passed = {name: value for name, value in given.items() if value is not UNSET}
    env = from_environ(table, (name for name in table if name not in passed))
    return {name: passed[name] if name in passed else env.get(name, defaults[name]) for name in table}


def table_rows(table: Mapping[str, Env]) -> list[str]:
    """The documentation's rows for ``table``: ``| `GRACEFUL_X` | `x` | value |``."""
    return [f"| `{variable(name)}` | `{name}` | {env.value} |" for name, env in table.items()]


# -- the readers every package shares ------------------------------------------------------------

_NONE = ("none", "off")


def is_none(raw: str) -> bool:
    """Whether a variable says "no value" (``none`` or ``off``)."""
    return raw.lower() in _NONE


def duration(var: str, raw: str) -> float:
    return parse_duration(raw, name=f"environment variable {var}")


def optional_duration(var: str, raw: str) -> float | None:
    return None if is_none(raw) else duration(var, raw)


def flag(var: str, raw: str) -> bool:
    text = raw.lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"environment variable {var}: {raw!r} is not a boolean; use 1 or 0")


def count(var: str, raw: str) -> int | None:
    if is_none(raw):
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(
            f"environment variable {var}: {raw!r} is not a whole number of at least 1; use e.g. 64, or none"
        )
    return int(raw)


def whole_seconds(var: str, raw: str) -> int:
    if not raw.isdigit():
        raise ConfigError(f"environment variable {var}: {raw!r} is not a whole number of seconds; use e.g. 1")
    return int(raw)


def named_object(var: str, raw: str) -> Any:
    """``module:attribute``, imported: hooks and other callables named in a variable."""
    module, _, attribute = raw.partition(":")
    if not module or not attribute:
        raise ConfigError(f"environment variable {var}: {raw!r} must be in format <module>:<attribute>")
    try:
        found: Any = importlib.import_module(module)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"environment variable {var}: cannot import {raw!r} ({exc}); check the module and name"
        ) from None
    if not callable(found):
        raise ConfigError(f"environment variable {var}: {raw!r} is not callable; name a function")
    return found
