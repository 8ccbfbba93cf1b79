"""A bounded per-process store for ``Idempotency-Key``: run once, replay afterwards.

A key that completed replays its stored answer (a stream replays its chunks); a key
that is still running gets 409. An execution that did not complete (the client left,
the deadline ended it) is forgotten, so a retry runs it again, and that second run
shows in ``executions``: the proof harness reads it to tell a real duplicate from a
replay.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = ["IdempotencyStore", "Stored"]

V = TypeVar("V")


@dataclass
class Stored:
    """A finished answer: status, media type and the body as it was sent, chunk by chunk."""

    status: int
    media_type: str
    chunks: list[bytes] = field(default_factory=list)


class IdempotencyStore:
    """Keys in use and finished answers, oldest evicted first beyond ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._running: set[str] = set()
        self._done: OrderedDict[str, Stored] = OrderedDict()
        self._executions: OrderedDict[str, int] = OrderedDict()

    def lookup(self, key: str) -> Stored | None:
        return self._done.get(key)

    def running(self, key: str) -> bool:
        return key in self._running

    def start(self, key: str) -> None:
        """Mark ``key`` as executing and count one execution."""
        self._running.add(key)
        self._executions[key] = self._executions.pop(key, 0) + 1
        _trim(self._executions, self.capacity)

    def finish(self, key: str, stored: Stored) -> None:
        self._running.discard(key)
        self._done[key] = stored
        _trim(self._done, self.capacity)

    def abandon(self, key: str) -> None:
        """The execution did not complete: allow a retry to run again."""
        self._running.discard(key)

    def executions(self) -> dict[str, int]:
        return dict(self._executions)


def _trim(store: OrderedDict[str, V], capacity: int) -> None:
    while len(store) > capacity:
        store.popitem(last=False)
