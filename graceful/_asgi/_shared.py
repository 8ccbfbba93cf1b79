"""What one middleware shares with the requests, sockets and lifespans it runs.

Its options (``MiddlewareConfig``, and the header values made from them once), and the live
objects behind them: the app, the process's ``Drain`` (its internal face and ledger too), the
request-id counter, the lifecycle and the metrics mirror. The
record itself never changes after the middleware is built; the objects it holds do.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._drain._core import Core
from .._drain._ledger import Ledger
from .._drain._state import Drain
from .._drain._status import SERVING, State
from ._frames import FinalFrame
from ._lifecycle import Lifecycle
from ._options import MiddlewareConfig
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
    core: Core  # the drain's internal face
    ledger: Ledger  # the drain's ledger of work in flight
    options: MiddlewareConfig
    retry_after: bytes  # the Retry-After value of refusals
    request_id_header: bytes | None  # lower-case; None: no request-id echo
    id_prefix: bytes  # request ids made here are id_prefix + the next of ids
    ids: Iterator[int]
    final_frame: FinalFrame
    mirror: MultiprocessMirror | None
    lifecycle: Lifecycle  # whether a lifespan runs, and the rule for requests without one

    def announce(self) -> tuple[tuple[bytes, bytes], ...]:
        """Announce the drain in a response: record the announcement (the drain's result keeps the
        first) and return the headers that carry it, or () before the drain (off the hot path).

        Every response the middleware sends or passes on from the drain's start (or the engine's
        failure) carries it: the admitted requests', the refusals and the probes'.
        """
        state = self.core.state
        if not self.options.announce_drain or state is SERVING or state is State.STARTING:
            return ()
        self.core.record_announcement()
        return ANNOUNCEMENT
