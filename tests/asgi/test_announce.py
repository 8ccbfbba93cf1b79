"""The drain's announcement: ``x-envoy-immediate-health-check-fail`` on every response from the drain's start.

Envoy's router filter takes a host out of an actively health-checked cluster when a response of
it carries the header (its presence is what counts). graceful sends it on the responses it starts
once the drain has begun: the admitted requests', the refusals' and the probes'. Before the drain,
and with ``announce_drain=False``, no response carries it.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from graceful import GracefulMiddleware
from graceful._drain._state import core

pytestmark = pytest.mark.anyio

HEADER = "x-envoy-immediate-health-check-fail"


async def echo(request: Request) -> JSONResponse:
    return JSONResponse({"body": (await request.body()).decode()})


async def stream(request: Request) -> StreamingResponse:
    async def frames() -> Any:
        for n in range(3):
            yield f"data: {n}\n\n"

    return StreamingResponse(frames(), media_type="text/event-stream")


def middleware(registry: CollectorRegistry, **options: Any) -> GracefulMiddleware:
    app = Starlette(routes=[Route("/v1/echo", echo, methods=["POST"]), Route("/v1/stream", stream)])
    mw = GracefulMiddleware(app, registry=registry, admin=False, **options)
    mw.drain.mark_serving()
    return mw


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test")


async def test_every_response_from_the_drain_start_carries_the_announcement(registry: CollectorRegistry) -> None:
    """1. SERVING: no response carries it  2. drain begins (propagation wait 30 s, admitting):
    the admitted request's response, a stream's and the probes' carry it, and the drain's
    status keeps when the first went out  3. the drain with admission over: the refusal carries it"""
    mw = middleware(registry, propagation_wait="30s", grace_period=60)
    async with client(mw) as c:
        for response in (await c.post("/v1/echo", content=b"a"), await c.get("/ready"), await c.get("/v1/stream")):
            assert response.status_code == 200 and HEADER not in response.headers, response.headers
        mw.drain.begin_drain("test")
        run = core(mw.drain).run
        assert run is not None and run.announced is None
        admitted = await c.post("/v1/echo", content=b"b")
        assert admitted.status_code == 200 and admitted.json() == {"body": "b"}
        assert admitted.headers[HEADER] == "true"
        assert run.announced is not None and run.announced >= run.started
        first = run.announced
        streamed = await c.get("/v1/stream")
        assert streamed.text == "data: 0\n\ndata: 1\n\ndata: 2\n\n" and streamed.headers[HEADER] == "true"
        for probe in ("/ready", "/live", "/startup"):
            assert (await c.get(probe)).headers[HEADER] == "true", probe
        assert run.announced == first  # the first one is kept
        mw.drain.resume()
        mw.drain.begin_drain("again", propagation_wait=0)
        refused = await c.post("/v1/echo", content=b"c")
    assert refused.status_code == 503 and refused.headers["x-graceful-not-started"] == "1"
    assert refused.headers[HEADER] == "true"


async def test_the_result_says_when_the_drain_was_announced_and_why_propagation_ended(
    registry: CollectorRegistry,
) -> None:
    """A drain with the quiet rule: one request answered in it, then none. The result has the
    announcement's time (that request's response), the last request's, and "quiet"."""
    mw = middleware(registry, propagation_wait="10s", propagation_quiet="0.2s", grace_period=60)
    async with client(mw) as c:
        mw.drain.begin_drain("test")
        assert (await c.post("/v1/echo", content=b"x")).headers[HEADER] == "true"
        result = await mw.drain.drain()
    assert result.drained and result.propagation_ended_by == "quiet"
    assert result.announced is not None and result.last_request is not None
    assert 0 <= result.last_request <= result.announced < result.propagation
    assert result.as_dict()["announced"] == pytest.approx(result.announced, abs=1e-6)
    assert result.as_dict()["propagation_ended_by"] == "quiet"


async def test_announce_drain_off_sends_nothing(registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    """announce_drain=False, and GRACEFUL_ANNOUNCE_DRAIN=0 alike: no response of the drain carries
    it (admitted, probe, refusal), and the result says none was announced."""
    monkeypatch.setenv("GRACEFUL_ANNOUNCE_DRAIN", "0")
    for mw in (middleware(registry, announce_drain=False), middleware(CollectorRegistry())):
        mw.drain.begin_drain("test", propagation_wait=10, propagation_quiet=0.2)
        async with client(mw) as c:
            responses = [await c.post("/v1/echo", content=b"x"), await c.get("/ready")]
            result = await mw.drain.drain()
            responses.append(await c.post("/v1/echo", content=b"y"))
        assert [r.status_code for r in responses] == [200, 503, 503]
        assert all(HEADER not in r.headers for r in responses)
        assert result.drained and result.announced is None and result.propagation_ended_by == "quiet"


async def test_no_announcement_outside_a_drain(registry: CollectorRegistry) -> None:
    """Refusals and failing probes that are not a drain's carry nothing: STARTING (its refusal and
    /ready), SERVING at the reject_over limit and /ready at max_in_flight, and SERVING again after
    a drain is resumed."""
    gate = anyio.Event()

    async def held(request: Request) -> JSONResponse:
        await gate.wait()
        return JSONResponse({})

    app = Starlette(routes=[Route("/v1/echo", echo, methods=["POST"]), Route("/v1/held", held)])
    mw = GracefulMiddleware(app, registry=registry, admin=False, max_in_flight=1, reject_over=1, ready_on_startup=False)
    async with LifespanManager(mw), client(mw) as c:
        starting = [await c.post("/v1/echo", content=b"x"), await c.get("/ready")]
        assert [r.status_code for r in starting] == [503, 503]
        mw.drain.mark_serving()
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.get, "/v1/held")
            with anyio.fail_after(5):
                while mw.drain.in_flight < 1:
                    await anyio.sleep(0.01)
            full = [await c.post("/v1/echo", content=b"x"), await c.get("/ready")]
            gate.set()
        assert [r.status_code for r in full] == [503, 503]
        assert full[0].json()["error"]["type"] == "server_overloaded"
        mw.drain.begin_drain("test", propagation_wait=10)
        assert (await c.get("/ready")).headers[HEADER] == "true"
        assert mw.drain.resume()
        resumed = [await c.post("/v1/echo", content=b"x"), await c.get("/ready")]
        assert [r.status_code for r in resumed] == [200, 200]
    assert all(HEADER not in r.headers for r in (*starting, *full, *resumed))


def test_a_bad_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from graceful import ConfigError

    monkeypatch.setenv("GRACEFUL_ANNOUNCE_DRAIN", "maybe")
    with pytest.raises(ConfigError, match="GRACEFUL_ANNOUNCE_DRAIN"):
        GracefulMiddleware(Starlette(), registry=CollectorRegistry(), admin=False)
