"""Small Starlette apps the end-to-end benchmarks serve: the same routes bare and wrapped."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from benchmarks._drive import PassThrough, ReceiveToo, SendOnly
from graceful import GracefulMiddleware
from graceful._asgi._types import ASGIApp, Receive, Scope, Send

__all__ = ["FRAMES", "bare", "floor", "holder", "metrics_page", "wrapped"]

FRAMES = 20
_BODY = b'{"id":"cmpl-1","object":"chat.completion","choices":[{"message":{"content":"ok"}}]}'
_FRAME = b'data: {"choices":[{"delta":{"content":"tok"}}]}\n\n'


async def hello(request: Request) -> Response:
    return Response(_BODY, media_type="application/json")


async def stream(request: Request) -> StreamingResponse:
    async def frames() -> AsyncIterator[bytes]:
        for _ in range(FRAMES):
            yield _FRAME
        yield b"data: [DONE]\n\n"

    return StreamingResponse(frames(), media_type="text/event-stream")


def _app() -> Starlette:
    return Starlette(routes=[Route("/v1/hello", hello), Route("/v1/stream", stream)])


bare = _app()
# Metrics on (a private registry), no admin socket: the hot path is what is measured.
wrapped = GracefulMiddleware(_app(), registry=CollectorRegistry(), admin=False)
# The pass-through floor of benchmarks.inprocess (wrap send, forward): what any wrapper costs.
floor = PassThrough(_app())


def __getattr__(name: str) -> ASGIApp:
    """The ablations of benchmarks.e2e_profile (``send_only``, ``receive_too``), made only when a server asks."""
    if name in ("send_only", "receive_too"):
        return (SendOnly if name == "send_only" else ReceiveToo)(_app())
    raise AttributeError(name)


async def holder(scope: Scope, receive: Receive, send: Send) -> None:
    """Raw ASGI: ``POST /v1/hold`` streams one frame, then its final frame once the request body has arrived.

    The client decides when a stream ends by sending its body, so a benchmark knows the exact
    instant of the last frame. Any other path answers a short JSON body.
    """
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] != "/v1/hold":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": _BODY})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": _FRAME, "more_body": True})
    while True:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body"):
            break
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


_PAGE: list[bytes] = []


async def metrics_page(scope: Scope, receive: Receive, send: Send) -> None:
    """Serves the file named by ``$GRACEFUL_BENCH_PAGE`` as a Prometheus page (engine benchmark)."""
    if scope["type"] != "http":
        return
    if not _PAGE:
        with open(os.environ["GRACEFUL_BENCH_PAGE"], "rb") as f:
            _PAGE.append(f.read())
    headers = [(b"content-type", b"text/plain; version=0.0.4"), (b"content-length", b"%d" % len(_PAGE[0]))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": _PAGE[0]})
