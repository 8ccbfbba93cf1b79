"""Options, each declared once: its default, its ``GRACEFUL_*`` variable, how that is read, and its doc.

A server that loads the middleware by name (``vllm serve --middleware
graceful.GracefulMiddleware`` calls it with the app alone) can only be configured from
its environment. Each option is a field of an options dataclass (``Budget`` and
``DrainConfig`` in this package, ``MiddlewareConfig`` in ``graceful/_asgi/_options.py``),
declared with :func:`option`: the default, an :class:`Env` (how its variable, ``GRACEFUL_``
+ the option's name in capitals, is read, and what the documentation says of it). A value
given in code wins; a variable fills an option the code leaves unset; else the default. A
wrong value is refused with the variable's name, the value and the fix.

This module never reads the process's environment: the edges that do (the constructors of
``Drain`` and ``GracefulMiddleware``, and the CLI) pass it in. It knows the readers every
package shares; a package with values of its own kind (paths, header names) writes its
readers itself.
"""

from __future__ import annotations

import importlib

from ._durations import parse_duration
from ._errors import ConfigError
from ._names import PREFIX, variable

# typing's import costs the preStop hook milliseconds (it reads ``variable`` here); mypy reads the
# annotations anyway. dataclasses is imported where fields are declared, never on that path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any

__all__ = [
    "PREFIX",
    "UNSET",
    "Env",
    "count",
    "declared",
    "duration",
    "flag",
    "from_environ",
    "is_none",
    "named_object",
    "option",
    "option_rows",
    "optional_duration",
    "shown_default",
    "table_rows",
    "variable",
    "whole_seconds",
]

# Marks an option the caller did not pass: it then comes from the environment, else its default.
UNSET: Any = type("Unset", (), {"__repr__": lambda self: "<from the environment, else the default>"})()

if TYPE_CHECKING:
    Reader = Callable[[str, str], Any]  # (variable, raw text) -> the option's value; raises ConfigError


class Env:
    """One option's declaration beside its default: how its variable is read (``read``), the variable's
    value as the documentation states it (``value``), what the option does (``meaning``), and its default
    in words where the value alone would not say it (``shown``)."""

    __slots__ = ("meaning", "read", "shown", "value")

    def __init__(self, read: Reader, value: str, meaning: str = "", shown: str | None = None) -> None:
        self.read = read
        self.value = value
        self.meaning = meaning
        self.shown = shown


def option(default: Any, read: Reader, value: str, meaning: str, *, shown: str | None = None) -> Any:
    """Declare an option as a dataclass field: its default, and its :class:`Env`."""
    import dataclasses

    return dataclasses.field(default=default, metadata={"env": Env(read, value, meaning, shown)})


def declared(*classes: type) -> dict[str, tuple[Any, Env]]:
    """The options declared on these dataclasses, in order: name -> (default, Env)."""
    import dataclasses

    return {
        item.name: (item.default, item.metadata["env"])
        for cls in classes
        for item in dataclasses.fields(cls)
        if "env" in item.metadata
    }


def from_environ(
    table: Mapping[str, tuple[Any, Env]], options: Iterable[str], environ: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The options among ``options`` whose variables are set (and not empty) in ``environ``, read by
    ``table``; and the text each variable held (for messages that name it)."""
    found: dict[str, Any] = {}
    raw_text: dict[str, str] = {}
    for name in options:
        var = variable(name)
        raw = environ.get(var, "").strip()
        if raw:
            found[name] = table[name][1].read(var, raw)
            raw_text[name] = raw
    return found, raw_text


def shown_default(default: Any, env: Env) -> str:
    """An option's default as the documentation and ``--help`` state it."""
    if env.shown is not None:
        return env.shown
    if default is None:
        return "none"
    if env.read in (duration, optional_duration):
        return f"{default:g} s" if default else "0"
    return str(default)


def option_rows(table: Mapping[str, tuple[Any, Env]]) -> list[str]:
    """The documentation's option rows: ``| `x` | default | meaning |``."""
    return [f"| `{name}` | {shown_default(default, env)} | {env.meaning} |" for name, (default, env) in table.items()]


def table_rows(table: Mapping[str, tuple[Any, Env]]) -> list[str]:
    """The documentation's rows of variables: ``| `GRACEFUL_X` | `x` | value |``."""
    return [f"| `{variable(name)}` | `{name}` | {env.value} |" for name, (_, env) in table.items()]


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
