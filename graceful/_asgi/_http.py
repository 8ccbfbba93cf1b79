"""One admitted HTTP request: the hot path from admission to its last frame."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any

import anyio

from .._drain._ledger import CANCELLED, CLIENT_DISCONNECTED, COMPLETED, ERROR, HANDED_OFF, Ledger, Tracked
from .._drain._status import SERVING
from .._stream._ends import ENGINE_ERROR, ended_early, next_sequence_number
from .._stream._rules import RESUMABLE_HEADER, engine_dead_exception, event_stream, responses_path
from ._answers import json_response
from ._frames import default_final_frame, responses_final_event, resumable_final_frame, shutdown_error
from ._refusal import HTTP1, request_id
from ._shared import Shared
from ._types import Message, Receive, Scope, Send

__all__ = ["Call", "FrameClock", "peer_of", "resumable"]

logger = logging.getLogger("graceful")


def peer_of(scope: Scope) -> object:
    """The connection's peer address as a hashable key (pinned by ``Core.begin``), or None (off the hot path)."""
    client = scope.get("client")
    return None if client is None else tuple(client)


def resumable(scope: Scope) -> bool:
    """Whether the request carried ``x-graceful-resumable: 1`` (read off the hot path only)."""
    header = RESUMABLE_HEADER.encode()
    return any(name == header and value.strip() == b"1" for name, value in scope["headers"])


# Messages of ASGI extensions that end a response as the last http.response.body does: a file sent
# by path (pathsend, which Starlette's FileResponse uses where the server offers it) and the last
# part of a zero-copy send. (A trailers message comes after the last body, which ends the count.)
_LAST_OF_EXTENSIONS = frozenset({"http.response.pathsend", "http.response.zerocopysend"})


# The frames at a stream's end that may carry no token: the finish chunk, the usage chunk and [DONE].
TAIL = 3


async def _drop(message: Message) -> None:
    """Stands in for the server's send once the deadline has ended a response."""


class FrameClock:
    """Stands in for a sampled call's server send (``Call.time``): reads the time of each body frame, for
    the pace ``admission="fits"`` judges by (``_admission.Sampler``, which takes it off after a few)."""

    __slots__ = ("admitted", "call", "send", "since", "streamed", "times")

    def __init__(self, call: Call, admitted: float, since: float) -> None:
        self.call = call
        self.admitted = admitted  # the call's admission (monotonic)
        self.since = since  # when the sampling began
        self.streamed = call.last is not None  # a frame went before the sampling: no first-token time
        self.times: list[float] = []
        self.send: Send = _drop

    def __call__(self, message: Message) -> Awaitable[None]:
        if message.get("body"):
            self.times.append(time.monotonic())
        return self.send(message)

    @property
    def frames(self) -> int:
        return len(self.times)

    def pace(self) -> tuple[float | None, float | None]:
        """The time from admission to the first frame (None when one had gone before the sampling) and the
        time per frame: the frames' span over their gaps. A stream that ended while timed leaves out its
        last ``TAIL`` frames, which come in a burst and may carry no token (an OpenAI stream's finish and
        usage chunks, ``[DONE]``); a burst mid-stream (a loop that was late catching up) is counted, as the
        span takes it in. Neither for fewer than three frames: not a stream."""
        times = self.times if self.call.open else self.times[:-TAIL]
        if len(times) < 3:
            return None, None
        per_frame = (times[-1] - times[0]) / (len(times) - 1)
        return (None if self.streamed else times[0] - self.admitted), per_frame


class Call(Tracked):
    """One admitted HTTP request, counted from admission until its last frame is handed to the server.

    The count also ends if the client disconnects, the app raises or the task is
    cancelled, exactly once whichever comes first.

    The middleware makes it with ``Call()`` and fills its fields at admission, in its own
    frame: ``ledger`` (the drain's), ``open``, ``shared``, ``scope``, ``server_receive``,
    ``server_send``, ``task`` (the asyncio task the deadline cancels, or None) and ``last``
    (None). The rest are set when they happen: ``start`` (the response start message, as
    sent: the deadline and an engine abort read its content type from it), ``before`` (the
    frame before ``last``) and ``cancel_scope`` (loops other than asyncio); until then they
    are unset, and only the slow paths below read them, through ``getattr``. The drain's
    ledger keeps the time of admission.
    """

    __slots__ = ("shared", "scope", "server_receive", "server_send", "task", "last", "before", "start", "cancel_scope")
    ledger: Ledger
    shared: Shared
    scope: Scope
    server_receive: Receive
    server_send: Send
    task: asyncio.Task[Any] | None
    last: bytes | None
    before: bytes | None  # unset until the first streamed frame
    start: Message  # unset until the response starts
    cancel_scope: anyio.CancelScope  # unset on asyncio
    # Calling the class runs no Python __init__: the middleware sets the fields itself.
    __init__ = object.__init__

    # The middleware runs the app and admits the call itself (one coroutine frame less
    # per request); these are the slow paths around it.

    async def run_scoped(self) -> None:
        """Run the app inside a cancel scope: the deadline's handle on loops other than asyncio."""
        with anyio.CancelScope() as self.cancel_scope:
            await self.shared.app(self.scope, self.receive, self.send)

    async def failed(self, exc: BaseException) -> bool:
        """Account for an app that raised; True when the error is ours to swallow.

        A Responses stream the app leaves half-sent gets its final event first (then the error goes on
        to the server as it was): with no end of its own it would pass for a whole answer somewhere.
        """
        if self.open:
            death = engine_dead_exception(exc)
            if death is not None:  # the engine died under a response it could not end (no error event)
                self.shared.drain.mark_failed(ENGINE_DEAD, f"{self.label()}: {death}")
            # (not for a client gone: OSError from the server's send)
            if (
                isinstance(exc, Exception)
                and not isinstance(exc, OSError)
                and self.started()
                and self._responses_stream()
            ):
                await self._close_raised(ENGINE_ERROR if death is not None else APP_ERROR, exc)
                return False
            self.finish(_classify(exc))
            return False
        if self.server_send is _drop and isinstance(exc, asyncio.CancelledError) and self.task is not None:
            # We cancelled it at the deadline and already ended the response: do not
            # let the server log our own cancellation as an application error.
            if hasattr(self.task, "uncancel"):
                self.task.uncancel()
            return True
        return False

    async def receive(self) -> Message:
        message = await self.server_receive()
        if message["type"] == "http.disconnect":
            self.finish(CLIENT_DISCONNECTED)
        return message

    def send(self, message: Message) -> Awaitable[None]:
        # Not a coroutine: a streamed frame and the response start go straight to the
        # server's send, without a coroutine of ours per message.
        if message.get("more_body"):
            try:
                body = message["body"]  # a subscript and a constant: the cheapest check per frame
            except KeyError:  # a frame without a body (it may leave "body" out): nothing to watch
                return self.server_send(message)
            if body == b"data: [DONE]\n\n":  # _stream._ends.DONE
                return self._done(message)
            # The last two frames, for _done: an engine's abort is the finish chunk, followed by
            # a usage chunk when the client asked for one.
            self.before = self.last
            self.last = body
            return self.server_send(message)
        kind = message["type"]
        if kind == "http.response.body":  # the last body: the count ends once the server has it
            return self.finish_after(self.server_send(message), COMPLETED)
        if kind == "http.response.start":
            self.start = message
            shared = self.shared
            # The state from the drain's Core: a plain attribute (``Drain.state`` is a property, a call per read).
            if shared.request_id_header is None and shared.core.state is SERVING:
                return self.server_send(message)  # nothing to add: the app's message goes through as it is
            # A copy of the app's list (it may reuse one list for every response), set into its
            # message in place, as starlette's MutableHeaders does.
            headers = list(message.get("headers", ()))
            if shared.request_id_header is not None:
                headers.append((shared.request_id_header, request_id(shared, self.scope)))
            if shared.core.state is not SERVING:
                if self.scope.get("http_version", "1.1") in HTTP1:
                    # Keep-alive clients and balancers must stop reusing this connection.
                    headers.append((b"connection", b"close"))
                headers.extend(shared.announce())
                if shared.core.handing_off:
                    message["headers"] = headers
                    return self._start_then_hand_off(message)
            message["headers"] = headers
        elif kind in _LAST_OF_EXTENSIONS:
            return self.finish_after(self.server_send(message), COMPLETED)
        return self.server_send(message)

    async def _done(self, message: Message) -> None:
        """``data: [DONE]``, the end of an OpenAI-style stream: passed on, unless the engine ended it early.

        An event stream the engine aborted or failed in (``_stream._ends.ended_early``) ends here
        with the retryable final frame instead of ``[DONE]`` (resumable when the request is), so
        that no client takes it for a whole answer and a resuming client continues it elsewhere.
        The engine's error event has reached the client already, and the log names it.
        """
        last = self.last
        early = None if last is None or not self._event_stream() else ended_early(getattr(self, "before", None), last)
        if early is None:
            await self.server_send(message)
            return
        reason, detail, death = early
        if death is not None:  # before the stream ends: its client's next try must find this replica refusing
            self.shared.drain.mark_failed(ENGINE_DEAD, f"{self.label()}: {death}")
        self.ledger.count_truncated(reason)
        logger.warning("%s: %s; it ends with the retryable final frame", self.label(), detail)
        send, self.server_send = self.server_send, _drop
        await _close_with(send, self._closing_frame())
        if self.open:
            self.finish(ERROR)

    async def _start_then_hand_off(self, message: Message) -> None:
        """A response that starts once the handoff has begun: a resumable stream is handed off at once."""
        await self.server_send(message)
        await self.hand_off()

    def started(self) -> bool:
        """Whether the response has started (its start message went to the server)."""
        return getattr(self, "start", None) is not None

    def time(self, clock: FrameClock) -> bool:
        """Send this call's messages through ``clock`` from now on (the pace sampler, off the hot path);
        False once the call has ended."""
        if not self.open or self.server_send is _drop:
            return False
        clock.send, self.server_send = self.server_send, clock
        return True

    def untime(self, clock: FrameClock) -> None:
        """Send this call's messages straight to the server again, unless it has ended since ``time``."""
        if self.server_send is clock:
            self.server_send = clock.send

    def content_type(self) -> bytes:
        start = getattr(self, "start", None)
        for name, value in (start.get("headers") or ()) if start is not None else ():
            if name.lower() == b"content-type":
                return bytes(value)
        return b""

    def _event_stream(self) -> bool:
        """Whether the response is an event stream (read only when a stream ends)."""
        return event_stream(self.content_type())

    def label(self) -> str:
        return f"{self.scope.get('method', 'GET')} {self.scope['path']}"

    def peer(self) -> object:
        return peer_of(self.scope)

    def resumable(self) -> bool:
        """Whether the request carried ``x-graceful-resumable: 1`` (read only when a stream is ended)."""
        return resumable(self.scope)

    def _responses_stream(self) -> bool:
        """Whether this response is a Responses API event stream (read only when a stream is ended)."""
        return responses_path(self.scope["path"]) and self._event_stream()

    def _closing_frame(self) -> bytes | None:
        """The frame that ends this response early: the ``final_frame`` option's, or graceful's own, which
        is the Responses framing's error event on a Responses stream and says resumable for a marked request."""
        frame = self.shared.final_frame
        if frame is not default_final_frame:
            return frame(self.content_type())
        if self._responses_stream():
            sequence_number = next_sequence_number(getattr(self, "before", None), self.last)
            return responses_final_event(sequence_number, resumable=self.resumable())
        return (resumable_final_frame if self.resumable() else frame)(self.content_type())

    async def _close_raised(self, reason: str, exc: Exception) -> None:
        """End a stream the app raised in with the final event, counted as truncated for ``reason``."""
        send, self.server_send = self.server_send, _drop
        self.ledger.count_truncated(reason)
        logger.warning("%s: the app raised mid-stream (%r); it ends with the final event", self.label(), exc)
        try:
            await _close_with(send, self._closing_frame())
        except Exception:  # the client may be gone already
            pass
        self.finish(ERROR)

    async def hand_off(self) -> bool:
        """End a resumable SSE stream now with the final event, for its client to continue elsewhere."""
        if not self.open or not self.started() or not self.resumable():
            return False
        if not self._event_stream():
            return False
        await self._end(HANDED_OFF)
        return True

    async def cut(self) -> None:
        """End this request at the drain deadline: a final retryable frame if we can, then cancel."""
        await self._end(CANCELLED)

    async def _end(self, outcome: int) -> None:
        send = self.server_send
        self.server_send = _drop
        try:
            if not self.started():
                close = [(b"connection", b"close")] if self.scope.get("http_version", "1.1") in HTTP1 else []
                await json_response(send, 503, shutdown_error(), [*close, *self.shared.announce()])
            else:
                frame = self._closing_frame()
                if frame is not None:  # without one the response is left as it is, and the task cancelled
                    await _close_with(send, frame)
        except Exception:  # the client may be gone already; the cancel below still applies
            pass
        self.finish(outcome)
        cancel_scope = getattr(self, "cancel_scope", None)
        if self.task is not None:
            self.task.cancel()
        elif cancel_scope is not None:
            cancel_scope.cancel()


# The reason of graceful_truncated_streams for a Responses stream that the app raised in (vLLM's
# Responses generator lets errors out); those for a stream the engine ended are _stream._ends's.
APP_ERROR = "app_error"
# The reason of graceful_failures_total, and of FAILED in /status, for an engine that died.
ENGINE_DEAD = "engine_dead"


async def _close_with(send: Send, frame: bytes | None) -> None:
    """End a started response early: its final frame (if any), then the last, empty body."""
    if frame is not None:
        await send({"type": "http.response.body", "body": frame, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _classify(exc: BaseException) -> int:
    if isinstance(exc, OSError):
        return CLIENT_DISCONNECTED
    if isinstance(exc, anyio.get_cancelled_exc_class()) or isinstance(exc, asyncio.CancelledError):
        return CANCELLED
    return ERROR
