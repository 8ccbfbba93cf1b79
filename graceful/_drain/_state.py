"""The drain state machine: one explicit, process-wide object (like uvicorn's ``ServerState``).

``Drain`` knows nothing of ASGI or HTTP. The middleware, the admin listener and
queue consumers all use it as it is. It holds the state and its listeners, decides
admission and keeps the ledger of work in flight; a drain run (``_run.py``) does the
waiting.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Any

from ._advice import Outlook, outlook
from ._ledger import Ledger, NotAccepting, track
from ._options import DrainConfig
from ._run import DrainRun
from ._status import DRAINING, FAILED, SERVING, STOPPED, DrainResult, DrainStatus, Failure, State, Tally

__all__ = ["Drain", "DrainResult", "DrainStatus", "NotAccepting", "State"]

logger = logging.getLogger("graceful")

Duration = float | str | None  # seconds, or a duration such as "10s"; None: the configured value


class Drain(Ledger):
    """The STARTING -> SERVING -> DRAINING -> STOPPED machine (and FAILED) and the work in flight.

    One per process. ``begin_drain()`` flips to DRAINING in one synchronous step:
    readiness fails and ``accepting`` turns False, while admitted work goes on. New
    requests are still served until the propagation wait ends (by then the balancers
    have stopped sending), and refused after it; with ``admit_during_propagation=False``
    they are refused from the first instant. ``await drain()`` returns when the
    propagation wait has passed and nothing is in flight, or when the deadline passes.
    ``mark_failed()`` enters FAILED when the engine behind the server has died: new work
    is refused at once, and only a new lifecycle leads back to SERVING.
    The options are the fields of ``DrainConfig``. ``state`` and ``since`` are
    read-only: only the transition methods below change them.
    """

    def __init__(self, **options: Any) -> None:
        self.config = config = DrainConfig.resolve(**options)
        self.budget = config.budget
        self.admit_during_propagation = config.admit_during_propagation
        self.state = State.STARTING
        self.since = time.time()  # wall-clock time at which the current state was entered
        # The ledger (the base class): everything admitted and not yet finished.
        tally = Tally()
        super().__init__(tally)
        # Connections (peer addresses) that were open when the drain began: see middleware.
        self.pinned: set[object] = set()
        self.drain_durations = tally.drain_durations
        self.propagation_durations = tally.propagation_durations
        self._run: DrainRun | None = None  # the current (or last) drain run
        self._listeners: list[Callable[[], None]] = []
        # Set by a drain run once its propagation phase is over with handoff_streams on:
        # resumable streams are then ended for their clients to continue elsewhere.
        self.handing_off = False
        # Who handles SIGTERM for this process when it is not the middleware (``graceful run``
        # sets it); while None, the middleware drains on SIGTERM (``drain_on_sigterm``).
        self.signals_owner: str | None = None
        # Whether STOPPED was entered from DRAINING or FAILED: work refused then stays refused until
        # a new lifecycle begins with a lifespan startup (see restart).
        self._stopped_draining = False
        self._failure: Failure | None = None  # why the server is FAILED

    # -- reading ---------------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        """True only while SERVING: queue consumers should take no new work otherwise."""
        return self.state is SERVING

    @property
    def drain_run(self) -> DrainRun | None:
        """The current (or last) drain run."""
        return self._run

    @property
    def last_result(self) -> DrainResult | None:
        return None if self._run is None else self._run.result

    @property
    def failure(self) -> Failure | None:
        """Why the server is FAILED: set by ``mark_failed``, kept until a new lifecycle begins."""
        return self._failure

    def admit_arrival(self, peer: object = None) -> bool:
        """A new request arrived: record it, and say whether it may start (the slow path; SERVING
        is checked inline).

        While DRAINING, every call is a new request (probes and exempt paths never get
        here): during the propagation phase its arrival time is recorded, admitted or
        refused alike, for the quiet rule and ``graceful_propagation_seconds``. After it,
        a request on a connection pinned at the drain's start is admitted once, and the
        connection is unpinned.
        """
        if self.state is SERVING:
            return True
        run = self._run
        if self.state is not DRAINING or run is None:
            return False
        now = time.monotonic()
        if run.in_propagation(now):
            return self.admit_during_propagation
        # The balancer did not route a request on a connection that was already open
        # when the drain began: serve it once, with Connection: close.
        if self.admit_during_propagation and peer is not None and peer in self.pinned and now < run.deadline:
            self.pinned.discard(peer)
            return True
        return False

    def record_announcement(self) -> None:
        """A response told the balancers of the drain (``announce_drain``); the drain's result keeps the first."""
        run = self._run
        if run is not None and self.state is not SERVING:
            run.announce(time.monotonic())

    def status(self) -> DrainStatus:
        run = self._run
        shown = run is not None and (self.state is DRAINING or self.state is FAILED or run.result is not None)
        times = run.times(time.monotonic()) if run is not None and shown else {}
        tally = self.tally
        return DrainStatus(
            self.state,
            self.in_flight,
            os.getpid(),
            self.since,
            counters=self.counters(),
            budget=self.config.in_force(),
            durations=tally.durations.as_dict(),
            propagation=tuple(tally.propagation_durations),
            failure=self._failure,
            **times,
        )

    def outlook(self, limit: float | None = None) -> Outlook:
        """The work in flight judged by the durations seen: how much may outlast the time left to the
        deadline (the running drain's, else ``limit``, else the budget's)."""
        run = self._run
        if self.state is DRAINING and run is not None:
            left = max(0.0, run.deadline - time.monotonic())
        else:
            left = self.budget.limit if limit is None else limit
        return outlook(self.ages(), self.tally.durations.histograms(), left)

    def handed_off(self) -> int:
        """Streams the current (or last) drain has handed off so far."""
        return 0 if self._run is None else self._run.handed_off()

    def counters(self) -> dict[str, dict[str, int]]:
        return self.tally.as_dict()

    # -- transitions -------------------------------------------------------------------

    @property
    def stopped_draining(self) -> bool:
        """True while STOPPED after a drain or a failure (the lifecycle ended in one), False otherwise."""
        return self.state is STOPPED and self._stopped_draining

    def mark_serving(self, reason: str = "ready") -> None:
        """STARTING -> SERVING: call once weights are loaded (with ``ready_on_startup=False``)."""
        if self.state is State.STARTING:
            self._transition(SERVING, reason)
        elif self.state is not SERVING:
            logger.info("mark_serving() ignored: state is %s", self.state.value)

    def begin_drain(
        self,
        reason: str = "drain",
        *,
        propagation_wait: Duration = None,
        timeout: Duration = None,
        propagation_quiet: Duration = None,
    ) -> bool:
        """Enter DRAINING at once; returns True if this call started the drain.

        Idempotent: a call during a drain joins it and changes neither its clock nor
        its deadline. The first caller's ``propagation_wait``, ``propagation_quiet``
        and ``timeout`` apply. While FAILED the state stays FAILED: the drain's run waits
        for the work in flight as in DRAINING, and nothing new is admitted meanwhile.
        Raises :class:`ConfigError` for bad values, leaving the state untouched.
        """
        # Parse first: bad input must leave the state untouched.
        wait, quiet, limit = self.config.overridden(propagation_wait, propagation_quiet, timeout)
        if self.state is DRAINING or self.state is STOPPED or self._draining_failed():
            return False
        self._start(DrainRun(self, reason, wait=wait, quiet=quiet, limit=limit))
        if self.state is FAILED:
            logger.info("drain begins while FAILED (reason=%s, in_flight=%d)", reason, self.in_flight)
            self.notify()
            return True
        # A connection busy now may bring one more request once its response ends: pin it (a
        # launcher that sees its server's connections pins the idle ones too).
        for item in self.items():
            peer = item.peer()
            if peer is not None:
                self.pinned.add(peer)
        self._transition(DRAINING, reason)
        return True

    def check_overrides(
        self, *, propagation_wait: Duration = None, propagation_quiet: Duration = None, timeout: Duration = None
    ) -> tuple[float, float | None, float]:
        """The (wait, quiet, limit) a drain with these overrides would use; raises ConfigError."""
        return self.config.overridden(propagation_wait, propagation_quiet, timeout)

    def _draining_failed(self) -> bool:
        """Whether a drain of this lifecycle runs (or has ended) while FAILED: a drain to join."""
        return self.state is FAILED and self._run is not None and self._run.ended is None

    def resume(self) -> bool:
        """DRAINING -> SERVING (maintenance undrain); returns False in any other state, FAILED included."""
        if self.state is not DRAINING:
            return False
        self.pinned.clear()
        self.handing_off = False
        if self._run is not None:
            self._run.end("resumed")
        self._transition(SERVING, "resume")
        return True

    def mark_stopped(self, reason: str = "shutdown") -> None:
        """Enter STOPPED (lifespan shutdown): the end of this lifecycle."""
        if self.state is not STOPPED:
            self._stopped_draining = self.state is DRAINING or self.state is FAILED
            if self._run is not None:
                self._run.end("stopped")
            self._transition(STOPPED, reason)

    def restart(self, reason: str = "lifespan startup") -> bool:
        """STOPPED -> STARTING: a new lifecycle in the same process; returns False in any other state.

        The same app object can be started again (a test client used as a context manager
        twice, a server run twice in one process). Counters and the last drain's result
        carry over; the drain's per-cycle marks (pinned connections, handoff) do not.
        """
        if self.state is not STOPPED:
            return False
        self.pinned.clear()
        self.handing_off = False
        self._stopped_draining = False
        self._failure = None
        self._transition(State.STARTING, reason)
        return True

    def mark_failed(self, reason: str, detail: str = "") -> bool:
        """Enter FAILED: the engine behind this server has died (``reason``, e.g. ``engine_dead``, and what
        was seen). Returns True if this call entered it.

        From STARTING, SERVING or DRAINING. Readiness fails and every new request is refused as
        not started, at once: no propagation wait, since the app could not serve it. Work in flight
        goes on and is counted to its end; a drain under way keeps its clock and deadline. Nothing
        leads back to SERVING: ``resume()`` returns False, and only a new lifecycle (a lifespan
        startup after STOPPED) clears the failure.
        """
        if self.state is FAILED or self.state is STOPPED:
            return False
        self._failure = Failure(reason, detail, time.time())
        self.pinned.clear()
        self.tally.add(self.tally.failures, reason)
        self._transition(FAILED, reason)
        if detail:
            logger.warning("failed (%s): %s", reason, detail)
        return True

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every state change (used by metrics and the admin listener)."""
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        """Stop calling ``callback`` (a listener whose owner has ended, such as an admin listener)."""
        if callback in self._listeners:
            self._listeners.remove(callback)

    def notify(self) -> None:
        """Call the listeners (after a state change, and when a drain run has its result)."""
        for callback in self._listeners:
            callback()

    def _start(self, run: DrainRun) -> None:
        self._run = run
        self.wake_when_empty(run.wake)  # a release that empties the ledger wakes the run

    def _transition(self, new: State, reason: str) -> None:
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

    # -- counting (the ledger's own methods are on its base class, Ledger) -----------------------

    def count_rejected(self, reason: str) -> None:
        self.tally.add(self.tally.rejected, reason)

    def track(self, name: str = "job") -> AbstractAsyncContextManager[None]:
        """Count non-HTTP work (a queue consumer's job) as in flight: ``async with drain.track():``.

        Raises :class:`NotAccepting` unless SERVING. At the drain deadline the block is
        cancelled and counted as truncated.
        """
        return track(self, name)

    # -- draining ------------------------------------------------------------------------

    async def drain(
        self,
        *,
        propagation_wait: Duration = None,
        timeout: Duration = None,
        reason: str = "drain",
        propagation_quiet: Duration = None,
    ) -> DrainResult:
        """Drain and wait: the first caller runs the drain, later callers join it.

        Returns once the propagation wait has passed and in-flight work is zero, or
        once the deadline has passed (work still running then is expired).
        """
        self.begin_drain(
            reason, propagation_wait=propagation_wait, timeout=timeout, propagation_quiet=propagation_quiet
        )
        run = self._run
        if run is None:  # stopped before any drain began
            return DrainResult("stopped", self.in_flight, 0.0, "", 0.0, 0.0)
        if self.state is not DRAINING and not self._draining_failed():
            return run.result or run.snapshot("stopped" if self.state is STOPPED else "resumed", self.in_flight)
        result = run.result
        if result is not None:
            if not (result.drained and self.in_flight and time.monotonic() < run.deadline):
                return result
            run = run.follow()
            self._start(run)
        return await run.join()
