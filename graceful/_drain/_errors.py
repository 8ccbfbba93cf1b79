"""The one error for a wrong setting, shared by every package that checks one, and how it is raised
where a server that imports the app by name will report it."""

from __future__ import annotations

import sys
from collections.abc import Callable

__all__ = ["ConfigError", "reported"]


class ConfigError(ValueError):
    """A user-supplied setting is wrong; the message names the value and the fix.

    The rules that find it know values, not how the user wrote them: a value's own problem reads as
    the value and the fix (``'abc' is not a duration; use ...``), and a rule that must mention options
    writes each as ``{option}`` (:meth:`between`). The edge that took the value (an option's variable,
    a flag, a keyword argument) catches the error and re-raises it :meth:`named`.
    """

    template = ""  # the message with each option it mentions as {option}; "" when it mentions none

    @classmethod
    def between(cls, template: str) -> ConfigError:
        """An error that mentions options, each as ``{option}`` in ``template``: they read by their own
        names until the error is :meth:`named`."""
        error = cls(template.format_map(_Names(str)))
        error.template = template
        return error

    def named(self, subject: str, name: Callable[[str], str] = str) -> ConfigError:
        """This error as its user reads it: after ``subject``, how the wrong value's option was given
        (``grace_period``, ``environment variable GRACEFUL_GRACE_PERIOD``; "" for a rule between options),
        with each option it mentions as ``name`` gives it (``--grace-period``, ``reserve (GRACEFUL_RESERVE)``)."""
        text = self.template.format_map(_Names(name)) if self.template else str(self)
        return ConfigError(f"{subject}: {text}" if subject else text)


class _Names(dict[str, str]):
    """The options a template mentions, each as ``name`` gives it."""

    def __init__(self, name: Callable[[str], str]) -> None:
        super().__init__()
        self.name = name

    def __missing__(self, option: str) -> str:
        return self.name(option)


# Servers that import the app by name print a few exception types as one line and stop, and any other
# with a traceback: uvicorn logs an ImportFromStringError as "Error loading ASGI app. <message>" and
# exits 3 (Config.load_app); gunicorn's arbiter prints an AppImportError's message alone and halts,
# "App failed to load" (exit 4). A wrong option found when the app is built is an operator's mistake,
# a variable more often than not: where one of those servers runs, the error takes its type too.
_ONE_LINE = (("uvicorn.importer", "ImportFromStringError"), ("gunicorn.errors", "AppImportError"))


def reported(error: ConfigError) -> ConfigError:
    """``error`` as a constructor raises it: also an instance of the exception types that the servers
    loaded in this process (never imported here) report in one line, without a traceback. It stays a
    :class:`ConfigError` (a ``ValueError``) with the same message; with no such server, it is ``error``.
    Raise it without its traceback (``.with_traceback(None)``): where a server does print one, it then
    ends at the line that built the app, not in graceful's parsers."""
    bases = tuple(
        found
        for module, name in _ONE_LINE
        if isinstance(found := getattr(sys.modules.get(module), name, None), type) and issubclass(found, Exception)
    )
    if not bases:
        return error
    cls = _classes.get(bases)
    if cls is None:
        # Named as the public class, so that a traceback (under a server not listed above) still
        # reads graceful.ConfigError; pickled, it is the plain ConfigError.
        namespace = {"__module__": "graceful", "__reduce__": lambda self: (ConfigError, self.args)}
        cls = _classes[bases] = type("ConfigError", (ConfigError, *bases), namespace)
    return cls(*error.args)


_classes: dict[tuple[type, ...], type[ConfigError]] = {}
