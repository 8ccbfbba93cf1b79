"""The in-process drive every per-request benchmark shares: one scope, the raw apps, the variants, the loops.

The ASGI callables are driven directly (no network, no server): a minimal scope, a receive
that hands over an empty body and a send that drops the message. Nothing in the drive
suspends, so one task runs many requests back to back and the event loop adds nothing per
request. ``benchmarks.inprocess`` times it, ``benchmarks.instructions`` counts it under
callgrind, ``benchmarks.peers`` sets other middlewares beside it, and ``benchmarks.e2e_profile``
serves the same wrappers through uvicorn.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import Response

from benchmarks._common import table
from graceful import GracefulMiddleware
from graceful._asgi._types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "BARE",
    "BASEHTTP",
    "FLOOR",
    "GRACEFUL",
    "SCOPE",
    "VARIANTS",
    "InFlightCounter",
    "PassThrough",
    "ReceiveToo",
    "SendOnly",
    "make_app",
    "receive",
    "side_by_side",
    "sink",
    "timed",
]

# The headers a uvicorn scope typically carries for an OpenAI-style POST.
SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0", "spec_version": "2.4"},
    "http_version": "1.1",
    "server": ("127.0.0.1", 8000),
    "client": ("127.0.0.1", 50000),
    "scheme": "http",
    "method": "POST",
    "root_path": "",
    "path": "/v1/chat/completions",
    "raw_path": b"/v1/chat/completions",
    "query_string": b"",
    "headers": [
        (b"host", b"127.0.0.1:8000"),
        (b"user-agent", b"bench/1.0"),
        (b"accept", b"*/*"),
        (b"content-type", b"application/json"),
        (b"content-length", b"0"),
    ],
    "state": {},
}
BODY = b'{"id":"x","object":"chat.completion"}'
FRAME = b'data: {"choices":[{"delta":{"content":"tok"}}]}\n\n'


async def receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def sink(message: Message) -> None:
    pass


def make_app(frames: int) -> ASGIApp:
    """A short JSON response (frames=0) or an SSE stream of ``frames`` frames plus the closing empty body."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream" if frames else b"application/json")],
            }
        )
        for _ in range(frames):
            await send({"type": "http.response.body", "body": FRAME, "more_body": True})
        await send({"type": "http.response.body", "body": b"" if frames else BODY, "more_body": False})

    return app


class PassThrough:
    """The floor: the least a middleware that sees every frame must do (wrap send, forward)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def wrapped_send(message: Message) -> None:
            await send(message)

        await self.app(scope, receive, wrapped_send)


class SendOnly:
    """Ablation: ``send`` wrapped in a plain function that returns the server's awaitable, as
    ``Call.send`` does for a frame; ``receive`` passed through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        def wrapped_send(message: Message) -> Awaitable[None]:
            return send(message)

        await self.app(scope, receive, wrapped_send)


class ReceiveToo:
    """Ablation: ``SendOnly``, and ``receive`` wrapped in a coroutine, as ``Call.receive`` does."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        def wrapped_send(message: Message) -> Awaitable[None]:
            return send(message)

        async def wrapped_receive() -> Message:
            return await receive()

        await self.app(scope, wrapped_receive, wrapped_send)


class InFlightCounter(BaseHTTPMiddleware):
    """The FastAPI ``@app.middleware("http")`` idiom; it stops counting when headers go out, not at the end."""

    in_flight = 0

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        InFlightCounter.in_flight += 1
        try:
            return await call_next(request)
        finally:
            InFlightCounter.in_flight -= 1


def graceful(app: ASGIApp) -> ASGIApp:
    mw = GracefulMiddleware(app, registry=CollectorRegistry(), admin=False)
    mw.drain.mark_serving()
    return mw


VARIANTS: dict[str, Callable[[ASGIApp], ASGIApp]] = {
    "bare app": lambda app: app,
    "pass-through wrapper (floor)": PassThrough,
    "GracefulMiddleware (metrics on)": graceful,
    "BaseHTTPMiddleware counter": InFlightCounter,
}
BARE, FLOOR, GRACEFUL, BASEHTTP = VARIANTS


async def timed(app: ASGIApp, n: int, *, evict: bytes = b"", fresh_scope: bool = False) -> float:
    """Seconds per request over ``n`` back-to-back requests.

    ``evict``: each request is timed alone, after a copy of that buffer (not timed) has emptied
    the caches. ``fresh_scope``: each request gets its own shallow copy of the scope, as a server
    gives (a middleware that writes into the scope would otherwise see its own writes again).
    """
    clock = time.perf_counter
    if evict:
        total = 0.0
        for _ in range(n):
            bytes(evict)
            start = clock()
            await app(SCOPE, receive, sink)
            total += clock() - start
        return total / n
    scope = SCOPE
    start = clock()
    if fresh_scope:
        for _ in range(n):
            await app(dict(scope), receive, sink)
    else:
        for _ in range(n):
            await app(scope, receive, sink)
    return (clock() - start) / n


def side_by_side(
    result: Mapping[str, Mapping[str, float]],
    headers: Sequence[str],
    fmt: Callable[[float], str],
    fmt_frame: Callable[[float], str],
) -> str:
    """One row a variant: per request and per frame, each absolute, added over the bare app, and / the floor's added.

    ``headers`` names the two absolute columns, per request and per frame.
    """
    bare, floor = result[BARE], result[FLOOR]
    rows = []
    for name, r in result.items():
        row = [name]
        for key, show in (("request", fmt), ("frame", fmt_frame)):
            added = r[key] - bare[key]
            floor_added = floor[key] - bare[key]
            row.append(show(r[key]))
            row.append("-" if name == BARE else ("+" if added >= 0 else "") + show(added))
            shown = name not in (BARE, FLOOR) and floor_added > 0
            row.append(f"{added / floor_added:.2f}x" if shown else "-")
        rows.append(row)
    request, frame = headers
    return table(["variant", request, "added", "added / floor's", frame, "added", "added / floor's"], rows)
