"""The drain state machine: one explicit, process-wide object (like uvicorn's ``ServerState``).

``Drain`` knows nothing of ASGI or HTTP. The middleware, the admin listener and
queue consumers all use it as it is. Its public face is the documented API
(docs/middleware.md, "Python API"); what graceful's own packages need beyond it (the
ledger of work in flight, admission during a drain, the drain run, the listeners) is
the ``Core`` that :func:`core` returns. A drain run (``_run.py``) does the waiting.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Never

from ._admission import Admission
from ._budget import Budget
from ._core import Core, Duration
from ._environ import UNSET, Unset
from ._ledger import NotAccepting, track
from ._options import DRAIN_OPTIONS, DrainConfig, Hook, Overrides
from ._status import DRAINING, FAILED, SERVING, DrainResult, DrainStatus, Failure, State

__all__ = ["Drain", "DrainResult", "DrainStatus", "NotAccepting", "State", "core"]

logger = logging.getLogger("graceful")


class Drain:
    """The STARTING -> SERVING -> DRAINING -> STOPPED machine (and FAILED) and the work in flight.

    One per process. ``begin_drain()`` flips to DRAINING in one synchronous step:
    readiness fails and ``accepting`` turns False, while admitted work goes on. New
    requests are still served until the propagation wait ends (by then the balancers
    have stopped sending), and refused after it; with ``admit_during_propagation=False``
    they are refused from the first instant. ``await drain()`` returns when the
    propagation wait has passed and nothing is in flight, or when the deadline passes.
    ``mark_failed()`` enters FAILED when the engine behind the server has died: new work
    is refused at once, and only a new lifecycle leads back to SERVING.

    The options are keyword arguments (docs/middleware.md, "Options"); one not passed comes
    from its ``GRACEFUL_*`` variable, else its default. ``state`` and ``since`` are
    read-only: only the transition methods below change them.
    """

    def __init__(
        self,
        *,
        grace_period: Duration | Unset = UNSET,
        reserve: Duration | Unset = UNSET,
        drain_timeout: Duration | Unset = UNSET,
        propagation_wait: Duration | Unset = UNSET,
        propagation_quiet: Duration | Unset = UNSET,
        admit_during_propagation: bool | Unset = UNSET,
        handoff_streams: bool | Unset = UNSET,
        admission: Admission | Unset = UNSET,
        on_drain_start: Hook | None | Unset = UNSET,
        on_drained: Hook | None | Unset = UNSET,
        hook_timeout: Duration | Unset = UNSET,
        unwind_timeout: Duration | Unset = UNSET,
        drain_on_sigterm: bool | Unset = UNSET,
        **unknown: Never,
    ) -> None:
        if unknown:
            raise TypeError(f"unknown drain option(s) {sorted(unknown)}; the options are {sorted(DRAIN_OPTIONS)}")
        given = {
            "grace_period": grace_period,
            "reserve": reserve,
            "drain_timeout": drain_timeout,
            "propagation_wait": propagation_wait,
            "propagation_quiet": propagation_quiet,
            "admit_during_propagation": admit_during_propagation,
            "handoff_streams": handoff_streams,
            "admission": admission,
            "on_drain_start": on_drain_start,
            "on_drained": on_drained,
            "hook_timeout": hook_timeout,
            "unwind_timeout": unwind_timeout,
            "drain_on_sigterm": drain_on_sigterm,
        }
        self.config = DrainConfig.resolve(given, os.environ)  # the edge: variables fill what is not passed
        self._core = Core(self.config)

    # -- reading ---------------------------------------------------------------------

    @property
    def state(self) -> State:
        """The current state (read-only: the transition methods below change it)."""
        return self._core.state

    @property
    def since(self) -> float:
        """The wall-clock time at which the current state was entered (read-only)."""
        return self._core.since

    @property
    def budget(self) -> Budget:
        return self.config.budget

    @property
    def in_flight(self) -> int:
        """Requests and jobs admitted and not yet finished."""
        return len(self._core.ledger.table)

    @property
    def accepting(self) -> bool:
        """True only while SERVING: queue consumers should take no new work otherwise."""
        return self.state is SERVING

    @property
    def last_result(self) -> DrainResult | None:
        """What the last drain did, once it has ended."""
        run = self._core.run
        return None if run is None else run.result

    @property
    def failure(self) -> Failure | None:
        """Why the server is FAILED: set by ``mark_failed``, kept until a new lifecycle begins."""
        return self._core.failure

    def counters(self) -> dict[str, dict[str, int]]:
        """Everything counted since the process started: requests by outcome, refusals, drains,
        truncated work and failures, by reason."""
        return self._core.tally.as_dict()

    def status(self) -> DrainStatus:
        """A frozen snapshot: what ``/status`` and ``graceful status`` show."""
        c = self._core
        run = c.run
        state = c.state
        shown = run is not None and (state is DRAINING or state is FAILED or run.result is not None)
        times = run.times(time.monotonic()) if run is not None and shown else {}
        tally = c.tally
        return DrainStatus(
            state,
            c.in_flight,
            os.getpid(),
            c.since,
            counters=tally.as_dict(),
            budget=self.config.in_force(),
            durations=tally.histograms.as_dict(),
            pace=tally.pace.as_dict(),
            propagation=tuple(tally.propagation_seconds),
            failure=c.failure,
            **times,
        )

    # -- transitions -------------------------------------------------------------------

    def mark_serving(self, reason: str = "ready") -> None:
        """STARTING -> SERVING: call once weights are loaded (with ``ready_on_startup=False``)."""
        if self.state is State.STARTING:
            self._core.transition(SERVING, reason)
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
        # Judge first: bad input must leave the state untouched.
        return self._core.begin(reason, Overrides(self.config, propagation_wait, propagation_quiet, timeout))

    def resume(self) -> bool:
        """DRAINING -> SERVING (maintenance undrain); returns False in any other state, FAILED included."""
        return self._core.resume()

    def mark_stopped(self, reason: str = "shutdown") -> None:
        """Enter STOPPED (lifespan shutdown): the end of this lifecycle."""
        self._core.stop(reason)

    def mark_failed(self, reason: str, detail: str = "") -> bool:
        """Enter FAILED: the engine behind this server has died (``reason``, e.g. ``engine_dead``, and what
        was seen). Returns True if this call entered it.

        From STARTING, SERVING or DRAINING. Readiness fails and every new request is refused as
        not started, at once: no propagation wait, since the app could not serve it. Work in flight
        goes on and is counted to its end; a drain under way keeps its clock and deadline. Nothing
        leads back to SERVING: ``resume()`` returns False, and only a new lifecycle (a lifespan
        startup after STOPPED) clears the failure.
        """
        return self._core.fail(reason, detail)

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every state change and when a drain has its result."""
        self._core.add_listener(callback)

    def track(self, name: str = "job") -> AbstractAsyncContextManager[None]:
        """Count non-HTTP work (a queue consumer's job) as in flight: ``async with drain.track():``.

        Raises :class:`NotAccepting` unless SERVING. At the drain deadline the block is
        cancelled and counted as truncated.
        """
        return track(self._core, self._core.ledger, name)

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
        return await self._core.join()


def core(drain: Drain) -> Core:
    """The internal face of ``drain``: what graceful's middleware, admin server, metrics and launcher use."""
    return drain._core
