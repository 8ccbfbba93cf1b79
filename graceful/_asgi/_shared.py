"""What one middleware shares with the requests, sockets and lifespans it runs.

Its options as the helpers read them, and the live objects behind them: the app, the
process's ``Drain``, the request-id counter, the lifecycle and the metrics mirror. The
record itself never changes after the middleware is built; the objects it holds do.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._drain._state import Drain
from ._frames import FinalFrame
from ._lifecycle import Lifecycle
from ._types import ASGIApp

if TYPE_CHECKING:
    from ._metrics import MultiprocessMirror

__all__ = ["Shared"]


@dataclass(frozen=True, slots=True)
class Shared:
    """What one ``GracefulMiddleware`` shares with ``_http``, ``_refusal``, ``_websocket`` and ``_lifespan``."""

    app: ASGIApp
    drain: Drain
    retry_after: bytes  # the Retry-After value of refusals
    request_id_header: bytes | None  # lower-case; None: no request-id echo
    id_prefix: bytes  # request ids made here are id_prefix + the next of ids
    ids: Iterator[int]
    final_frame: FinalFrame
    ready_on_startup: bool
    admin: bool
    socket_dir: str | None
    socket_mode: int
    mirror: MultiprocessMirror | None
    lifecycle: Lifecycle  # whether a lifespan runs, and the rule for requests without one
