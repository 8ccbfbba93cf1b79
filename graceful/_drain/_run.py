"""One drain run: its clock, propagation phase, deadline, leader and result.

``Drain.begin_drain`` starts a run (``Core.begin``) and ``Drain.resume`` / ``Drain.mark_stopped`` end
it. The first caller of ``join`` leads the run (shielded, so that the deadline holds
even if that caller goes away); later callers wait for its result. The leader sleeps
until the next instant that can change the outcome and is woken by the last release,
by ``end`` and by the deadline: no polling.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Iterable
from typing import Protocol

import anyio

from ._admission import WOULD_NOT_FINISH
from ._ledger import HANDED_OFF, Tracked
from ._options import DrainConfig, Hook
from ._status import DrainOutcome, DrainResult, Tally

__all__ = ["DrainRun"]

logger = logging.getLogger("graceful")


class Machine(Protocol):
    """The drain machine as a run sees it: what the run reads and reports to (``_core.Core`` is the one)."""

    config: DrainConfig
    tally: Tally

    @property
    def handing_off(self) -> bool: ...

    def start_handoff(self) -> None: ...

    @property
    def in_flight(self) -> int: ...

    def items(self) -> Iterable[Tracked]: ...

    def leftover(self) -> tuple[str, ...]: ...

    def notify(self) -> None: ...


class DrainRun:
    """One drain, from ``begin_drain`` to its result."""

    def __init__(self, machine: Machine, reason: str, *, wait: float, quiet: float | None, limit: float) -> None:
        now = time.monotonic()
        self.machine = machine
        self.reason = reason
        self.started = now
        self.started_wall = time.time()
        self.prop_end = now + wait
        # A configured quiet period longer than this drain's wait changes nothing: the wait bounds it.
        self.quiet = quiet if quiet is not None and quiet < wait else None
        self.last_arrival = -math.inf  # monotonic; before `started` means "none yet"
        self.announced: float | None = None  # monotonic: the first response that announced the drain
        self.prop_over = False
        self.prop_ended_by: str | None = None  # "quiet" or "propagation_wait", once it is over
        self.deadline = now + limit
        self.follow_up = False
        self.ended: DrainOutcome | None = None  # set by end(): resumed or stopped
        self.leader = False
        self.done: anyio.Event | None = None
        self.result: DrainResult | None = None
        self.waker: anyio.Event | None = None
        self.arrived: anyio.Event | None = None  # see next_arrival
        self.handed_before = machine.tally.outcomes[HANDED_OFF]

    def follow(self) -> DrainRun:
        """A run for work admitted after this one drained, within the same deadline.

        A pinned connection's one more request (see ``Core.admit_pinned``) can arrive after
        the drain has ended: waiting for it too keeps the exit that follows (SIGTERM)
        bounded and cuts nothing.
        """
        run = copy.copy(self)
        run.follow_up, run.leader, run.done, run.result, run.waker = True, False, None, None, None
        run.arrived = None
        return run

    # -- read by the drain -----------------------------------------------------------

    def handed_off(self) -> int:
        return self.machine.tally.outcomes[HANDED_OFF] - self.handed_before

    def wall(self, mono: float) -> float:
        return mono + self.started_wall - self.started

    def record_arrival(self, now: float) -> bool:
        """A new request arrived ``now``: record it if it is in the propagation phase (for the quiet
        rule), settling the phase if it is over; returns whether it is in it."""
        if now < self.settle_propagation(now):
            self.last_arrival = now
            arrived, self.arrived = self.arrived, None
            if arrived is not None:
                arrived.set()
            return True
        return False

    def next_arrival(self) -> anyio.Event:
        """An event the next new request of the propagation phase sets: the admin server sends its
        progress line then, so that the hook's lines about the last new request are not a second late."""
        if self.arrived is None:
            self.arrived = anyio.Event()
        return self.arrived

    def announce(self, now: float) -> None:
        """A response announced the drain to the balancers (``announce_drain``): the first one is kept."""
        if self.announced is None:
            self.announced = now

    def settle_propagation(self, now: float) -> float:
        """When the propagation phase ends, as known at ``now``; fixed once it has ended. The first
        call that finds it over settles it: one ``graceful_propagation_seconds`` sample and a log line.

        Without ``propagation_quiet`` that is drain start + ``propagation_wait``. With it,
        the phase also ends once no new request has arrived for ``quiet`` seconds, and
        never before ``quiet`` seconds from drain start. Arrivals only move this later,
        so the leader sleeps until it and re-arms when it has moved: no polling.
        """
        wait_end = self.prop_end
        end = self.propagation_end(now)
        if not self.prop_over and now >= end and self.ended is None:
            self.prop_over = True
            self.prop_end = end
            self.prop_ended_by = "quiet" if end < wait_end else "propagation_wait"
            last = max(0.0, self.last_arrival - self.started)
            self.machine.tally.propagation_seconds.append(last)
            logger.info(
                "propagation phase over %.3fs after drain start (%s); %s%s",
                end - self.started,
                f"no new request for {self.quiet:g}s" if end < wait_end else "propagation_wait",
                f"last new request {last:.3f}s after drain start"
                if self.last_arrival >= self.started
                else "no new request",
                "" if self.announced is None else f"; drain announced {self.announced - self.started:.3f}s after it",
            )
        return end

    def propagation_end(self, now: float) -> float:
        """When the propagation phase ends, as known at ``now`` (``settle_propagation`` without its record)."""
        wait_end = self.prop_end
        if self.prop_over or self.quiet is None and now < wait_end:
            return wait_end
        return wait_end if self.quiet is None else min(wait_end, max(self.started, self.last_arrival) + self.quiet)

    def times(self, now: float) -> dict[str, float | None]:
        """The wall-clock times of this run, for ``DrainStatus``."""
        return {
            "drain_started": self.started_wall,
            "deadline": self.wall(self.deadline),
            "propagation_until": self.wall(self.propagation_end(now)),
            "last_request": self.wall(self.last_arrival) if self.last_arrival >= self.started else None,
        }

    def snapshot(self, outcome: DrainOutcome, in_flight: int) -> DrainResult:
        return DrainResult(
            result=outcome,
            in_flight=in_flight,
            duration=0.0,
            reason=self.reason,
            started_at=self.started_wall,
            deadline=self.started_wall,
        )

    # -- driven by the drain ----------------------------------------------------------

    def wake(self) -> None:
        if self.waker is not None:
            self.waker.set()

    def end(self, outcome: DrainOutcome) -> None:
        """The drain left DRAINING (``resumed`` or ``stopped``): the leader returns."""
        if self.ended is None:
            self.ended = outcome
        self.wake()

    async def join(self) -> DrainResult:
        """Lead the run if nobody does yet, else wait for the leader; return the result."""
        if self.done is None:
            self.done = anyio.Event()
        if not self.leader:
            self.leader = True
            # The leader's work must finish even if the caller that started it goes away:
            # other callers wait on it and the deadline must still be enforced.
            with anyio.CancelScope(shield=True):
                await self._run(self.done)
        else:
            await self.done.wait()
        assert self.result is not None
        return self.result

    async def _run(self, done: anyio.Event) -> None:
        machine = self.machine
        config = machine.config
        start = self.started
        deadline = self.deadline
        truncated = 0
        leftover: tuple[str, ...] = ()
        left = 0
        try:
            if not self.follow_up:
                await _call_hook(config.on_drain_start, "on_drain_start", deadline - time.monotonic())
            while True:
                if self.ended is not None:
                    outcome: DrainOutcome = self.ended
                    left = machine.in_flight
                    if outcome == "stopped" and left == 0:
                        outcome = "drained"
                    break
                now = time.monotonic()
                prop_end = self.settle_propagation(now)
                if now >= prop_end and config.handoff_streams and not machine.handing_off and now < deadline:
                    machine.start_handoff()
                    await self._hand_off_all()
                    continue
                if machine.in_flight == 0 and now >= prop_end:
                    outcome = "drained"  # also where the wait ends at the deadline (check_wait: never after it)
                    break
                if now >= deadline:
                    outcome = "timeout"
                    left = machine.in_flight
                    leftover = machine.leftover()
                    truncated = await self._expire_all()
                    break
                # Re-armed each turn: new arrivals move a quiet end later without waking us.
                wake_at = deadline if now >= prop_end else min(prop_end, deadline)
                self.waker = anyio.Event()
                with anyio.move_on_after(wake_at - now):
                    await self.waker.wait()
                self.waker = None
        finally:
            self.waker = None
        duration = time.monotonic() - start
        if outcome in ("drained", "timeout") and not self.follow_up:
            machine.tally.add(machine.tally.drains, outcome)
            machine.tally.drain_seconds.append(duration)
        self.result = DrainResult(
            result=outcome,
            in_flight=left,
            duration=duration,
            reason=self.reason,
            started_at=self.started_wall,
            deadline=self.wall(deadline),
            truncated=truncated,
            leftover=leftover,
            handed_off=self.handed_off(),
            propagation=self.prop_end - start if self.prop_over else None,
            last_request=self.last_arrival - start if self.last_arrival >= start else None,
            propagation_ended_by=self.prop_ended_by,
            announced=None if self.announced is None else self.announced - start,
        )
        self._log_summary(self.result)
        if outcome != "resumed" and not self.follow_up:
            # on_drained gets hook_timeout, but never more than half the reserve past the deadline.
            room = deadline + config.budget.reserve / 2 - time.monotonic()
            await _call_hook(config.on_drained, "on_drained", min(config.hook_timeout, room))
        done.set()
        machine.notify()

    async def _hand_off_all(self) -> None:
        """End every resumable stream in flight now (handoff_streams), each bounded by unwind_timeout."""
        items = list(self.machine.items())
        handed = 0

        async def one(item: Tracked) -> None:
            nonlocal handed
            if await item.hand_off():
                handed += 1

        with anyio.move_on_after(self.machine.config.unwind_timeout):
            async with anyio.create_task_group() as tg:
                for item in items:
                    tg.start_soon(one, item)
        logger.info(
            "handed off %d resumable stream(s) of %d in flight for their clients to continue elsewhere",
            handed,
            len(items),
        )

    async def _expire_all(self) -> int:
        machine = self.machine
        items = list(machine.items())
        logger.warning("drain deadline passed: ending %d request(s) still in flight", len(items))
        self.waker = anyio.Event()
        with anyio.move_on_after(machine.config.unwind_timeout):
            async with anyio.create_task_group() as tg:
                for item in items:
                    tg.start_soon(item.expire)
            while machine.in_flight:
                await self.waker.wait()
                self.waker = anyio.Event()
        return len(items)

    def _log_summary(self, result: DrainResult) -> None:
        counters = self.machine.tally.as_dict()
        requests = counters["requests"]
        logger.info(
            "drain %s: reason=%s duration=%.3fs in_flight_left=%d truncated=%d handed_off=%d completed=%d "
            "client_disconnected=%d errors=%d cancelled=%d rejected=%d would_not_finish=%d",
            result.result,
            result.reason,
            result.duration,
            result.in_flight,
            result.truncated,
            result.handed_off,
            *(requests[name] for name in ("completed", "client_disconnected", "error", "cancelled")),
            sum(counters["rejected"].values()),
            counters["rejected"].get(WOULD_NOT_FINISH, 0),  # admission="fits" (``_admission``)
        )


async def _call_hook(hook: Hook | None, name: str, limit: float) -> None:
    if hook is None:
        return
    with anyio.move_on_after(max(limit, 0.0)) as scope:
        try:
            await hook()
        except Exception:
            logger.exception("%s hook failed", name)
    if scope.cancelled_caught:
        logger.warning("%s hook overran its %.1fs budget and was cut off", name, max(limit, 0.0))
