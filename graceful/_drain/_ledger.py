"""Work in flight: the one base shared by HTTP calls, WebSocket sessions and tracked jobs.

Each item is admitted into its drain's ledger (``Drain.admit_item``, which records the
time), finishes exactly once (``Drain.release_item`` with an outcome), names itself
for the drain's leftover list and can be ended at the drain deadline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

import anyio

from ._status import OUTCOMES, State

__all__ = [
    "CANCELLED",
    "CLIENT_DISCONNECTED",
    "COMPLETED",
    "ERROR",
    "HANDED_OFF",
    "OUTCOMES",
    "Ledger",
    "NotAccepting",
    "Tracked",
]

# Request outcomes, as indexes into Tally.outcomes (named in OUTCOMES) so the hot path does no dict lookups.
COMPLETED, CLIENT_DISCONNECTED, ERROR, CANCELLED, HANDED_OFF = range(5)


class NotAccepting(RuntimeError):
    """Raised by :meth:`Drain.track` when the process no longer takes new work."""


class Ledger(Protocol):
    """What an item needs from its drain (``Drain`` is one)."""

    state: State

    def admit_item(self, item: Tracked, limit: int = ...) -> bool: ...

    def release_item(self, item: Tracked, outcome: int) -> None: ...

    def count_truncated(self, reason: str) -> None: ...


class Tracked:
    """One unit of work in flight, counted from admission until ``finish``."""

    __slots__ = ("ledger", "open")

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.open = True

    def finish(self, outcome: int) -> None:
        """Release this item with ``outcome``; later calls do nothing."""
        if self.open:
            self.open = False
            self.ledger.release_item(self, outcome)

    def label(self) -> str:
        """What it is, for the list of work the deadline cut (the drain adds how long it ran)."""
        raise NotImplementedError

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
async def track(ledger: Ledger, name: str) -> AsyncIterator[None]:
    """Count the block as in flight in ``ledger``: see ``Drain.track``."""
    if ledger.state is not State.SERVING:
        raise NotAccepting(f"not accepting {name!r}: state is {ledger.state.value}; take no new work")
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
