"""A tiny Starlette streaming app for the launcher and admin tests (loaded by import string)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from graceful import GracefulMiddleware


async def stream(request: Request) -> Response:
    frames = int(request.query_params.get("frames", "10"))
    interval = float(request.query_params.get("interval", "0.05"))

    async def body() -> AsyncIterator[bytes]:
        for index in range(frames):
            yield f"frame {index}\n".encode()
            await anyio.sleep(interval)
        yield b"done\n"

    return StreamingResponse(body(), media_type="text/plain")


async def hello(request: Request) -> Response:
    return PlainTextResponse("hello")


app = Starlette(routes=[Route("/stream", stream), Route("/hello", hello)])

# Already wrapped, for the "do not wrap twice" path of `graceful run`.
wrapped = GracefulMiddleware(app, grace_period=6, reserve=1, propagation_wait=0)

not_an_app = 42
