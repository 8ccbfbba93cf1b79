"""graceful: lossless rolling updates for LLM inference servers.

Names are imported on first use, so ``graceful drain`` (a preStop hook, whose time
counts against the grace period) does not pay for the middleware and metrics.
"""

from __future__ import annotations

import importlib

# typing's import costs the preStop hook milliseconds; mypy reads the annotations anyway.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._asgi._frames import default_final_frame
    from ._asgi._middleware import GracefulMiddleware
    from ._drain._budget import Budget, parse_duration
    from ._drain._errors import ConfigError
    from ._drain._ledger import NotAccepting
    from ._drain._state import Drain
    from ._drain._status import DrainResult, DrainStatus, State
    from ._resume._transport import AsyncResumingTransport, ResumingTransport

__version__ = "0.1.0"

__all__ = [
    "AsyncResumingTransport",
    "Budget",
    "ConfigError",
    "Drain",
    "DrainResult",
    "DrainStatus",
    "GracefulMiddleware",
    "NotAccepting",
    "ResumingTransport",
    "State",
    "default_final_frame",
    "parse_duration",
]

_HOMES = {
    "Budget": "._drain._budget",
    "ConfigError": "._drain._errors",
    "parse_duration": "._drain._budget",
    "default_final_frame": "._asgi._frames",
    "GracefulMiddleware": "._asgi._middleware",
    "ResumingTransport": "._resume._transport",
    "AsyncResumingTransport": "._resume._transport",
    "Drain": "._drain._state",
    "DrainResult": "._drain._status",
    "DrainStatus": "._drain._status",
    "NotAccepting": "._drain._ledger",
    "State": "._drain._status",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'graceful' has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
