"""The middleware's own options, declared once: default, variable and check.

``GracefulMiddleware(...)`` takes these beside the drain options (``graceful/_drain/_options.py``).
Each field says its default and how its ``GRACEFUL_*`` variable is read; ``MiddlewareConfig.resolve``
takes what the caller passed, fills the rest from the environment, else the default, and checks
the values. ``ENVIRON`` is every option's variable, drain and middleware alike, in the order of
the documentation's table, which ``environment_rows`` writes and a test holds to the page.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .._drain._environ import (
    Env,
    count,
    flag,
    is_none,
    named_object,
    resolve,
    table_rows,
    whole_seconds,
)
from .._drain._errors import ConfigError
from .._drain._options import DRAIN_ENVIRON
from ._frames import FinalFrame, default_final_frame

__all__ = ["DEFAULTS", "ENVIRON", "MIDDLEWARE_ENVIRON", "MiddlewareConfig", "environment_rows"]


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


def _option(default: Any, env: Env) -> Any:
    return field(default=default, metadata={"env": env})


@dataclass(frozen=True)
class MiddlewareConfig:
    """The middleware's options, resolved and checked (the drain's are ``DrainConfig``)."""

    ready_path: str = _option("/ready", Env(_path, "a path starting with `/`"))
    live_path: str = _option("/live", Env(_path, "a path"))
    startup_path: str = _option("/startup", Env(_path, "a path"))
    exempt_paths: Iterable[str] = _option((), Env(_paths, "paths separated by commas (`/metrics,/version`)"))
    metrics_path: str | None = _option(None, Env(_optional_path, "a path, or `none`"))
    retry_after: int = _option(1, Env(whole_seconds, "whole seconds"))
    max_in_flight: int | None = _option(None, Env(count, "a whole number ≥ 1, or `none`"))
    reject_over: int | None = _option(None, Env(count, "a whole number ≥ 1, or `none`"))
    live_check: Callable[[], bool] | None = _option(None, Env(named_object, "`module:function`, imported"))
    fail_liveness: bool = _option(False, Env(flag, "`1`/`0`"))
    ready_on_startup: bool = _option(True, Env(flag, "`1`/`0`"))
    request_id_header: str | None = _option(None, Env(_header, "a header name (`x-request-id`), or `none`"))
    admin: bool = _option(True, Env(flag, "`1`/`0`"))
    socket_dir: str | None = _option(None, Env(lambda var, raw: raw, "a directory (also read by `graceful drain`)"))
    socket_mode: int = _option(0o600, Env(_mode, "`0600` or `0660`"))
    final_frame: FinalFrame = _option(default_final_frame, Env(named_object, "`module:function`, imported"))
    announce_drain: bool = _option(True, Env(flag, "`1`/`0`"))

    @classmethod
    def resolve(cls, **given: Any) -> MiddlewareConfig:
        """Options as passed (``UNSET`` where not), else from their variables, else the defaults; checked."""
        config = cls(**resolve(MIDDLEWARE_ENVIRON, given, DEFAULTS))
        if config.retry_after < 0:
            raise ValueError(f"retry_after={config.retry_after!r} must be 0 or more seconds")
        for name, value in (("max_in_flight", config.max_in_flight), ("reject_over", config.reject_over)):
            if value is not None and value < 1:
                raise ValueError(f"{name}={value!r} must be at least 1 (or None for no limit)")
        return config


_FIELDS = dataclasses.fields(MiddlewareConfig)
DEFAULTS: dict[str, Any] = {f.name: f.default for f in _FIELDS}
MIDDLEWARE_ENVIRON: dict[str, Env] = {f.name: f.metadata["env"] for f in _FIELDS}
# Every option's variable: the drain's, then the middleware's.
ENVIRON: dict[str, Env] = {**DRAIN_ENVIRON, **MIDDLEWARE_ENVIRON}


def environment_rows() -> list[str]:
    """The rows of the documentation's table of variables (docs/middleware.md, "From the environment")."""
    return table_rows(ENVIRON)
