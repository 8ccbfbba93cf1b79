"""Work in flight: the ledger that counts it, and the one base shared by HTTP calls, WebSocket
sessions and tracked jobs.

An item is admitted into a ledger (``Ledger.admit_item``, which records the time) and
finishes exactly once, with an outcome (``Tracked.finish_after``, which ``Tracked.finish``
runs at once): that is the only code that ends an item's count. It names itself for the
drain's leftover list and can be ended at the drain deadline. A ``Drain``'s ``Core`` holds its
``Ledger``; the ledger's private fields are this module's alone.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio

from ._observed import BOUNDS, PLAIN
from ._status import OUTCOMES, State, Tally

# typing's Protocol for the annotation below only.
if TYPE_CHECKING:
    from typing import Protocol

    class Stateful(Protocol):
        state: State


__all__ = [
    "CANCELLED",
    "CLIENT_DISCONNECTED",
    "COMPLETED",
    "ERROR",
    "HANDED_OFF",
    "NO_LIMIT",
    "OUTCOMES",
    "Ledger",
    "NotAccepting",
    "Tracked",
]

# Request outcomes, as indexes into Tally.outcomes (named in OUTCOMES) so the hot path does no dict lookups.
COMPLETED, CLIENT_DISCONNECTED, ERROR, CANCELLED, HANDED_OFF = range(5)
NO_LIMIT = 1 << 62


class NotAccepting(RuntimeError):
    """Raised by :meth:`Drain.track` when the process no longer takes new work."""


class Ledger:
    """Everything admitted and not yet finished, in order of admission, with its admission time.

    ``table`` maps each item to the ``clock()`` of its admission: an owner that admits inline on
    its hot path (graceful's middleware, once per request) writes ``table[item] = time.monotonic()``,
    which is ``admit_item(item)`` without its call. Items leave it only through
    ``Tracked.finish_after``; it is the same object for the ledger's whole life. ``outcomes`` counts
    finished items by outcome, and ``waker`` (the current drain run's ``wake``) is called when the
    ledger empties. ``count_durations`` counts the durations of finished items into the tally's
    histograms: ``_watched`` is what the last count saw in flight, ``_swept`` when, and
    ``_released`` how many items had finished by then. ``clock`` is ``time.monotonic`` (a test may
    give a clock it moves by hand).
    """

    def __init__(self, tally: Tally, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.tally = tally
        self.table: dict[Tracked, float] = {}
        self.outcomes = tally.outcomes
        self.waker: Callable[[], None] | None = None
        self.clock = clock
        self._watched: list[tuple[Tracked, float]] = []
        self._swept = clock()
        self._released = 0

    def admit_item(self, item: Tracked, limit: int = NO_LIMIT) -> bool:
        """Count ``item`` as in flight, unless ``limit`` items already are."""
        items = self.table
        if len(items) >= limit:
            return False
        items[item] = self.clock()
        return True

    def items(self) -> tuple[Tracked, ...]:
        """The work in flight, in order of admission."""
        return tuple(self.table)

    def leftover(self) -> tuple[str, ...]:
        """A line for each item in flight: what it is and for how long it has run."""
        now = self.clock()
        return tuple(f"{item.label()} ({now - admitted:.1f}s)" for item, admitted in self.table.items())

    def ages(self) -> list[tuple[float, bool]]:
        """For each item in flight: how long it has run, and whether it has streamed (off the hot path)."""
        now = self.clock()
        return [(now - admitted, item.last is not None) for item, admitted in self.table.items()]

    def count_durations(self) -> None:
        """Count the durations of the work finished since the last count (``_observed``; off the hot path).

        Run every ``SWEEP`` seconds by the middleware's lifespan, and by the admin server before it
        answers ``/status``. Work seen in flight by the last
        sweep and finished since counts from its admission to now: its duration, rounded up by
        less than the time between two sweeps. Work admitted and finished between two sweeps was
        shorter than that time; it counts as plain, at that time.
        """
        now = self.clock()
        durations = self.tally.histograms
        counts, sums = durations.counts, durations.sums
        released = sum(self.outcomes)
        seen = 0
        for item, admitted in self._watched:
            if not item.open:
                seen += 1
                elapsed = now - admitted
                kind = item.last is not None  # STREAM (1) or PLAIN (0)
                counts[kind][bisect_left(BOUNDS, elapsed)] += 1
                sums[kind] += elapsed
        short = released - self._released - seen
        if short > 0:
            between = now - self._swept
            counts[PLAIN][bisect_left(BOUNDS, between)] += short
            sums[PLAIN] += short * between
        self._watched = list(self.table.items())
        self._released = released
        self._swept = now

    def count_truncated(self, reason: str) -> None:
        self.tally.add(self.tally.truncated, reason)


class _Done:
    """An awaitable that is already done: ``finish`` drives ``finish_after`` with it, without a loop."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # a generator that ends at once: awaiting it never suspends


_DONE = _Done()


class Tracked:
    """One unit of work in flight, counted from admission until it finishes.

    ``last`` is the last body frame it streamed (an HTTP call sets it per frame); work with
    one counts as a stream in the durations (``_observed.KINDS``), other work as plain.
    """

    __slots__ = ("ledger", "open")
    last: bytes | None = None

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.open = True

    async def finish_after(self, sent: Awaitable[None], outcome: int) -> None:
        """Await ``sent`` (the server taking the last frame), then release this item with ``outcome``.

        The one code that ends an item's count (its duration is counted later, by ``count_durations``: a
        clock read here would cost a request more than the rest of its release). The middleware
        returns it as the awaitable of the last frame's ``send``, so the release costs the hot
        path no call of its own; ``finish`` runs it with nothing to wait for. Once released,
        later calls do nothing.
        """
        await sent
        if self.open:
            self.open = False
            ledger = self.ledger
            items = ledger.table
            del items[self]
            ledger.outcomes[outcome] += 1
            if not items and ledger.waker is not None:
                ledger.waker()

    def finish(self, outcome: int) -> None:
        """Release this item with ``outcome`` now (``finish_after`` with nothing to wait for)."""
        if self.open:
            try:
                self.finish_after(_DONE, outcome).send(None)
            except StopIteration:
                pass

    def label(self) -> str:
        """What it is, for the list of work the deadline cut (the drain adds how long it ran)."""
        raise NotImplementedError

    def peer(self) -> object:
        """The connection it came on, as a hashable key (pinned at a drain's start: ``Core.begin``); None where
        there is none."""
        return None

    async def expire(self) -> None:
        """End this work at the drain deadline, counted as truncated (once)."""
        if self.open:
            self.ledger.count_truncated("deadline")
            await self.cut()

    async def cut(self) -> None:
        """Stop the work: the subclass's way of ending it early."""
        raise NotImplementedError

    async def hand_off(self) -> bool:
        """End this work early for its client to continue elsewhere; False if it cannot be."""
        return False


class Job(Tracked):
    """A tracked non-HTTP unit of work (``Drain.track``); the deadline cancels its scope."""

    __slots__ = ("name", "scope")

    def __init__(self, ledger: Ledger, name: str) -> None:
        super().__init__(ledger)
        self.name = name
        self.scope = anyio.CancelScope()

    def label(self) -> str:
        return f"job {self.name}"

    async def cut(self) -> None:
        self.scope.cancel()


@asynccontextmanager
async def track(owner: Stateful, ledger: Ledger, name: str) -> AsyncIterator[None]:
    """Count the block as in flight in ``ledger`` while ``owner`` (a ``Drain``) serves: see ``Drain.track``."""
    if owner.state is not State.SERVING:
        raise NotAccepting(f"not accepting {name!r}: state is {owner.state.value}; take no new work")
    job = Job(ledger, name)
    ledger.admit_item(job)
    outcome = ERROR
    try:
        with job.scope:
            yield
        outcome = CANCELLED if job.scope.cancelled_caught else COMPLETED
    except anyio.get_cancelled_exc_class():
        outcome = CANCELLED
        raise
    finally:
        job.finish(outcome)
