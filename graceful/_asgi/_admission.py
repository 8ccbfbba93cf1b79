"""Admission during a drain with ``admission="fits"``: a new request is judged by its body, which the app
then gets as the client sent it; and the pace of a few streams is sampled, off the hot path.

The middleware calls :func:`judge` only while DRAINING, for a request the drain would admit: a SERVING
request pays nothing. It reads the body, at most ``BODY_LIMIT`` bytes for at most ``BODY_TIMEOUT``
seconds, asks ``_drain._admission.expected_run`` how long the request should run, and compares that with
the time this replica has left for it. The messages it read are handed to the app first, unchanged, then
the server's own ``receive`` takes over.

:class:`Sampler` gives ``expected_run`` its pace: run by the lifespan's sweep every ``SWEEP`` seconds, it
sends one new request's frames at a time through a ``FrameClock`` (``_http``) for at most ``FRAMES``
frames (a new event stream first), and after a stream's sample nothing for ``PAUSE`` times as long as
it took. So a sampled frame costs
a clock read, and at most one frame in ``PAUSE + 1`` of a lone stream is sampled (docs/budget.md).
"""

from __future__ import annotations

import time
from collections import deque

import anyio

from .._drain._admission import FITS, WOULD_NOT_FINISH, Pace, expected_run
from .._drain._ledger import Ledger
from .._stream._rules import event_stream
from ._http import Call, FrameClock, resumable
from ._shared import Shared
from ._types import Message, Receive, Scope

__all__ = ["BODY_LIMIT", "BODY_TIMEOUT", "FRAMES", "PAUSE", "Sampler", "judge"]

# Read at most this much of a request's body to find its token limit, for at most this long. A body
# over the limit (a long prompt, images) is judged without its limit, by the durations of all kinds.
BODY_LIMIT = 1 << 20
BODY_TIMEOUT = 1.0
# A sampled stream's frames are timed for at most FRAMES frames; then nothing is sampled for PAUSE
# times the time the sample took (at least one sweep).
FRAMES = 32
PAUSE = 59.0

_monotonic = time.monotonic


async def judge(shared: Shared, scope: Scope, receive: Receive) -> tuple[Receive, str | None]:
    """A request the draining drain would admit: the ``receive`` to hand the app, and ``would_not_finish``
    when it is expected to run past the time this replica has left for it (None: admit it)."""
    core = shared.core
    run = core.run
    if core.config.admission != FITS or run is None:
        return receive, None
    messages, body = await _read_body(scope, receive)
    replayed = _replay(messages, receive) if messages else receive
    tally = core.tally
    expected = expected_run(body, tally.pace, tally.histograms.snapshot)
    if expected is None:  # nothing seen to judge it by: admitted, as with admission="all"
        return replayed, None
    now = _monotonic()
    end = run.deadline
    if core.config.handoff_streams and resumable(scope):
        # A resumable stream is handed off when the propagation phase ends: it must finish by then.
        end = min(end, run.propagation_end(now))
    return replayed, (WOULD_NOT_FINISH if now + expected > end else None)


async def _read_body(scope: Scope, receive: Receive) -> tuple[list[Message], bytes | None]:
    """The messages read, and the whole body (None when it was not read whole: too long, too slow, or
    the client left)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            if not value.isdigit() or int(value) > BODY_LIMIT:
                return [], None  # too long to read here: the app reads it
            break
    messages: list[Message] = []
    chunks: list[bytes] = []
    seen = 0
    with anyio.move_on_after(BODY_TIMEOUT):
        while seen <= BODY_LIMIT:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages, None  # the client is gone: the app sees it leave
            chunk = message.get("body", b"")
            chunks.append(chunk)
            seen += len(chunk)
            if not message.get("more_body", False):
                return messages, b"".join(chunks)
    return messages, None


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that returns ``messages`` first, in order, then the server's."""
    pending = deque(messages)

    async def replayed() -> Message:
        if pending:
            return pending.popleft()
        return await receive()

    return replayed


class Sampler:
    """Samples the pace of one new request at a time into ``pace`` (run by the lifespan's sweep)."""

    __slots__ = ("clock", "ledger", "pace", "resume_at", "swept")

    def __init__(self, ledger: Ledger, pace: Pace) -> None:
        self.ledger = ledger
        self.pace = pace
        self.clock: FrameClock | None = None
        self.swept = _monotonic()
        self.resume_at = 0.0

    def sweep(self) -> None:
        """Record the sample under way once it is over, or start one on a request admitted since the last sweep."""
        now = _monotonic()
        clock = self.clock
        if clock is not None and (not clock.call.open or clock.frames >= FRAMES):
            clock.call.untime(clock)
            first, per_frame = clock.pace()
            self.clock = None
            if per_frame is not None:  # a stream's pace; a plain answer (fewer than three frames) costs no pause
                self.pace.record(first, per_frame)
                self.resume_at = now + PAUSE * (now - clock.since)
        if self.clock is None and now >= self.resume_at:
            self.clock = self._start(now)
        self.swept = now

    def _start(self, now: float) -> FrameClock | None:
        """A clock on the newest request admitted since the last sweep whose response is an event stream,
        else on the newest one whose response has not started (it may be a stream)."""
        table = self.ledger.table
        waiting: tuple[Call, float] | None = None
        for item in reversed(table):  # the newest first, back to the last sweep
            admitted = table.get(item)
            if admitted is None or admitted < self.swept:
                break
            if not isinstance(item, Call):
                continue
            if not item.started():
                waiting = waiting or (item, admitted)
            elif event_stream(item.content_type()):
                waiting = (item, admitted)
                break
        if waiting is None:
            return None
        call, admitted = waiting
        clock = FrameClock(call, admitted, now)
        return clock if call.time(clock) else None
