"""A drain's internal face: what graceful's own packages use of a ``Drain`` beyond its documented API.

``Drain`` (``_state``) is the public face; ``_state.core(drain)`` returns its ``Core``: the state and
when it was entered, the ledger of work in flight and its tally, admission during a drain (the
propagation phase, connections pinned at the drain's start, handoff), the current drain run, the
listeners, the launcher that handles SIGTERM, and the failure that entered FAILED. Its fields change
only through its methods: the transitions (``begin``, ``resume``, ``stop``, ``fail``, ``restart``,
all through ``transition``, the one place the state changes) and the admissions. The middleware, the
admin server, the metrics and the launcher use it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio

from ._advice import outlook
from ._ledger import Ledger
from ._options import DrainConfig, Overrides
from ._run import DrainRun
from ._status import DRAINING, FAILED, SERVING, STOPPED, DrainResult, Failure, State, Tally

if TYPE_CHECKING:
    from ._advice import Outlook

__all__ = ["Core", "Duration"]

logger = logging.getLogger("graceful")

Duration = float | str | None  # seconds, or a duration such as "10s"; None: the configured value


class Core:
    """What graceful's own packages use of a ``Drain`` beyond its documented API (through :func:`core`).

    ``state`` and ``since`` are plain attributes, read on the middleware's hot path (``Drain``'s
    read-only properties return them); ``transition`` alone writes them. The ledger of work in flight
    and its tally; admission during a drain (the propagation phase, connections pinned at the drain's
    start, handoff); the current (or last) drain run; the listeners; the launcher that handles SIGTERM;
    the failure that entered FAILED.
    """

    # Whether STOPPED was entered from DRAINING or FAILED (``stop`` sets it; only STOPPED reads it): work
    # refused then stays refused until a new lifecycle begins with a lifespan startup (see restart).
    _ended_in_drain = False

    def __init__(self, config: DrainConfig) -> None:
        self.config = config
        self.state = State.STARTING
        self.since = time.time()  # wall-clock time at which the current state was entered
        self.tally = tally = Tally()
        self.ledger = Ledger(tally)  # everything admitted and not yet finished
        # Connections (peer addresses) that were open when the drain began: see admit_pinned.
        self._pinned: set[object] = set()
        self._run: DrainRun | None = None  # the current (or last) drain run
        self._listeners: list[Callable[[], None]] = []
        # Set by a drain run once its propagation phase is over with handoff_streams on (start_handoff):
        # resumable streams are then ended for their clients to continue elsewhere.
        self._handing_off = False
        # The launcher that handles SIGTERM for this process when it is not the middleware (``graceful
        # run``: set_launcher), and how it lists the peers of its open connections.
        self._launcher: str | None = None
        self._open_peers: Callable[[], Iterable[object]] | None = None
        self._failure: Failure | None = None  # why the server is FAILED

    # -- read ------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self.ledger.table)

    def items(self) -> tuple[Any, ...]:
        return self.ledger.items()

    def leftover(self) -> tuple[str, ...]:
        return self.ledger.leftover()

    @property
    def run(self) -> DrainRun | None:
        """The current (or last) drain run; None before the first drain."""
        return self._run

    @property
    def failure(self) -> Failure | None:
        return self._failure

    @property
    def handing_off(self) -> bool:
        """Whether the drain's run has begun handing resumable streams off (until it is resumed or restarted)."""
        return self._handing_off

    @property
    def middleware_drains_on_sigterm(self) -> bool:
        """Whether the middleware takes SIGTERM (``drain_on_sigterm``, and no launcher handles it)."""
        return self.config.drain_on_sigterm and self._launcher is None

    @property
    def stopped_draining(self) -> bool:
        """True while STOPPED after a drain or a failure (the lifecycle ended in one), False otherwise."""
        return self.state is STOPPED and self._ended_in_drain

    def handed_off(self) -> int:
        """Streams the current (or last) drain has handed off so far."""
        return 0 if self._run is None else self._run.handed_off()

    def outlook(self, limit: float | None = None) -> Outlook:
        """The work in flight judged by the durations seen: how much may outlast the time left to the
        deadline (the running drain's, else ``limit``, else the budget's)."""
        run = self._run
        if self.state is DRAINING and run is not None:
            left = max(0.0, run.deadline - time.monotonic())
        else:
            left = self.config.budget.limit if limit is None else limit
        return outlook(self.ledger.ages(), self.tally.histograms.snapshot(), left)

    # -- who is told, and who launched the server ------------------------------------------

    def add_listener(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def notify(self) -> None:
        """Call the listeners (after a state change, and when a drain run has its result)."""
        for callback in self._listeners:
            callback()

    def set_launcher(self, name: str, open_peers: Callable[[], Iterable[object]] | None = None) -> None:
        """A launcher runs this server (``graceful run``, the one named seam for it): it handles SIGTERM
        (``name`` says who; the middleware then leaves SIGTERM alone), and ``open_peers`` lists the peers
        of its open connections, pinned at a drain's start beside the busy ones (see admit_pinned)."""
        self._launcher = name
        self._open_peers = open_peers

    # -- admission -------------------------------------------------------------------------

    def admit_arrival(self) -> bool:
        """A new request arrived while not SERVING (the slow path): count its arrival for the quiet rule,
        and say whether the propagation phase admits it.

        While DRAINING, every call is a new request (probes and exempt paths never get here): during
        the propagation phase its arrival time is recorded, admitted or refused alike, for the quiet
        rule and ``graceful_propagation_seconds``; it is admitted unless
        ``admit_during_propagation=False``. After the phase, nothing is (but see admit_pinned).
        """
        if self.state is SERVING:
            return True
        run = self._run
        if self.state is not DRAINING or run is None:
            return False
        return run.record_arrival(time.monotonic()) and self.config.admit_during_propagation

    def admit_pinned(self, peer: object) -> bool:
        """A new request on the connection ``peer`` arrived after the propagation phase: admit it once if
        the connection was pinned at the drain's start, and unpin it.

        The balancer did not route it: it came on a connection that was already open when the drain
        began, which its client reuses once more. It is served, with ``Connection: close``, until the
        deadline (not with ``admit_during_propagation=False``).
        """
        run = self._run
        if self.state is not DRAINING or run is None or not self.config.admit_during_propagation:
            return False
        if peer is not None and peer in self._pinned and time.monotonic() < run.deadline:
            self._pinned.discard(peer)
            return True
        return False

    def record_announcement(self) -> None:
        """A response told the balancers of the drain (``announce_drain``); the drain's result keeps the first."""
        run = self._run
        if run is not None and self.state is not SERVING:
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
        """``Drain.begin_drain`` with values already judged (the admin server judges them for its 400).

        A call during a drain joins it; if that drain has drained while work admitted after it (a
        pinned connection's one more request) is still in flight, it starts a follow-up run that waits
        for that work within the same deadline, so that the exit that follows (SIGTERM) cuts nothing.
        """
        if self.state is STOPPED:
            return False
        run = self._run
        if run is not None and (self.state is DRAINING or self._draining_failed()):
            result = run.result
            if result is not None and result.drained and self.in_flight and time.monotonic() < run.deadline:
                self._start(run.follow())
            return False
        self._start(DrainRun(self, reason, wait=overrides.wait, quiet=overrides.quiet, limit=overrides.limit))
        if self.state is FAILED:
            logger.info("drain begins while FAILED (reason=%s, in_flight=%d)", reason, self.in_flight)
            self.notify()
            return True
        # A connection busy now may bring one more request once its response ends: pin it, and the
        # launcher's open connections too (it sees the idle ones).
        for item in self.ledger.items():
            peer = item.peer()
            if peer is not None:
                self._pinned.add(peer)
        if self._open_peers is not None:
            self._pinned.update(self._open_peers())
        self.transition(DRAINING, reason)
        return True

    async def join(self) -> DrainResult:
        """Wait for the drain begun and return its result: the first caller leads its run, later callers
        wait for it. Outside a drain, the last drain's result (or what became of it)."""
        run = self._run
        if run is None:  # stopped before any drain began
            return DrainResult("stopped", self.in_flight, 0.0, "", 0.0, 0.0)
        if self.state is not DRAINING and not self._draining_failed():
            return run.result or run.snapshot("stopped" if self.state is STOPPED else "resumed", self.in_flight)
        return run.result or await run.join()

    def start_handoff(self) -> None:
        """The drain's run hands resumable streams off from now on (``handoff_streams``)."""
        self._handing_off = True

    def _draining_failed(self) -> bool:
        """Whether a drain of this lifecycle runs (or has ended) while FAILED: a drain to join."""
        return self.state is FAILED and self._run is not None and self._run.ended is None

    def _start(self, run: DrainRun) -> None:
        self._run = run
        self.ledger.waker = run.wake  # a release that empties the ledger wakes the run

    async def until_arrival(self, done: anyio.Event) -> None:
        """Until ``done`` is set or a new request of the running drain's propagation phase arrives (the
        admin server sends a progress line then)."""
        run = self._run
        if run is None or self.state is not DRAINING:
            await done.wait()
            return
        async with anyio.create_task_group() as tg:

            async def wait(event: anyio.Event) -> None:
                await event.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(wait, done)
            tg.start_soon(wait, run.next_arrival())

    # -- the lifecycle ---------------------------------------------------------------------

    def resume(self) -> bool:
        """DRAINING -> SERVING: the drain's run ends as resumed, and its marks (pinned connections,
        handoff) go; returns False in any other state."""
        if self.state is not DRAINING:
            return False
        self._pinned.clear()
        self._handing_off = False
        if self._run is not None:
            self._run.end("resumed")
        self.transition(SERVING, "resume")
        return True

    def stop(self, reason: str) -> None:
        """Enter STOPPED: the end of this lifecycle (and of a drain's run under way)."""
        if self.state is STOPPED:
            return
        self._ended_in_drain = self.state is DRAINING or self.state is FAILED
        if self._run is not None:
            self._run.end("stopped")
        self.transition(STOPPED, reason)

    def fail(self, reason: str, detail: str) -> bool:
        """Enter FAILED (see ``Drain.mark_failed``); returns True if this call entered it."""
        if self.state is FAILED or self.state is STOPPED:
            return False
        self._failure = Failure(reason, detail, time.time())  # FAILED admits nothing: the pins go at restart
        self.tally.add(self.tally.failures, reason)
        self.transition(FAILED, reason)
        if detail:
            logger.warning("failed (%s): %s", reason, detail)
        return True

    def restart(self, reason: str = "lifespan startup") -> bool:
        """STOPPED -> STARTING: a new lifecycle in the same process; returns False in any other state.

        The same app object can be started again (a test client used as a context manager
        twice, a server run twice in one process). Counters and the last drain's result
        carry over; the drain's per-cycle marks (pinned connections, handoff) do not.
        """
        if self.state is not STOPPED:
            return False
        self._pinned.clear()
        self._handing_off = False
        self._failure = None
        self.transition(State.STARTING, reason)
        return True

    def transition(self, new: State, reason: str) -> None:
        """Move to ``new`` (the one place ``state`` and ``since`` change), log it, and tell the listeners."""
        old = self.state
        self.state = new
        now = time.time()
        elapsed = now - self.since
        self.since = now
        when = datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")
        # Quiet outside a drain (docs/middleware.md, "Logging"): only entering or leaving DRAINING
        # is news to the app's operators; starting up and a plain shutdown are DEBUG.
        logger.log(
            logging.WARNING if new is FAILED else logging.INFO if DRAINING in (old, new) else logging.DEBUG,
            "state %s -> %s at %s (reason=%s, in_flight=%d, elapsed=%.3fs)",
            *(old.value, new.value, when, reason, self.in_flight, elapsed),
        )
        self.notify()
