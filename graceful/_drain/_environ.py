"""Options, each declared once: its default, its ``GRACEFUL_*`` variable, how that is read, and its doc.

A server that loads the middleware by name (``vllm serve --middleware
graceful.GracefulMiddleware`` calls it with the app alone) can only be configured from
its environment. Each option is a field of an options dataclass (``Budget`` and
``DrainConfig`` in this package, ``MiddlewareConfig`` in ``graceful/_asgi/_options.py``),
declared with :func:`option`: the default, an :class:`Env` (how its variable, ``GRACEFUL_``
+ the option's name in capitals, is read, how a value given in code is checked, and what the
documentation says of it). A value given in code wins; a variable fills an option the code
leaves unset; else the default. A wrong value is refused when the options are resolved (at
construction, never first at startup), with the option as the user gave it (the Python
option, or the variable), the value as given and the fix.

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
    "callable_kind",
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
    Check = Callable[[str, Any], Any]  # (option, value given in code) -> the option's value; raises ConfigError


class Env:
    """One option's declaration beside its default: how its variable is read (``read``), how a value
    given in code is checked (``check``: by default the check of ``read``'s kind, see ``CHECKS``), the
    variable's value as the documentation states it (``value``), what the option does (``meaning``),
    and its default in words where the value alone would not say it (``shown``)."""

    __slots__ = ("check", "meaning", "read", "shown", "value")

    def __init__(
        self, read: Reader, value: str, meaning: str = "", shown: str | None = None, check: Check | None = None
    ) -> None:
        self.read = read
        self.check = check if check is not None else CHECKS.get(read, _as_given)
        self.value = value
        self.meaning = meaning
        self.shown = shown


def option(
    default: Any, read: Reader, value: str, meaning: str, *, shown: str | None = None, check: Check | None = None
) -> Any:
    """Declare an option as a dataclass field: its default, and its :class:`Env`."""
    import dataclasses

    return dataclasses.field(default=default, metadata={"env": Env(read, value, meaning, shown, check)})


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


_COUNT = "is not a whole number of at least 1; use e.g. 64, or"
_SECONDS = "is not a whole number of seconds; use e.g. 1"


def count(var: str, raw: str) -> int | None:
    if is_none(raw):
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"environment variable {var}: {raw!r} {_COUNT} none")
    return int(raw)


def whole_seconds(var: str, raw: str) -> int:
    if not raw.isdigit():
        raise ConfigError(f"environment variable {var}: {raw!r} {_SECONDS}")
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


# -- the checks of values given in code, one per kind of reader --------------------------------


def _as_given(name: str, value: Any) -> Any:
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name}: expected True or False, got {value!r}")
    return value


def _duration(name: str, value: Any) -> float:
    return parse_duration(value, name=name)


def _optional_duration(name: str, value: Any) -> float | None:
    return None if value is None else parse_duration(value, name=name)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(name: str, value: Any) -> int | None:
    if value is not None and not (_whole(value) and value >= 1):
        raise ConfigError(f"{name}: {value!r} {_COUNT} None")
    return None if value is None else int(value)


def _whole_seconds(name: str, value: Any) -> int:
    if not (_whole(value) and value >= 0):
        raise ConfigError(f"{name}: {value!r} {_SECONDS}")
    return int(value)


def _callable(name: str, value: Any) -> Any:
    if not callable(value):
        raise ConfigError(f"{name}: {value!r} is not callable; pass a function")
    return value


CHECKS: dict[Reader, Check] = {
    flag: _flag,
    duration: _duration,
    optional_duration: _optional_duration,
    count: _count,
    whole_seconds: _whole_seconds,
    named_object: _callable,
}


def callable_kind(
    use: str, *, awaited: bool, arguments: tuple[Any, ...] = (), optional: bool = True
) -> tuple[Reader, Check]:
    """The reader and the check of an option that takes a function: named in its variable as
    ``module:function``, passed in code as the function itself. Both refuse what graceful could
    only find wrong when it calls the function, mid-drain: not callable, ``async def`` where it
    is called without awaiting (``awaited=False``) or a plain function where it is awaited, or a
    signature that does not take ``arguments``. ``use`` says what to pass, for the fix; ``optional``
    lets None (no function) through."""

    def problem(value: Any) -> str | None:
        if not callable(value):
            return f"is not callable; pass {use}"
        if _is_async(value) != awaited:
            if awaited:
                return f"is not an async function: graceful awaits what it returns; pass {use}"
            return f"is an async function: graceful calls it without awaiting; pass {use}"
        if not _takes(value, arguments):
            taken = {0: "no arguments", 1: "one argument"}.get(len(arguments), f"{len(arguments)} arguments")
            return f"cannot be called with {taken}; pass {use}"
        return None

    def read(var: str, raw: str) -> Any:
        found = named_object(var, raw)
        wrong = problem(found)
        if wrong:
            raise ConfigError(f"environment variable {var}: {raw!r} {wrong}")
        return found

    def check(name: str, value: Any) -> Any:
        wrong = None if value is None and optional else problem(value)
        if wrong:
            raise ConfigError(f"{name}: {value!r} {wrong}")
        return value

    return read, check


def _is_async(function: Any) -> bool:
    """``async def`` (a coroutine function, a partial of one, or an object whose ``__call__`` is one)."""
    import inspect

    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(getattr(function, "__call__", None))


def _takes(function: Any, arguments: tuple[Any, ...]) -> bool:
    import inspect

    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # no signature to read (some builtins): taken on trust
        return True
    try:
        signature.bind(*arguments)
    except TypeError:
        return False
    return True
