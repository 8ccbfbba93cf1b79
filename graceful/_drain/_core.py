"""A drain's internal face: what graceful's own packages use of a ``Drain`` beyond its documented API.

``Drain`` (``_state``) is the public face; ``_state.core(drain)`` returns its ``Core``: the
ledger of work in flight and its tally, admission during a drain (the propagation phase,
connections pinned at the drain's start, handoff), the current drain run, the listeners,
who owns SIGTERM, the failure that entered FAILED, and the one place the state changes
(``transition``). The middleware, the admin server, the metrics and the launcher use it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from ._advice import outlook
from ._ledger import Ledger
from ._options import DrainConfig, Overrides
from ._run import DrainRun
from ._status import DRAINING, FAILED, SERVING, STOPPED, DrainResult, Failure, State, Tally

if TYPE_CHECKING:
    from ._advice import Outlook

__all__ = ["Core", "Duration", "Machine"]

logger = logging.getLogger("graceful")

Duration = float | str | None  # seconds, or a duration such as "10s"; None: the configured value


class Machine(Protocol):
    """The public face a ``Core`` serves (``Drain`` is one): its state, and when it was entered."""

    state: State
    since: float


class Core:
    """What graceful's own packages use of a ``Drain`` beyond its documented API (through :func:`core`).

    The ledger of work in flight and its tally; admission during a drain (the propagation phase,
    connections pinned at the drain's start, handoff); the current (or last) drain run; the
    listeners; who owns SIGTERM; the failure that entered FAILED.
    """

    def __init__(self, drain: Machine, config: DrainConfig) -> None:
        self.drain = drain
        self.config = config
        self.tally = tally = Tally()
        self.ledger = Ledger(tally)  # everything admitted and not yet finished
        # Connections (peer addresses) that were open when the drain began: see admit_arrival.
        self.pinned: set[object] = set()
        self.run: DrainRun | None = None  # the current (or last) drain run
        self.listeners: list[Callable[[], None]] = []
        # Set by a drain run once its propagation phase is over with handoff_streams on:
        # resumable streams are then ended for their clients to continue elsewhere.
        self.handing_off = False
        # Who handles SIGTERM for this process when it is not the middleware (``graceful run``
        # sets it); while None, the middleware drains on SIGTERM (``drain_on_sigterm``).
        self.signals_owner: str | None = None
        # Whether STOPPED was entered from DRAINING or FAILED: work refused then stays refused until
        # a new lifecycle begins with a lifespan startup (see restart).
        self.ended_in_drain = False
        self.failure: Failure | None = None  # why the server is FAILED

    # -- what a drain run reads (``_run.Machine``) -------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self.ledger.table)

    def items(self) -> tuple[Any, ...]:
        return self.ledger.items()

    def leftover(self) -> tuple[str, ...]:
        return self.ledger.leftover()

    def notify(self) -> None:
        """Call the listeners (after a state change, and when a drain run has its result)."""
        for callback in self.listeners:
            callback()

    # -- admission -------------------------------------------------------------------------

    def admit_arrival(self, peer: object = None) -> bool:
        """A new request arrived while not SERVING (the slow path): say whether it may start, and
        count its arrival for the quiet rule.

        While DRAINING, every call is a new request (probes and exempt paths never get
        here): during the propagation phase its arrival time is recorded, admitted or
        refused alike, for the quiet rule and ``graceful_propagation_seconds``. After it,
        a request on a connection pinned at the drain's start is admitted once, and the
        connection is unpinned.
        """
        drain = self.drain
        if drain.state is SERVING:
            return True
        run = self.run
        if drain.state is not DRAINING or run is None:
            return False
        now = time.monotonic()
        if run.record_arrival(now):
            return self.config.admit_during_propagation
        # The balancer did not route a request on a connection that was already open
        # when the drain began: serve it once, with Connection: close.
        if self.config.admit_during_propagation and peer is not None and peer in self.pinned and now < run.deadline:
            self.pinned.discard(peer)
            return True
        return False

    def record_announcement(self) -> None:
        """A response told the balancers of the drain (``announce_drain``); the drain's result keeps the first."""
        run = self.run
        if run is not None and self.drain.state is not SERVING:
            run.announce(time.monotonic())

    def count_rejected(self, reason: str) -> None:
        self.tally.add(self.tally.rejected, reason)

    # -- the drain's run -------------------------------------------------------------------

    def overrides(
        self, propagation_wait: Duration = None, propagation_quiet: Duration = None, timeout: Duration = None
    ) -> Overrides:
        """A drain's own values judged against the budget; raises ConfigError (the state untouched)."""
        return Overrides(self.config, propagation_wait, propagation_quiet, timeout)

    def begin(self, reason: str, overrides: Overrides) -> bool:
        """``Drain.begin_drain`` with values already judged (the admin server judges them for its 400)."""
        drain = self.drain
        if drain.state is DRAINING or drain.state is STOPPED or self._draining_failed():
            return False
        self._start(DrainRun(self, reason, wait=overrides.wait, quiet=overrides.quiet, limit=overrides.limit))
        if drain.state is FAILED:
            logger.info("drain begins while FAILED (reason=%s, in_flight=%d)", reason, self.in_flight)
            self.notify()
            return True
        # A connection busy now may bring one more request once its response ends: pin it (a
        # launcher that sees its server's connections pins the idle ones too).
        for item in self.ledger.items():
            peer = item.peer()
            if peer is not None:
                self.pinned.add(peer)
        self.transition(DRAINING, reason)
        return True

    async def join(self) -> DrainResult:
        """Wait for the drain begun: the first caller runs it, later callers join it."""
        drain = self.drain
        run = self.run
        if run is None:  # stopped before any drain began
            return DrainResult("stopped", self.in_flight, 0.0, "", 0.0, 0.0)
        if drain.state is not DRAINING and not self._draining_failed():
            return run.result or run.snapshot("stopped" if drain.state is STOPPED else "resumed", self.in_flight)
        result = run.result
        if result is not None:
            if not (result.drained and self.in_flight and time.monotonic() < run.deadline):
                return result
            run = run.follow()
            self._start(run)
        return await run.join()

    def _draining_failed(self) -> bool:
        """Whether a drain of this lifecycle runs (or has ended) while FAILED: a drain to join."""
        return self.drain.state is FAILED and self.run is not None and self.run.ended is None

    def _start(self, run: DrainRun) -> None:
        self.run = run
        self.ledger.waker = run.wake  # a release that empties the ledger wakes the run

    def handed_off(self) -> int:
        """Streams the current (or last) drain has handed off so far."""
        return 0 if self.run is None else self.run.handed_off()

    async def until_arrival(self, done: anyio.Event) -> None:
        """Until ``done`` is set or a new request of the running drain's propagation phase arrives (the
        admin server sends a progress line then)."""
        run = self.run
        if run is None or self.drain.state is not DRAINING:
            await done.wait()
            return
        async with anyio.create_task_group() as tg:

            async def wait(event: anyio.Event) -> None:
                await event.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(wait, done)
            tg.start_soon(wait, run.next_arrival())

    def outlook(self, limit: float | None = None) -> Outlook:
        """The work in flight judged by the durations seen: how much may outlast the time left to the
        deadline (the running drain's, else ``limit``, else the budget's)."""
        run = self.run
        if self.drain.state is DRAINING and run is not None:
            left = max(0.0, run.deadline - time.monotonic())
        else:
            left = self.config.budget.limit if limit is None else limit
        return outlook(self.ledger.ages(), self.tally.histograms.snapshot(), left)

    # -- the lifecycle ---------------------------------------------------------------------

    def restart(self, reason: str = "lifespan startup") -> bool:
        """STOPPED -> STARTING: a new lifecycle in the same process; returns False in any other state.

        The same app object can be started again (a test client used as a context manager
        twice, a server run twice in one process). Counters and the last drain's result
        carry over; the drain's per-cycle marks (pinned connections, handoff) do not.
        """
        if self.drain.state is not STOPPED:
            return False
        self.pinned.clear()
        self.handing_off = False
        self.ended_in_drain = False
        self.failure = None
        self.transition(State.STARTING, reason)
        return True

    @property
    def stopped_draining(self) -> bool:
        """True while STOPPED after a drain or a failure (the lifecycle ended in one), False otherwise."""
        return self.drain.state is STOPPED and self.ended_in_drain

    def transition(self, new: State, reason: str) -> None:
        """Move the drain to ``new`` (the one place its ``state`` and ``since`` change), log it, and tell
        the listeners."""
        drain = self.drain
        old = drain.state
        drain.state = new
        now = time.time()
        elapsed = now - drain.since
        drain.since = now
        when = datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")
        # Quiet outside a drain (docs/middleware.md, "Logging"): only entering or leaving DRAINING
        # is news to the app's operators; starting up and a plain shutdown are DEBUG.
        logger.log(
            logging.WARNING if new is FAILED else logging.INFO if DRAINING in (old, new) else logging.DEBUG,
            "state %s -> %s at %s (reason=%s, in_flight=%d, elapsed=%.3fs)",
            *(old.value, new.value, when, reason, self.in_flight, elapsed),
        )
        self.notify()
