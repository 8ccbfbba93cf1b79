"""Options, each declared once, and the one place where a value given for one is read and named.

A server that loads the middleware by name (``vllm serve --middleware
graceful.GracefulMiddleware`` calls it with the app alone) can only be configured from
its environment. Each option is a field of an options dataclass (``Budget`` and
``DrainConfig`` in this package, ``MiddlewareConfig`` in ``graceful/_asgi/_options.py``),
declared with :func:`option`: the default, its :class:`Kind` (how its variable, ``GRACEFUL_``
+ the option's name in capitals, is read, and how a value given in code is checked) and what the
documentation and ``--help`` say of it. A value given in code wins; a variable fills an option the
code leaves unset; else the default.

:meth:`Given.settle` is where that happens, and where a wrong value gets its name: the readers and
checks raise :class:`ConfigError` with the value and the fix only, and ``value`` re-raises it after
the option as the user gave it (the Python option, or ``environment variable GRACEFUL_X``). Every
value is checked when the options are resolved (at construction, never first at startup).

This module never reads the process's environment: the edges that do (the constructors of
``Drain`` and ``GracefulMiddleware``, and the CLI) pass it in.
"""

from __future__ import annotations

import enum
import importlib
import re
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ._durations import seconds
from ._errors import ConfigError
from ._names import PREFIX, variable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

T = TypeVar("T")

__all__ = [
    "COUNT",
    "FLAG",
    "PREFIX",
    "UNSET",
    "WHOLE_SECONDS",
    "Env",
    "Given",
    "Kind",
    "Unset",
    "callable_kind",
    "declared",
    "duration",
    "help_text",
    "is_none",
    "option",
    "option_rows",
    "parse_duration",
    "shown_default",
    "table_rows",
    "variable",
]


class Unset(enum.Enum):
    """The type of :data:`UNSET`, a keyword argument the caller did not pass (httpx's ``UnsetType``)."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "<from the environment, else the default>"


# Marks an option the caller did not pass: it then comes from the environment, else its default.
UNSET: Final = Unset.UNSET


class Kind:
    """How one kind of option is read: ``read`` turns its variable's text into the value, ``check`` takes
    a value given in code. Both raise :class:`ConfigError` with the value as given and the fix, never a
    name (``Given.settle`` adds it). ``after``: the options whose values the rule takes too (the budget's
    reserve, which must stay under the grace period). ``seconds``: for a duration, the rule of
    ``_durations`` it is held to; ``choices``: the values of a choice. Flags take them so."""

    __slots__ = ("after", "check", "choices", "read", "seconds")

    def __init__(
        self,
        read: Callable[..., Any],
        check: Callable[..., Any],
        *,
        after: tuple[str, ...] = (),
        seconds: Callable[..., float] | None = None,
        choices: tuple[str, ...] = (),
    ) -> None:
        self.read = read
        self.check = check
        self.after = after
        self.seconds = seconds
        self.choices = choices


class Env:
    """One option's declaration beside its default: its :class:`Kind`, the variable's value as the
    documentation states it (``value``), what the option does (``meaning``, the docs' tables and every
    flag's help), its default in words where the value alone would not say it (``shown``), and how a
    sentence names it (``noun``: ``graceful advise``'s "judge this ...")."""

    __slots__ = ("kind", "meaning", "noun", "shown", "value")

    def __init__(self, kind: Kind, value: str, meaning: str, shown: str | None, noun: str | None) -> None:
        self.kind = kind
        self.value = value
        self.meaning = meaning
        self.shown = shown
        self.noun = noun


def option(
    *, default: Any, kind: Kind, value: str, meaning: str, shown: str | None = None, noun: str | None = None
) -> Any:
    """Declare an option as a dataclass field: its default, and its :class:`Env`."""
    import dataclasses

    return dataclasses.field(default=default, metadata={"env": Env(kind, value, meaning, shown, noun)})


def declared(*classes: type) -> dict[str, tuple[Any, Env]]:
    """The options declared on these dataclasses, in order: name -> (default, Env)."""
    import dataclasses

    return {
        item.name: (item.default, item.metadata["env"])
        for cls in classes
        for item in dataclasses.fields(cls)
        if "env" in item.metadata
    }


class Given:
    """The options as a caller gave them (``UNSET`` where it did not) beside the variables in ``environ``.

    ``settle`` is the one place an option's value is taken: given in code, else read from its variable,
    else the declared default; ``judged`` applies the rules between options. Where either fails, the
    error names each option as ``name`` says: with its variable when it came from one."""

    def __init__(
        self,
        table: Mapping[str, tuple[Any, Env]],
        environ: Mapping[str, str],
        given: Mapping[str, Any],
        *,
        names: Mapping[str, str] | None = None,
    ) -> None:
        self.table = table
        self.variables = environ
        self.given = given
        self.names = names or {}
        self.in_code = frozenset(name for name, value in given.items() if value is not UNSET)
        self.from_variables: set[str] = set()

    def settle(self, options: Iterable[str], *, judge: Callable[..., object] | None = None) -> dict[str, Any]:
        """The values of ``options``, in order, each checked by its kind, then all of them by ``judge`` (the rules
        between them, given the values by name). A wrong one raises :class:`ConfigError` that starts with the
        option as the user gave it (its name, or ``environment variable GRACEFUL_X``); ``judge``'s names each
        option it mentions as ``name`` says."""
        values: dict[str, Any] = {}
        for option in options:
            default, env = self.table[option]
            given = self.given.get(option, UNSET)
            raw = "" if given is not UNSET else self.variables.get(variable(option), "").strip()
            after = [values[name] for name in env.kind.after]
            try:
                if given is not UNSET:
                    values[option] = env.kind.check(given, *after)
                elif raw:
                    self.from_variables.add(option)
                    values[option] = env.kind.read(raw, *after)
                else:
                    values[option] = default
                continue
            except ConfigError as exc:
                wrong = exc.named(f"environment variable {variable(option)}" if raw else option, self.name)
            raise wrong  # outside the except block: the error comes alone, with no other chained above it
        try:
            if judge is not None:
                judge(**values)
            return values
        except ConfigError as exc:
            wrong = exc.named("", self.name)
        raise wrong

    def judged(self, rule: Callable[..., T], **values: Any) -> T:
        """``rule(**values)``, a rule between options: its error names each option as ``name`` says."""
        try:
            return rule(**values)
        except ConfigError as exc:
            wrong = exc.named("", self.name)
        raise wrong

    def name(self, option: str) -> str:
        """How a message names ``option``: ``reserve``, or ``reserve (GRACEFUL_RESERVE)`` when its variable set it
        (or as ``names`` says: a drain's own ``timeout`` is "this drain's timeout")."""
        if option in self.names:
            return self.names[option]
        return f"{option} ({variable(option)})" if option in self.from_variables else option


def parse_duration(value: str | float, *, name: str = "duration") -> float:
    """Parse ``10s``, ``1.5s``, ``500ms``, ``2m``, ``1m30s`` or a bare number of seconds.

    ``name`` is how the caller's user gave the value (an option, a flag, a variable); every message
    names it and the value as given. ``-1`` and ``-1s`` are refused alike, as negative.
    """
    try:
        return seconds(value)
    except ConfigError as exc:
        wrong = exc.named(name)
    raise wrong


# -- what the documentation and --help say -------------------------------------------------------


def shown_default(default: Any, env: Env) -> str:
    """An option's default as the documentation and ``--help`` state it."""
    if env.shown is not None:
        return env.shown
    if default is None:
        return "none"
    if env.kind.seconds is not None:
        return f"{default:g} s" if default else "0"
    return str(default)


def option_rows(table: Mapping[str, tuple[Any, Env]]) -> list[str]:
    """The documentation's option rows: ``| `x` | default | meaning |``."""
    return [f"| `{name}` | {shown_default(default, env)} | {env.meaning} |" for name, (default, env) in table.items()]


def table_rows(table: Mapping[str, tuple[Any, Env]]) -> list[str]:
    """The documentation's rows of variables: ``| `GRACEFUL_X` | `x` | value |``."""
    return [f"| `{variable(name)}` | `{name}` | {env.value} |" for name, (_, env) in table.items()]


_SEE = re.compile(r"\s*\(see [^()]*(?:\([^()]*\)[^()]*)*\)")  # "(see below)", "(see [Resume](resume.md))"
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")


def help_text(env: Env) -> str:
    """An option's ``--help`` line: the documentation's meaning as a sentence, without its Markdown and its
    pointers into the page (``see below``)."""
    text = _LINK.sub(r"\1", _SEE.sub("", env.meaning)).replace("`", "")
    return text[:1].upper() + text[1:] + "."


# -- the kinds every package shares -------------------------------------------------------------

_NONE = ("none", "off")


def is_none(raw: str) -> bool:
    """Whether a variable says "no value" (``none`` or ``off``)."""
    return raw.lower() in _NONE


def duration(rule: Callable[..., float] = seconds, *, optional: bool = False, after: tuple[str, ...] = ()) -> Kind:
    """A duration held to ``rule`` (``_durations``), which also takes the values of the options ``after``:
    text or a number of seconds; ``optional``: ``none`` or ``off`` in its variable, None in code, for no value."""

    def read(raw: str, *context: Any) -> float | None:
        return None if optional and is_none(raw) else rule(raw, *context)

    def check(value: Any, *context: Any) -> float | None:
        return None if optional and value is None else rule(value, *context)

    return Kind(read, check, after=after, seconds=rule)


def _read_flag(raw: str) -> bool:
    text = raw.lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{raw!r} is not a boolean; use 1 or 0")


def _check_flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"expected True or False, got {value!r}")
    return value


FLAG = Kind(_read_flag, _check_flag)

_COUNT = "is not a whole number of at least 1; use e.g. 64, or"
_SECONDS = "is not a whole number of seconds; use e.g. 1"


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_count(raw: str) -> int | None:
    if is_none(raw):
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{raw!r} {_COUNT} none")
    return int(raw)


def _check_count(value: Any) -> int | None:
    if value is not None and not (_whole(value) and value >= 1):
        raise ConfigError(f"{value!r} {_COUNT} None")
    return None if value is None else int(value)


COUNT = Kind(_read_count, _check_count)


def _read_whole_seconds(raw: str) -> int:
    if not raw.isdigit():
        raise ConfigError(f"{raw!r} {_SECONDS}")
    return int(raw)


def _check_whole_seconds(value: Any) -> int:
    if not (_whole(value) and value >= 0):
        raise ConfigError(f"{value!r} {_SECONDS}")
    return int(value)


WHOLE_SECONDS = Kind(_read_whole_seconds, _check_whole_seconds)


def _named_object(raw: str) -> Any:
    """``module:attribute``, imported: hooks and other callables named in a variable."""
    module, _, attribute = raw.partition(":")
    if not module or not attribute:
        raise ConfigError(f"{raw!r} must be in format <module>:<attribute>")
    try:
        found: Any = importlib.import_module(module)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import {raw!r} ({exc}); check the module and name") from None
    return found


def callable_kind(use: str, *, awaited: bool, arguments: tuple[Any, ...] = (), optional: bool = True) -> Kind:
    """The kind of an option that takes a function: named in its variable as ``module:function``, passed
    in code as the function itself. Both refuse what graceful could only find wrong when it calls the
    function, mid-drain: not callable, ``async def`` where it is called without awaiting
    (``awaited=False``) or a plain function where it is awaited, or a signature that does not take
    ``arguments``. ``use`` says what to pass, for the fix; ``optional`` lets None (no function) through."""

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

    def read(raw: str) -> Any:
        found = _named_object(raw)
        wrong = problem(found)
        if wrong:
            raise ConfigError(f"{raw!r} {wrong}")
        return found

    def check(value: Any) -> Any:
        wrong = None if value is None and optional else problem(value)
        if wrong:
            raise ConfigError(f"{value!r} {wrong}")
        return value

    return Kind(read, check)


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
