"""Plain request/response through httpx.ASGITransport, lifespan, metrics and websockets."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager, LifespanNotSupported
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from graceful import Drain, GracefulMiddleware, State
from graceful._asgi._types import Receive, Scope, Send

pytestmark = pytest.mark.anyio


async def echo(request: Request) -> JSONResponse:
    return JSONResponse({"path": request.url.path, "body": (await request.body()).decode()})


def starlette_app(**kwargs: Any) -> Starlette:
    return Starlette(routes=[Route("/v1/echo", echo, methods=["POST"])], **kwargs)


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test")


async def test_request_response_and_refusal(registry: CollectorRegistry) -> None:
    mw = GracefulMiddleware(starlette_app(), registry=registry, admin=False, request_id_header="x-request-id")
    mw.drain.mark_serving()
    async with client(mw) as c:
        ok = await c.post("/v1/echo", content=b"hello")
        assert ok.status_code == 200 and ok.json() == {"path": "/v1/echo", "body": "hello"}
        assert ok.headers["x-request-id"]
        mw.drain.begin_drain("test")
        refused = await c.post("/v1/echo", content=b"hello")
    assert refused.status_code == 503
    assert refused.json()["error"]["type"] == "server_draining"
    assert refused.headers["x-graceful-not-started"] == "1"
    assert mw.drain.counters()["requests"]["completed"] == 1


async def test_lifespan_moves_starting_to_serving_to_stopped(registry: CollectorRegistry) -> None:
    mw = GracefulMiddleware(starlette_app(), registry=registry, admin=False)
    assert mw.drain.state is State.STARTING
    async with LifespanManager(mw):
        assert mw.drain.state is State.SERVING
    assert mw.drain.state is State.STOPPED


async def test_ready_on_startup_false_waits_for_mark_serving(registry: CollectorRegistry) -> None:
    mw = GracefulMiddleware(starlette_app(), registry=registry, admin=False, ready_on_startup=False)
    async with LifespanManager(mw), client(mw) as c:
        assert mw.drain.state is State.STARTING
        assert (await c.get("/startup")).status_code == 503
        assert (await c.post("/v1/echo")).json()["error"]["type"] == "server_starting"
        mw.drain.mark_serving()
        assert (await c.get("/startup")).status_code == 200
        assert (await c.get("/ready")).status_code == 200


async def test_app_without_lifespan_support_raises_as_unwrapped_and_still_serves(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    async def bare(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    mw = GracefulMiddleware(bare, registry=registry, admin=False)
    # The app's AssertionError reaches the lifespan driver as it would unwrapped: asgi-lifespan
    # then says the app does not support lifespan, and the server would go on without one.
    with pytest.raises(LifespanNotSupported) as failed:
        async with LifespanManager(mw):
            pass  # pragma: no cover
    assert type(failed.value.__cause__) is AssertionError
    assert mw.drain.state is State.STARTING
    with caplog.at_level(logging.WARNING, logger="graceful"):
        async with client(mw) as c:
            assert (await c.get("/anything")).status_code == 204
    assert mw.drain.state is State.SERVING
    assert [r.getMessage() for r in caplog.records if "no lifespan" in r.getMessage()]


async def test_startup_failure_is_reported_and_stops(registry: CollectorRegistry) -> None:
    async def lifespan(app: Starlette) -> Any:
        raise RuntimeError("weights missing")
        yield  # pragma: no cover

    from contextlib import asynccontextmanager

    mw = GracefulMiddleware(starlette_app(lifespan=asynccontextmanager(lifespan)), registry=registry, admin=False)
    with pytest.raises(RuntimeError, match="^weights missing$"):  # the app's own error, as unwrapped
        async with LifespanManager(mw):
            pass  # pragma: no cover
    assert mw.drain.state is State.STOPPED


async def test_metrics_page(registry: CollectorRegistry) -> None:
    mw = GracefulMiddleware(starlette_app(), registry=registry, admin=False, metrics_path="/metrics")
    mw.drain.mark_serving()
    async with client(mw) as c:
        await c.post("/v1/echo")
        mw.drain.begin_drain("test")
        await c.post("/v1/echo")
        page = await c.get("/metrics")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page.text)
        for s in family.samples
    }
    assert samples[("graceful_state", (("state", "DRAINING"),))] == 1.0
    assert samples[("graceful_state", (("state", "SERVING"),))] == 0.0
    assert samples[("graceful_in_flight", ())] == 0.0
    assert samples[("graceful_requests_total", (("outcome", "completed"),))] == 1.0
    assert samples[("graceful_rejected_total", (("reason", "server_draining"),))] == 1.0
    assert ("graceful_drain_duration_seconds_count", ()) in samples


async def test_metrics_not_served_unless_asked(registry: CollectorRegistry) -> None:
    mw = GracefulMiddleware(starlette_app(), registry=registry, admin=False)
    mw.drain.mark_serving()
    async with client(mw) as c:
        assert (await c.get("/metrics")).status_code == 404


async def test_drain_duration_histogram_counts_drains(registry: CollectorRegistry) -> None:
    mw = GracefulMiddleware(starlette_app(), registry=registry, admin=False)
    mw.drain.mark_serving()
    await mw.drain.drain(timeout=1)
    samples = {s.name: s.value for f in registry.collect() for s in f.samples if not s.labels or "le" not in s.labels}
    assert samples["graceful_drain_duration_seconds_count"] == 1.0
    assert samples["graceful_drains_total"] == 1.0


def test_a_newer_drain_replaces_the_older_on_one_registry(registry: CollectorRegistry) -> None:
    first = GracefulMiddleware(starlette_app(), registry=registry, admin=False)
    second = GracefulMiddleware(starlette_app(), registry=registry, admin=False)
    second.drain.mark_serving()
    states = [s for f in registry.collect() if f.name == "graceful_state" for s in f.samples if s.value == 1.0]
    assert [s.labels["state"] for s in states] == ["SERVING"]
    assert first.drain is not second.drain
    # Registering the same drain again is a no-op: one state series still, no duplicate error.
    GracefulMiddleware(starlette_app(), second.drain, registry=registry, admin=False)
    states = [s for f in registry.collect() if f.name == "graceful_state" for s in f.samples if s.value == 1.0]
    assert [s.labels["state"] for s in states] == ["SERVING"]


def test_shared_drain_between_middlewares(registry: CollectorRegistry) -> None:
    drain = Drain(grace_period=10, reserve=2)
    mw = GracefulMiddleware(starlette_app(), drain, registry=registry, admin=False)
    assert mw.drain is drain
