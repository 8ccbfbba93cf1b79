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
from .._drain._status import SERVING, State
from ._frames import FinalFrame
from ._lifecycle import Lifecycle
from ._types import ASGIApp

if TYPE_CHECKING:
    from ._metrics import MultiprocessMirror

__all__ = ["ANNOUNCEMENT", "Shared"]

# What a response says to the balancers once the drain has begun (``announce_drain``). An Envoy
# that actively health-checks this host takes it out of its load balancing at once on seeing it
# (Envoy's router filter: x-envoy-immediate-health-check-fail), rather than at its next failed
# check or its control plane's next endpoint update. Anything else in front ignores it.
ANNOUNCEMENT = ((b"x-envoy-immediate-health-check-fail", b"true"),)


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
    announce_drain: bool
    ready_on_startup: bool
    admin: bool
    socket_dir: str | None
    socket_mode: int
    mirror: MultiprocessMirror | None
    lifecycle: Lifecycle  # whether a lifespan runs, and the rule for requests without one

    def drain_headers(self) -> tuple[tuple[bytes, bytes], ...]:
        """The headers a response gets once the drain has begun: its announcement, or () (off the hot path).

        Every response the middleware sends or passes on from the drain's start (or the engine's
        failure) carries it: the admitted requests', the refusals and the probes'. The drain's result
        keeps the first.
        """
        drain = self.drain
        if not self.announce_drain or drain.state is SERVING or drain.state is State.STARTING:
            return ()
        drain.record_announcement()
        return ANNOUNCEMENT
