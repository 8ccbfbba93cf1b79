"""Every option from the environment: one table, one prefix (``GRACEFUL_``).

A server that loads the middleware by name (``vllm serve --middleware
graceful.GracefulMiddleware`` calls it with the app alone) can only be configured from
its environment. Each option's variable is ``GRACEFUL_`` + its name in capitals. A value
given in code wins; a variable fills an option left at its default. A wrong value is
refused with the variable's name, the value and the fix.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._durations import ConfigError, parse_duration

__all__ = ["ENVIRON", "PREFIX", "from_environ", "variable"]

PREFIX = "GRACEFUL_"


def _duration(var: str, raw: str) -> float:
    return parse_duration(raw, name=f"environment variable {var}")


def _optional_duration(var: str, raw: str) -> float | None:
    return None if raw.lower() in _NONE else _duration(var, raw)


def _flag(var: str, raw: str) -> bool:
    text = raw.lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"environment variable {var}: {raw!r} is not a boolean; use 1 or 0")


def _count(var: str, raw: str) -> int | None:
    if raw.lower() in _NONE:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(
            f"environment variable {var}: {raw!r} is not a whole number of at least 1; use e.g. 64, or none"
        )
    return int(raw)


def _seconds(var: str, raw: str) -> int:
    if not raw.isdigit():
        raise ConfigError(f"environment variable {var}: {raw!r} is not a whole number of seconds; use e.g. 1")
    return int(raw)


def _path(var: str, raw: str) -> str:
    if not raw.startswith("/"):
        raise ConfigError(f"environment variable {var}: {raw!r} is not a path; use one that starts with /, e.g. /ready")
    return raw


def _optional_path(var: str, raw: str) -> str | None:
    return None if raw.lower() in _NONE else _path(var, raw)


def _paths(var: str, raw: str) -> tuple[str, ...]:
    return tuple(_path(var, part.strip()) for part in raw.split(",") if part.strip())


def _header(var: str, raw: str) -> str | None:
    if raw.lower() in _NONE:
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


def _object(var: str, raw: str) -> Any:
    """``module:attribute``, imported: hooks, ``live_check`` and ``final_frame`` by name."""
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


_NONE = ("none", "off")

# option -> how its variable is read. Options that are objects (registry, drain) have none.
ENVIRON: dict[str, Callable[[str, str], Any]] = {
    # Drain options (DrainConfig).
    "grace_period": _duration,
    "reserve": _duration,
    "drain_timeout": _optional_duration,
    "propagation_wait": _duration,
    "propagation_quiet": _optional_duration,
    "admit_during_propagation": _flag,
    "handoff_streams": _flag,
    "on_drain_start": _object,
    "on_drained": _object,
    "hook_timeout": _duration,
    "unwind_timeout": _duration,
    "drain_on_sigterm": _flag,
    # Middleware options (GracefulMiddleware).
    "ready_path": _path,
    "live_path": _path,
    "startup_path": _path,
    "exempt_paths": _paths,
    "metrics_path": _optional_path,
    "retry_after": _seconds,
    "max_in_flight": _count,
    "reject_over": _count,
    "live_check": _object,
    "ready_on_startup": _flag,
    "request_id_header": _header,
    "admin": _flag,
    "socket_dir": lambda var, raw: raw,
    "socket_mode": _mode,
    "final_frame": _object,
}


def variable(option: str) -> str:
    return PREFIX + option.upper()


def from_environ(options: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The options among ``options`` whose variables are set (and not empty), parsed."""
    env = os.environ if environ is None else environ
    found: dict[str, Any] = {}
    for option in options:
        var = variable(option)
        raw = env.get(var, "").strip()
        if raw:
            found[option] = ENVIRON[option](var, raw)
    return found
