"""The middleware's own options, each declared once: default, variable, reader and doc line.

``GracefulMiddleware(...)`` takes these beside the drain options (``graceful/_drain/_options.py``),
declared in the same way (``_environ.option``). ``MiddlewareConfig.resolve`` takes what the
caller passed, fills the rest from the environment it is given, else the default, and checks the
values. ``DECLARED`` is every option, drain and middleware alike, in the order of the
documentation's tables, which ``option_rows`` and ``environment_rows`` write and a test holds to
the page.

Every value is checked here, when the middleware is built: a value that could only fail later
(at startup, at the first request, at the deadline) is refused now, naming the option as the user
gave it (the Python option, or the variable), the value and the fix.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._admin._paths import SOCKET_MODE, socket_dir_problem
from .._drain._environ import (
    COUNT,
    FLAG,
    WHOLE_SECONDS,
    Env,
    Given,
    Kind,
    callable_kind,
    declared,
    is_none,
    option,
    option_rows,
    table_rows,
    variable,
)
from .._drain._errors import ConfigError
from .._drain._options import DRAIN_DECLARED
from ._frames import FinalFrame, default_final_frame

__all__ = ["DECLARED", "DEFAULTS", "MIDDLEWARE_DECLARED", "MiddlewareConfig", "environment_rows", "middleware_rows"]

# -- the middleware's kinds of value: each a reader (variable's text) and a check (value given in code) -----
# They raise ConfigError with the value and the fix; ``Given.settle`` puts the option or the variable before it.


def _refuse(shown: object, problem: str | None) -> None:
    if problem is not None:
        raise ConfigError(f"{shown!r} {problem}")


def _not_path(value: object) -> str | None:
    if isinstance(value, str) and value.startswith("/"):
        return None
    return "is not a path; use one that starts with /, e.g. /ready"


def _path(value: Any) -> str:
    _refuse(value, _not_path(value))
    return str(value)


_PATH = Kind(_path, _path)
_OPTIONAL_PATH = Kind(
    lambda raw: None if is_none(raw) else _path(raw), lambda value: None if value is None else _path(value)
)


def _read_paths(raw: str) -> tuple[str, ...]:
    return tuple(_path(part.strip()) for part in raw.split(",") if part.strip())


def _check_paths(value: Any) -> tuple[str, ...]:
    # A lone string would be taken apart letter by letter, "/" first: every request exempt.
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError(f"{value!r} is not a list of paths; use e.g. ('/metrics', '/version')")
    paths = tuple(value)
    for path in paths:
        wrong = _not_path(path)
        if wrong:
            raise ConfigError(f"{value!r} holds {path!r}, which {wrong}")
    return paths


def _not_header(value: object) -> str | None:
    if isinstance(value, str) and value.isascii() and value.replace("-", "").replace("_", "").isalnum():
        return None
    return "is not a header name; use e.g. x-request-id"


def _header(value: Any) -> str:
    _refuse(value, _not_header(value))
    return str(value)


_HEADER = Kind(
    lambda raw: None if is_none(raw) else _header(raw), lambda value: None if value is None else _header(value)
)

_MODES = {"600": 0o600, "660": 0o660}


def _read_mode(raw: str) -> int:
    text = raw.lower().removeprefix("0o").lstrip("0")
    if text not in _MODES:
        raise ConfigError(f"{raw!r} is not an allowed socket mode; use 0600 (owner only, the default) or 0660 (group)")
    return _MODES[text]


def _check_mode(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if value in _MODES.values():
            return value
        if str(value) in _MODES:  # 600 written for 0o600
            raise ConfigError(f"{value} is a decimal number, not a file mode; write it in octal: 0o{value}")
        shown = f"{value:#o}"  # as a mode is written: 0o777, not 511
    else:
        shown = repr(value)
    raise ConfigError(f"{shown} is not an allowed socket mode; use 0o600 (owner only, the default) or 0o660 (group)")


def _read_socket_dir(raw: str) -> str:
    _refuse(raw, _dir_problem(raw))
    return raw


def _check_socket_dir(value: Any) -> str | None:
    if value is None:
        return None
    path = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{value!r} is not a directory; use a path such as /tmp/graceful")
    _refuse(value, _dir_problem(path))
    return path


def _dir_problem(path: str) -> str | None:
    # Built inside a running event loop (Starlette builds its middleware stack at the first call, the
    # lifespan's), the file system is left to the startup a moment later, which reads it in a worker
    # thread: an app's tests may forbid blocking calls in the loop (Starlette's run under blockbuster).
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return socket_dir_problem(path)
    return socket_dir_problem(path, look=False)


_LIVE = callable_kind("a function of no arguments that returns True while live", awaited=False)
_FRAME = callable_kind(
    "a function of the response's content type (bytes) that returns the final frame (bytes) or None",
    awaited=False,
    arguments=(b"",),
    optional=False,
)

_MODULE_FUNCTION = "`module:function`, imported"
_FLAG = "`1`/`0`"


@dataclass(frozen=True)
class MiddlewareConfig:
    """The middleware's options, resolved and checked (the drain's are ``DrainConfig``)."""

    ready_path: str = option(
        default="/ready",
        kind=_PATH,
        value="a path starting with `/`",
        meaning="the readiness probe's path",
        shown="`/ready`",
    )
    live_path: str = option(
        default="/live", kind=_PATH, value="a path", meaning="the liveness probe's path", shown="`/live`"
    )
    startup_path: str = option(
        default="/startup", kind=_PATH, value="a path", meaning="the startup probe's path", shown="`/startup`"
    )
    exempt_paths: Iterable[str] = option(
        default=(),
        kind=Kind(_read_paths, _check_paths),
        value="paths separated by commas (`/metrics,/version`)",
        meaning="passed to the app but never refused or counted (e.g. `/metrics`)",
        shown="`()`",
    )
    metrics_path: str | None = option(
        default=None, kind=_OPTIONAL_PATH, value="a path, or `none`", meaning="serve the Prometheus page here"
    )
    retry_after: int = option(
        default=1, kind=WHOLE_SECONDS, value="whole seconds", meaning="`Retry-After` seconds on refusals"
    )
    max_in_flight: int | None = option(
        default=None,
        kind=COUNT,
        value="a whole number ≥ 1, or `none`",
        meaning="readiness fails while `in_flight >= max_in_flight` and recovers below it",
    )
    reject_over: int | None = option(
        default=None,
        kind=COUNT,
        value="a whole number ≥ 1, or `none`",
        meaning="hard limit: refuse with `server_overloaded` at or above it",
    )
    live_check: Callable[[], bool] | None = option(
        default=None,
        kind=_LIVE,
        value=_MODULE_FUNCTION,
        meaning="a callable; `/live` fails when it returns False or raises",
    )
    fail_liveness: bool = option(
        default=False,
        kind=FLAG,
        value=_FLAG,
        meaning="`/live` answers 503 once the engine has died (FAILED), so that the kubelet restarts the container; "
        "off, liveness stays with the app's own health check (see [When the engine dies](#when-the-engine-dies))",
    )
    ready_on_startup: bool = option(
        default=True,
        kind=FLAG,
        value=_FLAG,
        meaning="False: stay STARTING until `drain.mark_serving()` (weights loaded, warmed up)",
    )
    request_id_header: str | None = option(
        default=None,
        kind=_HEADER,
        value="a header name (`x-request-id`), or `none`",
        meaning="a header to echo, or generate when the request has none, on every response and refusal (e.g. "
        '`"x-request-id"`); off by default because it is not drain work and costs about a fifth of the '
        "middleware's per-request instructions",
    )
    admin: bool = option(
        default=True,
        kind=FLAG,
        value=_FLAG,
        meaning="serve the private admin socket (see [the admin socket](cli.md#the-admin-socket))",
    )
    socket_dir: str | None = option(
        default=None,
        kind=Kind(_read_socket_dir, _check_socket_dir),
        value="a directory (also read by `graceful drain`)",
        meaning="the admin socket's directory",
        shown="see [the admin socket](cli.md#the-admin-socket)",
    )
    socket_mode: int = option(
        default=SOCKET_MODE,
        kind=Kind(_read_mode, _check_mode),
        value="`0600` or `0660`",
        meaning="the admin socket's file mode",
        shown="0o600",
    )
    final_frame: FinalFrame = option(
        default=default_final_frame,
        kind=_FRAME,
        value=_MODULE_FUNCTION,
        meaning="the frame that ends streams at the deadline (see [At the deadline](deadline.md))",
        shown="OpenAI-style SSE / NDJSON",
    )
    announce_drain: bool = option(
        default=True,
        kind=FLAG,
        value=_FLAG,
        meaning="from the drain's start, every response carries `x-envoy-immediate-health-check-fail: true`, which "
        "takes the host out of each Envoy that health-checks it (see [Behind Envoy](gateways.md#behind-envoy))",
    )
    # Not an option: how socket_dir was given (the option, or its variable), for the messages of the startup
    # that makes the directory; "" when neither gave it (the default).
    socket_dir_name: str = field(default="", compare=False, repr=False)
    # Not an option: the names of the options given in code, read-only (the others came from their variables,
    # else their defaults); ``graceful run`` refuses a flag that contradicts one given in code.
    in_code: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @classmethod
    def resolve(cls, given: Mapping[str, Any], environ: Mapping[str, str]) -> MiddlewareConfig:
        """Options as passed (``UNSET`` where not), else from their variables in ``environ``, else the
        defaults; each checked by its kind, a wrong one named as the user gave it (``Given.settle``)."""
        options = Given(MIDDLEWARE_DECLARED, environ, given)
        values = options.settle(MIDDLEWARE_DECLARED)
        from_variable = "socket_dir" in options.from_variables
        given_as = f"environment variable {variable('socket_dir')}" if from_variable else "socket_dir"
        config = cls(
            **values,
            socket_dir_name=given_as if values["socket_dir"] is not None else "",
            in_code=options.in_code,
        )
        # Two probes on one path: the later one's handler would answer both (a readiness probe
        # answering liveness never fails in a drain).
        probes: dict[str, str] = {}
        for name in ("metrics_path", "ready_path", "live_path", "startup_path"):
            path = getattr(config, name)
            if path is None:
                continue
            shown = variable(name) if name in options.from_variables else name
            if path in probes:
                raise ConfigError(f"{probes[path]} and {shown} are both {path!r}; give each its own path")
            probes[path] = shown
        return config


MIDDLEWARE_DECLARED: dict[str, tuple[Any, Env]] = declared(MiddlewareConfig)
# The middleware's defaults, by name (derived: the declarations above are their one home).
DEFAULTS: dict[str, Any] = {name: default for name, (default, _) in MIDDLEWARE_DECLARED.items()}
# Every option: the drain's, then the middleware's.
DECLARED: dict[str, tuple[Any, Env]] = {**DRAIN_DECLARED, **MIDDLEWARE_DECLARED}


def middleware_rows() -> list[str]:
    """The rows of the documentation's table of the middleware's own options (docs/middleware.md)."""
    return option_rows(MIDDLEWARE_DECLARED)


def environment_rows() -> list[str]:
    """The rows of the documentation's table of variables (docs/middleware.md, "From the environment")."""
    return table_rows(DECLARED)
