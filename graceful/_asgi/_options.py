"""The middleware's own options, each declared once: default, variable, reader and doc line.

``GracefulMiddleware(...)`` takes these beside the drain options (``graceful/_drain/_options.py``),
declared in the same way (``_environ.option``). ``MiddlewareConfig.resolve`` takes what the
caller passed, fills the rest from the environment it is given, else the default, and checks the
values. ``DECLARED`` is every option, drain and middleware alike, in the order of the
documentation's tables, which ``option_rows`` and ``environment_rows`` write and a test holds to
the page.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._admin._paths import SOCKET_MODE
from .._drain._environ import (
    Env,
    count,
    declared,
    flag,
    from_environ,
    is_none,
    named_object,
    option,
    option_rows,
    table_rows,
    whole_seconds,
)
from .._drain._errors import ConfigError
from .._drain._options import DRAIN_DECLARED, check_given
from ._frames import FinalFrame, default_final_frame

__all__ = ["DECLARED", "DEFAULTS", "MIDDLEWARE_DECLARED", "MiddlewareConfig", "environment_rows", "middleware_rows"]


def _path(var: str, raw: str) -> str:
    if not raw.startswith("/"):
        raise ConfigError(f"environment variable {var}: {raw!r} is not a path; use one that starts with /, e.g. /ready")
    return raw


def _optional_path(var: str, raw: str) -> str | None:
    return None if is_none(raw) else _path(var, raw)


def _paths(var: str, raw: str) -> tuple[str, ...]:
    return tuple(_path(var, part.strip()) for part in raw.split(",") if part.strip())


def _header(var: str, raw: str) -> str | None:
    if is_none(raw):
        return None
    if not raw.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"environment variable {var}: {raw!r} is not a header name; use e.g. x-request-id")
    return raw


def _mode(var: str, raw: str) -> int:
    text = raw.lower().removeprefix("0o").lstrip("0")
    modes = {"600": 0o600, "660": 0o660}
    if text not in modes:
        raise ConfigError(f"environment variable {var}: {raw!r} is not an allowed socket mode; use 0600 or 0660")
    return modes[text]


def _as_is(var: str, raw: str) -> str:
    return raw


_MODULE_FUNCTION = "`module:function`, imported"
_FLAG = "`1`/`0`"


@dataclass(frozen=True)
class MiddlewareConfig:
    """The middleware's options, resolved and checked (the drain's are ``DrainConfig``)."""

    ready_path: str = option(
        "/ready", _path, "a path starting with `/`", "the readiness probe's path", shown="`/ready`"
    )
    live_path: str = option("/live", _path, "a path", "the liveness probe's path", shown="`/live`")
    startup_path: str = option("/startup", _path, "a path", "the startup probe's path", shown="`/startup`")
    exempt_paths: Iterable[str] = option(
        (),
        _paths,
        "paths separated by commas (`/metrics,/version`)",
        "passed to the app but never refused or counted (e.g. `/metrics`)",
        shown="`()`",
    )
    metrics_path: str | None = option(None, _optional_path, "a path, or `none`", "serve the Prometheus page here")
    retry_after: int = option(1, whole_seconds, "whole seconds", "`Retry-After` seconds on refusals")
    max_in_flight: int | None = option(
        None,
        count,
        "a whole number ≥ 1, or `none`",
        "readiness fails while `in_flight >= max_in_flight` and recovers below it",
    )
    reject_over: int | None = option(
        None,
        count,
        "a whole number ≥ 1, or `none`",
        "hard limit: refuse with `server_overloaded` at or above it",
    )
    live_check: Callable[[], bool] | None = option(
        None, named_object, _MODULE_FUNCTION, "a callable; `/live` fails when it returns False or raises"
    )
    fail_liveness: bool = option(
        False,
        flag,
        _FLAG,
        "`/live` answers 503 once the engine has died (FAILED), so that the kubelet restarts the container; off, "
        "liveness stays with the app's own health check (see [When the engine dies](#when-the-engine-dies))",
    )
    ready_on_startup: bool = option(
        True,
        flag,
        _FLAG,
        "False: stay STARTING until `drain.mark_serving()` (weights loaded, warmed up)",
    )
    request_id_header: str | None = option(
        None,
        _header,
        "a header name (`x-request-id`), or `none`",
        "a header to echo, or generate when the request has none, on every response and refusal (e.g. "
        '`"x-request-id"`); off by default because it is not drain work and costs about a fifth of the '
        "middleware's per-request instructions",
    )
    admin: bool = option(
        True, flag, _FLAG, "serve the private admin socket (see [the admin socket](cli.md#the-admin-socket))"
    )
    socket_dir: str | None = option(
        None,
        _as_is,
        "a directory (also read by `graceful drain`)",
        "the admin socket's directory",
        shown="see [the admin socket](cli.md#the-admin-socket)",
    )
    socket_mode: int = option(SOCKET_MODE, _mode, "`0600` or `0660`", "the admin socket's file mode", shown="0o600")
    final_frame: FinalFrame = option(
        default_final_frame,
        named_object,
        _MODULE_FUNCTION,
        "the frame that ends streams at the deadline (see [At the deadline](deadline.md))",
        shown="OpenAI-style SSE / NDJSON",
    )
    announce_drain: bool = option(
        True,
        flag,
        _FLAG,
        "from the drain's start, every response carries `x-envoy-immediate-health-check-fail: true`, which "
        "takes the host out of each Envoy that health-checks it (see [Behind Envoy](gateways.md#behind-envoy))",
    )

    @classmethod
    def resolve(cls, given: Mapping[str, Any], environ: Mapping[str, str]) -> MiddlewareConfig:
        """Options as passed (``UNSET`` where not), else from their variables in ``environ``, else the
        defaults; checked."""
        passed = check_given(MIDDLEWARE_DECLARED, given)
        found, _ = from_environ(
            MIDDLEWARE_DECLARED, (name for name in MIDDLEWARE_DECLARED if name not in passed), environ
        )
        config = cls(**{**found, **passed})
        if config.retry_after < 0:
            raise ValueError(f"retry_after={config.retry_after!r} must be 0 or more seconds")
        for name, value in (("max_in_flight", config.max_in_flight), ("reject_over", config.reject_over)):
            if value is not None and value < 1:
                raise ValueError(f"{name}={value!r} must be at least 1 (or None for no limit)")
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
