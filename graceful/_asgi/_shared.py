"""What the middleware's helpers read: a small frozen config instead of the middleware itself."""

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

__all__ = ["Config"]


@dataclass(frozen=True, slots=True)
class Config:
    """The settings of one ``GracefulMiddleware``, for ``_http``, ``_websocket`` and ``_lifespan``."""

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
