"""The drain state machine: one explicit, process-wide object (like uvicorn's ``ServerState``).

``Drain`` knows nothing of ASGI or HTTP. The middleware, the admin listener and
queue consumers all use it as it is.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Literal, Protocol

import anyio

from ._budget import Budget, ConfigError, check_quiet, parse_duration

__all__ = ["Drain", "DrainResult", "DrainStatus", "NotAccepting", "State"]

logger = logging.getLogger("graceful")

Hook = Callable[[], Awaitable[None]]
DrainOutcome = Literal["drained", "timeout", "resumed", "stopped"]


class State(str, enum.Enum):
    STARTING = "STARTING"
    SERVING = "SERVING"
    DRAINING = "DRAINING"
    STOPPED = "STOPPED"


# Request outcomes, as indexes into Drain._outcomes so the hot path does no dict lookups.
COMPLETED, CLIENT_DISCONNECTED, ERROR, CANCELLED = range(4)
OUTCOMES = ("completed", "client_disconnected", "error", "cancelled")


class NotAccepting(RuntimeError):
    """Raised by :meth:`Drain.track` when the process no longer takes new work."""


class Expirable(Protocol):
    """Work in flight that the drain can end at its deadline (an HTTP call, a job)."""

    async def expire(self) -> None: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class DrainResult:
    """What one drain did: ``result`` is ``drained`` when in-flight work reached zero in time."""

    result: DrainOutcome
    in_flight: int
    duration: float
    reason: str
    started_at: float
    deadline: float
    truncated: int = 0
    leftover: tuple[str, ...] = ()
    # Seconds from drain start: when the propagation phase ended (None if it had not), and
    # when its last new request arrived (None if none did).
    propagation: float | None = None
    last_request: float | None = None

    @property
    def drained(self) -> bool:
        return self.result == "drained"

    def as_dict(self) -> dict[str, object]:
        return {
            "result": self.result,
            "drained": self.drained,
            "in_flight": self.in_flight,
            "duration": round(self.duration, 6),
            "reason": self.reason,
            "started_at": self.started_at,
            "deadline": self.deadline,
            "truncated": self.truncated,
            "leftover": list(self.leftover),
            "propagation": None if self.propagation is None else round(self.propagation, 6),
            "last_request": None if self.last_request is None else round(self.last_request, 6),
        }


@dataclass(frozen=True)
class DrainStatus:
    """A read-only snapshot for ``/status`` and ``graceful status``."""

    state: State
    in_flight: int
    pid: int
    since: float
    drain_started: float | None
    deadline: float | None
    propagation_until: float | None
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    # Wall-clock time of the last new request of this drain's propagation phase, if any.
    last_request: float | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "state": self.state.value,
            "in_flight": self.in_flight,
            "pid": self.pid,
            "since": self.since,
            "drain_started": self.drain_started,
            "deadline": self.deadline,
            "propagation_until": self.propagation_until,
            "last_request": self.last_request,
            "counters": self.counters,
        }


def _iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, timezone.utc).isoformat(timespec="milliseconds")


class Drain:
    """The STARTING -> SERVING -> DRAINING -> STOPPED machine and the in-flight count.

    One per process. ``begin_drain()`` flips to DRAINING in one synchronous step:
    readiness fails and ``accepting`` turns False, while admitted work goes on. New
    requests are still served until the propagation wait ends (by then the balancers
    have stopped sending), and refused after it; with ``admit_during_propagation=False``
    they are refused from the first instant. ``await drain()`` returns when the
    propagation wait has passed and nothing is in flight, or when the deadline passes.
    """

    def __init__(
        self,
        *,
        grace_period: float | str | None = None,
        reserve: float | str | None = None,
        drain_timeout: float | str | None = None,
        propagation_wait: float | str = 0.0,
        propagation_quiet: float | str | None = None,
        admit_during_propagation: bool = True,
        on_drain_start: Hook | None = None,
        on_drained: Hook | None = None,
        hook_timeout: float | str = 5.0,
        unwind_timeout: float | str = 2.0,
    ) -> None:
        self.budget = Budget.resolve(
            grace_period=grace_period,
            reserve=reserve,
            drain_timeout=drain_timeout,
            propagation_wait=propagation_wait,
            propagation_quiet=propagation_quiet,
        )
        if not isinstance(admit_during_propagation, bool):
            raise ConfigError(f"admit_during_propagation: expected True or False, got {admit_during_propagation!r}")
        for problem in self.budget.problems(admit=admit_during_propagation):
            logger.warning("budget: %s", problem)
        logger.debug("budget: %s", self.budget.describe(admit=admit_during_propagation))
        self.admit_during_propagation = admit_during_propagation
        self.on_drain_start = on_drain_start
        self.on_drained = on_drained
        self._hook_timeout = parse_duration(hook_timeout, name="hook_timeout")
        self._unwind_timeout = parse_duration(unwind_timeout, name="unwind_timeout")

        self._state = State.STARTING
        self._since = time.time()
        self._in_flight = 0
        # Everything admitted and not yet finished, for the deadline. A dict keeps order.
        self._live: dict[Expirable, None] = {}
        # Connections (peer addresses) that were open when the drain began: see middleware.
        self.pinned: set[object] = set()

        self._outcomes = [0, 0, 0, 0]
        self._rejected: dict[str, int] = {}
        self._drains: dict[str, int] = {}
        self._truncated: dict[str, int] = {}
        self.drain_durations: list[float] = []
        # Per drain: seconds from drain start to the last new request of the propagation phase.
        self.propagation_durations: list[float] = []

        # Per drain epoch; reset by resume().
        self._reason = ""
        self._drain_wall = 0.0
        self._drain_mono = 0.0
        self._prop_end = 0.0
        self._quiet: float | None = None
        self._last_arrival = -math.inf  # monotonic; before _drain_mono means "none yet"
        self._prop_over = False
        self._deadline = 0.0
        self._epoch = 0
        self._leader = False
        self._done: anyio.Event | None = None
        self._result: DrainResult | None = None
        self._waker: anyio.Event | None = None
        self._listeners: list[Callable[[], None]] = []

    # -- reading ---------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def accepting(self) -> bool:
        """True only while SERVING: queue consumers should take no new work otherwise."""
        return self._state is State.SERVING

    @property
    def since(self) -> float:
        """Wall-clock time at which the current state was entered."""
        return self._since

    @property
    def last_result(self) -> DrainResult | None:
        return self._result

    def admits(self, peer: object = None) -> bool:
        """Whether a new request may start now (the slow path; SERVING is checked inline).

        While DRAINING, every call is a new request (probes and exempt paths never get
        here): during the propagation phase its arrival time is recorded, admitted or
        refused alike, for the quiet rule and ``graceful_propagation_seconds``.
        """
        if self._state is State.SERVING:
            return True
        if self._state is not State.DRAINING:
            return False
        now = time.monotonic()
        if now < self._propagation_end(now):
            self._last_arrival = now
            return self.admit_during_propagation
        if self.admit_during_propagation:
            # The balancer did not route a request on a connection that was already open
            # when the drain began: serve it once, with Connection: close.
            if peer is not None and peer in self.pinned and now < self._deadline:
                self.pinned.discard(peer)
                return True
        return False

    def status(self) -> DrainStatus:
        draining = self._state is State.DRAINING or self._result is not None
        offset = self._drain_wall - self._drain_mono
        arrived = draining and self._last_arrival >= self._drain_mono
        return DrainStatus(
            state=self._state,
            in_flight=self._in_flight,
            pid=os.getpid(),
            since=self._since,
            drain_started=self._drain_wall if draining else None,
            deadline=self._deadline + offset if draining else None,
            propagation_until=self._propagation_end(time.monotonic()) + offset if draining else None,
            counters=self.counters(),
            last_request=self._last_arrival + offset if arrived else None,
        )

    def _propagation_end(self, now: float) -> float:
        """When the propagation phase ends, as known at ``now``; fixed once it has ended.

        Without ``propagation_quiet`` that is drain start + ``propagation_wait``. With it,
        the phase also ends once no new request has arrived for ``quiet`` seconds, and
        never before ``quiet`` seconds from drain start. Arrivals only move this later,
        so the drain runner sleeps until it and re-arms when it has moved: no polling.
        """
        wait_end = self._prop_end
        if self._prop_over or self._quiet is None and now < wait_end:
            return wait_end
        end = wait_end
        if self._quiet is not None:
            end = min(end, max(self._drain_mono, self._last_arrival) + self._quiet)
        if now >= end and self._state is State.DRAINING:
            self._prop_over = True
            self._prop_end = end
            last = max(0.0, self._last_arrival - self._drain_mono)
            self.propagation_durations.append(last)
            logger.info(
                "propagation phase over %.3fs after drain start (%s); last new request %.3fs after drain start",
                end - self._drain_mono,
                f"no new request for {self._quiet:g}s" if end < wait_end else "propagation_wait",
                last,
            )
        return end

    def counters(self) -> dict[str, dict[str, int]]:
        return {
            "requests": dict(zip(OUTCOMES, self._outcomes)),
            "rejected": dict(self._rejected),
            "drains": dict(self._drains),
            "truncated": dict(self._truncated),
        }

    # -- transitions -------------------------------------------------------------------

    def mark_serving(self) -> None:
        """STARTING -> SERVING: call once weights are loaded (with ``ready_on_startup=False``)."""
        if self._state is State.STARTING:
            self._transition(State.SERVING, "ready")
        elif self._state is not State.SERVING:
            logger.info("mark_serving() ignored: state is %s", self._state.value)

    def begin_drain(
        self,
        reason: str = "drain",
        *,
        propagation_wait: float | str | None = None,
        timeout: float | str | None = None,
        propagation_quiet: float | str | None = None,
    ) -> bool:
        """Enter DRAINING at once; returns True if this call started the drain.

        Idempotent: a call during a drain joins it and changes neither its clock nor
        its deadline. The first caller's ``propagation_wait``, ``propagation_quiet``
        and ``timeout`` apply. Raises :class:`ConfigError` for bad values, leaving the
        state untouched.
        """
        # Parse first: bad input must leave the state untouched.
        wait, quiet, limit = self.settings(
            propagation_wait=propagation_wait, propagation_quiet=propagation_quiet, timeout=timeout
        )
        if self._state is State.DRAINING or self._state is State.STOPPED:
            return False
        now = time.monotonic()
        self._epoch += 1
        self._reason = reason
        self._drain_mono = now
        self._drain_wall = time.time()
        self._prop_end = now + wait
        # A configured quiet period longer than this drain's wait changes nothing: the wait bounds it.
        self._quiet = quiet if quiet is not None and quiet < wait else None
        self._last_arrival = -math.inf
        self._prop_over = False
        self._deadline = now + limit
        self._leader = False
        self._done = None
        self._result = None
        self._transition(State.DRAINING, reason)
        if wait > limit:
            logger.warning(
                "propagation wait %.1fs is longer than the drain limit %.1fs; the deadline comes first", wait, limit
            )
        return True

    def settings(
        self,
        *,
        propagation_wait: float | str | None = None,
        propagation_quiet: float | str | None = None,
        timeout: float | str | None = None,
    ) -> tuple[float, float | None, float]:
        """The (wait, quiet, limit) a drain with these overrides would use; raises ConfigError."""
        wait = self.budget.propagation_wait
        if propagation_wait is not None:
            wait = parse_duration(propagation_wait, name="propagation_wait")
        quiet = self.budget.propagation_quiet
        if propagation_quiet is not None:
            quiet = parse_duration(propagation_quiet, name="propagation_quiet")
            check_quiet(quiet, wait, given=propagation_quiet)
        limit = self.budget.limit
        if timeout is not None:
            limit = min(limit, parse_duration(timeout, name="timeout"))
        return wait, quiet, limit

    def resume(self) -> bool:
        """DRAINING -> SERVING (maintenance undrain); returns False in any other state."""
        if self._state is not State.DRAINING:
            return False
        self.pinned.clear()
        self._transition(State.SERVING, "resume")
        self._wake()
        return True

    def mark_stopped(self, reason: str = "shutdown") -> None:
        """Enter the final STOPPED state (lifespan shutdown)."""
        if self._state is not State.STOPPED:
            self._transition(State.STOPPED, reason)
            self._wake()

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every state change (used by metrics and the admin listener)."""
        self._listeners.append(callback)

    def _transition(self, new: State, reason: str) -> None:
        old = self._state
        self._state = new
        now = time.time()
        elapsed = now - self._since
        self._since = now
        logger.info(
            "state %s -> %s at %s (reason=%s, in_flight=%d, elapsed=%.3fs)",
            old.value,
            new.value,
            _iso(now),
            reason,
            self._in_flight,
            elapsed,
        )
        for callback in self._listeners:
            callback()

    # -- in-flight accounting (hot path) ---------------------------------------------------

    def _release(self, outcome: int) -> None:
        self._in_flight -= 1
        self._outcomes[outcome] += 1
        if self._waker is not None and self._in_flight == 0:
            self._waker.set()

    def _reject(self, reason: str) -> None:
        self._rejected[reason] = self._rejected.get(reason, 0) + 1

    def count_truncated(self, reason: str) -> None:
        self._truncated[reason] = self._truncated.get(reason, 0) + 1

    @asynccontextmanager
    async def track(self, name: str = "job") -> AsyncIterator[None]:
        """Count non-HTTP work (a queue consumer's job) as in flight.

        Raises :class:`NotAccepting` unless SERVING. At the drain deadline the block is
        cancelled and counted as truncated.
        """
        if self._state is not State.SERVING:
            raise NotAccepting(f"not accepting {name!r}: state is {self._state.value}; take no new work")
        job = _Job(self, name)
        self._in_flight += 1
        self._live[job] = None
        outcome = ERROR
        try:
            with job.scope:
                yield
            outcome = CANCELLED if job.scope.cancelled_caught else COMPLETED
        except anyio.get_cancelled_exc_class():
            outcome = CANCELLED
            raise
        finally:
            del self._live[job]
            self._release(outcome)

    # -- draining ------------------------------------------------------------------------

    def _wake(self) -> None:
        if self._waker is not None:
            self._waker.set()

    async def drain(
        self,
        *,
        propagation_wait: float | str | None = None,
        timeout: float | str | None = None,
        reason: str = "drain",
        propagation_quiet: float | str | None = None,
    ) -> DrainResult:
        """Drain and wait: the first caller runs the drain, later callers join it.

        Returns once the propagation wait has passed and in-flight work is zero, or
        once the deadline has passed (work still running then is expired).
        """
        self.begin_drain(
            reason, propagation_wait=propagation_wait, timeout=timeout, propagation_quiet=propagation_quiet
        )
        if self._state is not State.DRAINING:
            if self._result is not None:
                return self._result
            return self._snapshot_result("stopped" if self._state is State.STOPPED else "resumed")
        follow_up = False
        if self._result is not None:
            if not (self._result.drained and self._in_flight and time.monotonic() < self._deadline):
                return self._result
            # Work admitted after the drain ended (a pinned connection's one more request,
            # see admits()): wait for it too, within the same deadline, so that the exit
            # that follows (SIGTERM) is bounded and cuts nothing.
            self._result, self._leader, self._done, follow_up = None, False, None, True
        if self._done is None:
            self._done = anyio.Event()
        done = self._done
        if not self._leader:
            self._leader = True
            # The leader's work must finish even if the caller that started it goes away:
            # other callers wait on it and the deadline must still be enforced.
            with anyio.CancelScope(shield=True):
                await self._run(done, follow_up=follow_up)
        else:
            await done.wait()
        assert self._result is not None
        return self._result

    async def _run(self, done: anyio.Event, *, follow_up: bool = False) -> None:
        epoch = self._epoch
        start = self._drain_mono
        deadline = self._deadline
        truncated = 0
        leftover: tuple[str, ...] = ()
        left = 0
        try:
            if not follow_up:
                await self._call_hook(self.on_drain_start, "on_drain_start", deadline - time.monotonic())
            while True:
                if self._state is not State.DRAINING or self._epoch != epoch:
                    outcome: DrainOutcome = "resumed" if self._state is State.SERVING else "stopped"
                    left = self._in_flight
                    if outcome == "stopped" and left == 0:
                        outcome = "drained"
                    break
                now = time.monotonic()
                prop_end = self._propagation_end(now)
                if self._in_flight == 0 and now >= prop_end:
                    outcome = "drained"
                    break
                if now >= deadline:
                    outcome = "timeout"
                    left = self._in_flight
                    leftover = tuple(item.describe() for item in self._live)
                    truncated = await self._expire_all()
                    break
                # Re-armed each turn: new arrivals move a quiet end later without waking us.
                wake_at = deadline if now >= prop_end else min(prop_end, deadline)
                self._waker = anyio.Event()
                with anyio.move_on_after(wake_at - now):
                    await self._waker.wait()
                self._waker = None
        finally:
            self._waker = None
        duration = time.monotonic() - start
        if outcome in ("drained", "timeout") and not follow_up:
            self._drains[outcome] = self._drains.get(outcome, 0) + 1
            self.drain_durations.append(duration)
        self._result = DrainResult(
            result=outcome,
            in_flight=left,
            duration=duration,
            reason=self._reason,
            started_at=self._drain_wall,
            deadline=self._drain_wall + (deadline - start),
            truncated=truncated,
            leftover=leftover,
            propagation=self._prop_end - start if self._prop_over else None,
            last_request=self._last_arrival - start if self._last_arrival >= start else None,
        )
        self._log_summary(self._result)
        if outcome != "resumed" and not follow_up:
            # on_drained gets hook_timeout, but never more than half the reserve past the deadline.
            room = deadline + self.budget.reserve / 2 - time.monotonic()
            await self._call_hook(self.on_drained, "on_drained", min(self._hook_timeout, room))
        done.set()
        for callback in self._listeners:
            callback()

    async def _expire_all(self) -> int:
        items = list(self._live)
        logger.warning(
            "drain deadline passed: ending %d request(s) still in flight",
            len(items),
        )
        self._waker = anyio.Event()
        with anyio.move_on_after(self._unwind_timeout):
            async with anyio.create_task_group() as tg:
                for item in items:
                    tg.start_soon(item.expire)
            while self._in_flight:
                await self._waker.wait()
                self._waker = anyio.Event()
        return len(items)

    async def _call_hook(self, hook: Hook | None, name: str, limit: float) -> None:
        if hook is None:
            return
        with anyio.move_on_after(max(limit, 0.0)) as scope:
            try:
                await hook()
            except Exception:
                logger.exception("%s hook failed", name)
        if scope.cancelled_caught:
            logger.warning("%s hook overran its %.1fs budget and was cut off", name, max(limit, 0.0))

    def _snapshot_result(self, outcome: DrainOutcome) -> DrainResult:
        return DrainResult(
            result=outcome,
            in_flight=self._in_flight,
            duration=0.0,
            reason=self._reason,
            started_at=self._drain_wall,
            deadline=self._drain_wall,
        )

    def _log_summary(self, result: DrainResult) -> None:
        logger.info(
            "drain %s: reason=%s duration=%.3fs in_flight_left=%d truncated=%d completed=%d "
            "client_disconnected=%d errors=%d cancelled=%d rejected=%d",
            result.result,
            result.reason,
            result.duration,
            result.in_flight,
            result.truncated,
            *self._outcomes,
            sum(self._rejected.values()),
        )


class _Job:
    """A tracked non-HTTP unit of work; the deadline cancels its scope."""

    __slots__ = ("drain", "name", "scope", "started")

    def __init__(self, drain: Drain, name: str) -> None:
        self.drain = drain
        self.name = name
        self.scope = anyio.CancelScope()
        self.started = time.monotonic()

    async def expire(self) -> None:
        self.drain.count_truncated("deadline")
        self.scope.cancel()

    def describe(self) -> str:
        return f"job {self.name} ({time.monotonic() - self.started:.1f}s)"
