"""The app every ASGI server in the compatibility matrix runs (as a subprocess).

Configured by env: GRACEFUL_SOCKET_DIR (admin socket dir), COMPAT_GRACE (grace period,
seconds), COMPAT_FRAME_DELAY, COMPAT_ADMIT (``default``: graceful's default admission
during the propagation wait; otherwise refuse from the drain's start), COMPAT_PROPAGATION_WAIT
(seconds, default 0). Streams keep
going until the server is draining and then send COMPAT_TAIL more frames, so a test
knows they are in flight during the drain no matter how long the drain command takes
to start.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from graceful import Drain, GracefulMiddleware, State

DELAY = float(os.environ.get("COMPAT_FRAME_DELAY", "0.02"))
TAIL = int(os.environ.get("COMPAT_TAIL", "100"))  # 2 s of stream after the drain begins
MAX_FRAMES = 1500  # a bound: 30 s at the default delay
# Refuse mode unless asked: most tests check the not-started 503 under every server from the drain's start.
_MODE = {} if os.environ.get("COMPAT_ADMIT") == "default" else {"admit_during_propagation": False}
DRAIN = Drain(
    grace_period=float(os.environ.get("COMPAT_GRACE", "20")),
    reserve=2,
    propagation_wait=float(os.environ.get("COMPAT_PROPAGATION_WAIT", "0")),
    **_MODE,
)


async def tokens() -> AsyncIterator[str]:
    i = 0
    while DRAIN.state is State.SERVING and i < MAX_FRAMES:
        yield f"data: {i}\n\n"
        i += 1
        await anyio.sleep(DELAY)
    for _ in range(TAIL):
        yield f"data: {i}\n\n"
        i += 1
        await anyio.sleep(DELAY)
    yield "data: [DONE]\n\n"


async def stream(request: Request) -> StreamingResponse:
    return StreamingResponse(tokens(), media_type="text/event-stream")


async def short(request: Request) -> JSONResponse:
    return JSONResponse({"pid": os.getpid()})


async def file(request: Request) -> FileResponse:
    # Starlette sends a file by path (http.response.pathsend) where the server offers that extension.
    return FileResponse(__file__, media_type="text/x-python")


async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        while True:
            await websocket.send_text((await websocket.receive_text()).upper())
    except WebSocketDisconnect:
        pass


routes = [
    Route("/stream", stream, methods=["POST"]),
    Route("/short", short, methods=["POST", "GET"]),
    Route("/file", file),
    WebSocketRoute("/ws", echo),
]
app = GracefulMiddleware(Starlette(routes=routes), DRAIN, metrics_path="/metrics")
