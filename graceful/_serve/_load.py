"""The app ``graceful run`` serves: imported, its own :class:`GracefulMiddleware` found (else the app
wrapped in one), and the flags that contradict what its code set refused.

The flags reach the app through their variables (``serve`` sets them before the import), so that a
middleware built at import or at the app's first call fills what its code left unset from them; what
the code set wins there, which is why a flag that says otherwise is refused here rather than ignored.
"""

from __future__ import annotations

import importlib
import os
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from uvicorn.importer import ImportFromStringError, import_from_string

from .._asgi._middleware import GracefulMiddleware
from .._asgi._types import ASGIApp
from .._drain._environ import variable
from .._drain._errors import ConfigError

__all__ = ["Flag", "find_middleware", "in_flag_words", "load_app", "refuse_contradictions"]


@dataclass(frozen=True)
class Flag:
    """A drain option given on ``graceful run``'s command line: the option, its value, the flag as typed
    (``--grace-period 90``, ``--no-handoff-streams``), and the text its ``GRACEFUL_*`` variable gets
    (the duration as typed, which the variable's reader parses as the flag's did, or ``1``/``0``)."""

    option: str
    value: Any
    typed: str
    text: str


def load_app(target: str, *, folder: str | None = None) -> tuple[ASGIApp, GracefulMiddleware]:
    """Import ``module:attr``; return the app to serve and the :class:`GracefulMiddleware` that drains it:
    the app's own (``find_middleware``), else the app wrapped in one, its options from the environment.

    ``folder`` is the ``--app-dir`` the module was looked for in first, for the message when it is not there.
    """
    app = _import(target, folder)
    if not callable(app):
        raise ConfigError(
            f"cannot load app {target!r}: it is a {type(app).__name__}, not an ASGI app; point APP at one"
        )
    found = find_middleware(app)
    if found is not None:
        return app, found
    wrapped = GracefulMiddleware(app)
    return wrapped, wrapped


def _import(target: str, folder: str | None) -> Any:
    """The app ``target`` names; a module that is missing or raises on import is one ConfigError (no
    traceback): the module's own errors are told apart from a wrong ``APP`` by importing it first."""
    module, colon, _ = target.partition(":")
    try:
        if colon and module:
            importlib.import_module(module)
        return import_from_string(target)
    except (ImportFromStringError, ConfigError) as exc:  # a wrong APP, or a wrong option found at import
        raise ConfigError(f"cannot load app {target!r}: {exc}") from None
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module == exc.name or module.startswith(exc.name + ".")):
            raise _raised_on_import(target, module, exc) from None
        where = f" in {os.path.abspath(folder)!r} (--app-dir) or" if folder is not None else ""
        raise ConfigError(
            f"cannot load app {target!r}: no module named {exc.name!r}{where} on the import path; check APP's module"
        ) from None
    except Exception as exc:
        raise _raised_on_import(target, module, exc) from None


def _raised_on_import(target: str, module: str, exc: Exception) -> ConfigError:
    # Where in the module: its deepest line (the first module-level frame past importlib's own is the
    # module, or the package that imports it), not the library call that raised at the end of the chain.
    frames = traceback.extract_tb(exc.__traceback__)
    top = next((f for f in frames if f.name == "<module>" and not f.filename.startswith("<")), None)
    line = next((f for f in reversed(frames) if top is not None and f.filename == top.filename), None)
    where = f" ({line.filename}, line {line.lineno})" if line is not None else ""
    said = " ".join(str(exc).split())  # one line, whatever the exception's message holds
    return ConfigError(
        f"cannot load app {target!r}: importing module {module!r} raised {type(exc).__name__}"
        f"{': ' + said if said else ''}{where}; fix the module"
    )


# How far down a chain of middleware (each holding the next as ``.app``) to look for GracefulMiddleware.
_DEPTH = 64


def find_middleware(app: Any) -> GracefulMiddleware | None:
    """The app's own :class:`GracefulMiddleware`, or None: the app itself; one that a Starlette (FastAPI)
    app lists in ``user_middleware`` (``app.add_middleware(GracefulMiddleware, ...)``), whose stack is
    then built here once, with Starlette's public ``build_middleware_stack()``, and kept as
    ``middleware_stack``, as the app's own first call would; or one down a chain of ``.app`` attributes
    (middleware wrapped around it in code), at most ``_DEPTH`` deep.

    Raises ConfigError when ``user_middleware`` lists it but the built stack does not lead to it."""
    current = app
    listed = False
    for _ in range(_DEPTH):
        if isinstance(current, GracefulMiddleware):
            return current
        stack = getattr(current, "middleware_stack", None)
        if stack is None and _lists_middleware(current):
            listed = True
            stack = current.middleware_stack = current.build_middleware_stack()
        current = stack if stack is not None else getattr(current, "app", None)
        if current is None:
            break
    if listed:
        raise ConfigError(
            f"{type(app).__name__} lists GracefulMiddleware in its middleware, but no .app chain from its "
            "middleware stack leads to it; wrap the app in GracefulMiddleware in code instead"
        )
    return None


def _lists_middleware(app: Any) -> bool:
    listed = getattr(app, "user_middleware", None)
    if not isinstance(listed, list) or not callable(getattr(app, "build_middleware_stack", None)):
        return False
    classes = (getattr(entry, "cls", None) for entry in listed)
    return any(isinstance(cls, type) and issubclass(cls, GracefulMiddleware) for cls in classes)


def refuse_contradictions(target: str, middleware: GracefulMiddleware, flags: Sequence[Flag]) -> None:
    """A flag given with a value other than the one the app set in code is refused: the code's value would
    win (the library's rule), and the flag would be silently ignored. An equal value is no contradiction."""
    config, options = middleware.drain.config, middleware.options
    in_force = config.values() | {"socket_dir": options.socket_dir}
    in_code = config.in_code | (options.in_code & {"socket_dir"})
    said = [
        f"{flag.typed} contradicts {flag.option}={_shown(in_force[flag.option])}"
        for flag in flags
        if flag.option in in_code and not _same(flag.option, flag.value, in_force[flag.option])
    ]
    if said:
        several = len(said) > 1
        raise ConfigError(
            f"{' and '.join(said)} set in code for {target}; "
            f"drop the {'flags' if several else 'flag'} or the code's {'values' if several else 'value'}"
        )


def _same(option: str, flag: Any, code: Any) -> bool:
    if option == "socket_dir":
        return code is not None and os.path.abspath(flag) == os.path.abspath(code)
    return bool(flag == code)


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value) if isinstance(value, str) else str(value)


def in_flag_words(message: str, flags: Sequence[Flag]) -> str:
    """A message about an option whose variable ``serve`` set from a flag names the flag instead, as typed."""
    for flag in flags:
        var, name = variable(flag.option), flag.typed.split(" ", 1)[0]
        message = message.replace(f"environment variable {var}=", f"{name} ")
        message = message.replace(f"{flag.option} ({var})", name).replace(f"environment variable {var}", name)
        message = message.replace(var, name)
    return message
