"""End-to-end drains through a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from graceful import GracefulMiddleware, State
from tests.utils import run_uvicorn

pytestmark = pytest.mark.anyio

FRAMES = 200


def build(registry: CollectorRegistry, **options: object) -> tuple[GracefulMiddleware, list[str], anyio.Event]:
    app_saw: list[str] = []
    first_frame_sent = anyio.Event()

    async def stream(request: Request) -> StreamingResponse:
        app_saw.append("stream")

        async def tokens() -> object:
            for i in range(FRAMES):
                yield f"data: {i}\n\n"
                first_frame_sent.set()
                await anyio.sleep(0.002)
            yield "data: [DONE]\n\n"

        return StreamingResponse(tokens(), media_type="text/event-stream")

    async def short(request: Request) -> JSONResponse:
        app_saw.append("short")
        return JSONResponse({"ok": True})

    inner = Starlette(routes=[Route("/stream", stream, methods=["POST"]), Route("/short", short, methods=["POST"])])
    mw = GracefulMiddleware(inner, registry=registry, admin=False, grace_period=30, reserve=5, **options)
    return mw, app_saw, first_frame_sent


async def test_stream_started_before_drain_arrives_whole_and_new_work_is_refused(registry: CollectorRegistry) -> None:
    """
    1. a 200-frame SSE stream starts
    2. the drain begins while it is mid-stream
    3. /ready answers 503 at once, a new request gets 503 before the app sees it
    4. the stream arrives whole, with [DONE], and the drain returns just after it
    """
    mw, app_saw, first_frame_sent = build(registry)
    async with run_uvicorn(mw) as server:
        base = f"http://127.0.0.1:{server.port}"
        assert mw.drain.state is State.SERVING
        frames: list[str] = []
        result_box: list[object] = []
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:

            async def consume() -> None:
                async with client.stream("POST", "/stream") as response:
                    assert response.status_code == 200
                    async for line in response.aiter_lines():
                        if line:
                            frames.append(line)

            async with anyio.create_task_group() as tg:
                tg.start_soon(consume)
                await first_frame_sent.wait()
                drain_task_done = anyio.Event()

                async def run_drain() -> None:
                    result_box.append(await mw.drain.drain(timeout=15))
                    drain_task_done.set()

                tg.start_soon(run_drain)
                await anyio.wait_all_tasks_blocked()
                async with httpx.AsyncClient(base_url=base, timeout=5) as other:
                    ready = await other.get("/ready")
                    refused = await other.post("/short")
                assert ready.status_code == 503
                assert refused.status_code == 503
                assert refused.headers["x-graceful-not-started"] == "1"
                assert refused.headers["connection"] == "close"
                assert not drain_task_done.is_set()
    assert frames[-1] == "data: [DONE]"
    assert frames[:-1] == [f"data: {i}" for i in range(FRAMES)]
    assert app_saw == ["stream"]
    [result] = result_box
    assert getattr(result, "result") == "drained"
    assert mw.drain.counters()["requests"]["completed"] == 1
    assert mw.drain.counters()["rejected"] == {"server_draining": 1}


async def test_keep_alive_connection_gets_connection_close_after_the_drain(registry: CollectorRegistry) -> None:
    mw, _, _ = build(registry, admit_during_propagation=True)
    async with run_uvicorn(mw) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=5) as client:
            before = await client.post("/short")
            assert "close" not in before.headers.get("connection", "")
            mw.drain.begin_drain("test", propagation_wait=20)
            during = await client.post("/short")
    assert during.status_code == 200
    assert during.headers["connection"] == "close"
