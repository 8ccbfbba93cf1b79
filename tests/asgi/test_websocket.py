"""WebSockets through real uvicorn: counted until closed, refused while draining, 1012 at the deadline."""

from __future__ import annotations

import anyio
import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from graceful import GracefulMiddleware
from tests.utils import run_uvicorn

pytestmark = pytest.mark.anyio


async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        while True:
            await websocket.send_text((await websocket.receive_text()).upper())
    except WebSocketDisconnect:
        pass


def build(registry: CollectorRegistry) -> GracefulMiddleware:
    inner = Starlette(routes=[WebSocketRoute("/ws", echo)])
    return GracefulMiddleware(inner, registry=registry, admin=False, grace_period=10, reserve=2)


@pytest.mark.parametrize("ws", ["websockets-sansio", "wsproto"])
async def test_websocket_counted_until_closed(registry: CollectorRegistry, ws: str) -> None:
    mw = build(registry)
    async with run_uvicorn(mw, ws=ws) as server:
        url = f"ws://127.0.0.1:{server.port}/ws"
        async with connect(url) as socket:
            await socket.send("hi")
            assert await socket.recv() == "HI"
            assert mw.drain.in_flight == 1
            mw.drain.begin_drain("test")
            # An accepted socket keeps working while draining.
            await socket.send("still")
            assert await socket.recv() == "STILL"
        with anyio.fail_after(5):
            while mw.drain.in_flight:  # the server notices the close on its own schedule
                await anyio.sleep(0.01)
    # The client closed the socket: the app saw websocket.disconnect.
    requests = mw.drain.counters()["requests"]
    assert (requests["client_disconnected"], requests["completed"]) == (1, 0)


@pytest.mark.parametrize("ws", ["websockets-sansio", "wsproto"])
async def test_handshake_refused_while_draining(registry: CollectorRegistry, ws: str) -> None:
    mw = build(registry)
    async with run_uvicorn(mw, ws=ws) as server:
        mw.drain.begin_drain("test")
        with pytest.raises(InvalidStatus) as info:
            async with connect(f"ws://127.0.0.1:{server.port}/ws"):
                pass  # pragma: no cover
    # uvicorn offers the websocket.http.response extension, so the denial is a real 503
    # (servers without it turn the refusal into the spec's 403).
    assert info.value.response.status_code == 503
    assert mw.drain.counters()["rejected"] == {"server_draining": 1}
    assert mw.drain.in_flight == 0


async def test_open_sockets_are_closed_with_1012_at_the_deadline(registry: CollectorRegistry) -> None:
    mw = build(registry)
    async with run_uvicorn(mw, ws="websockets-sansio") as server:
        async with connect(f"ws://127.0.0.1:{server.port}/ws") as socket:
            await socket.send("hi")
            assert await socket.recv() == "HI"
            result = await mw.drain.drain(timeout=0.2)
            with pytest.raises(ConnectionClosed) as info:
                await socket.recv()
    assert info.value.rcvd is not None and info.value.rcvd.code == 1012
    assert result.result == "timeout" and result.truncated == 1
    assert mw.drain.counters()["truncated"] == {"deadline": 1}
    assert mw.drain.in_flight == 0
