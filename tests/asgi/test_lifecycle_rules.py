"""The rules without a lifespan, and lifespans run side by side (docs/middleware.md, "Without a lifespan").

Driven through ``httpx.ASGITransport`` (requests without a lifespan, as ``TestClient(app)`` without
``with`` sends them) and asgi-lifespan's ``LifespanManager`` (a lifespan as servers run it).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry

from graceful import GracefulMiddleware, State
from graceful._asgi._types import Receive, Scope, Send

pytestmark = pytest.mark.anyio

NO_LIFESPAN = "no lifespan runs for this app"


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            done = "startup" if message["type"] == "lifespan.startup" else "shutdown"
            await send({"type": f"lifespan.{done}.complete"})
            if done == "shutdown":
                return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def wrap(**options: Any) -> GracefulMiddleware:
    options = {"admin": False, "grace_period": 30, "reserve": 5, "propagation_wait": 0, **options}
    return GracefulMiddleware(app, registry=CollectorRegistry(), **options)


@asynccontextmanager
async def client(mw: GracefulMiddleware) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw), base_url="http://app") as c:
        yield c


def warnings_in(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "graceful" and r.levelno >= logging.WARNING]


async def test_after_a_shutdown_that_was_not_a_drain_a_request_without_a_lifespan_is_served(
    socket_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """1. a lifespan starts and shuts down (no drain) 2. the app object is used again without a lifespan
    3. its request is served: a new lifecycle, SERVING, with one warning naming what the process lacks."""
    mw = wrap(drain_on_sigterm=False, admin=True, socket_dir=socket_dir)
    for _ in range(2):  # the warning is said once, however many lifecycles follow
        async with LifespanManager(mw):
            pass
        assert mw.drain.state is State.STOPPED
        async with client(mw) as c:
            assert (await c.get("/v1/models")).status_code == 200
            assert (await c.get("/v1/models")).status_code == 200
        assert mw.drain.state is State.SERVING
    (warning,) = [w for w in warnings_in(caplog) if NO_LIFESPAN in w]
    # The admin socket is missing; the SIGTERM drain was turned off, so it is not named.
    assert "the admin socket" in warning and "SIGTERM" not in warning


async def test_after_a_drain_a_request_without_a_lifespan_stays_refused() -> None:
    """A drain is final for its lifecycle: after the drained lifespan's shutdown, a request without a
    lifespan is refused (server_stopped) until a new lifespan startup, which serves again."""
    mw = wrap()
    async with LifespanManager(mw):
        with anyio.fail_after(10):
            assert (await mw.drain.drain()).drained
    async with client(mw) as c:
        refused = await c.get("/v1/models")
        assert refused.status_code == 503
        assert refused.json()["error"]["type"] == "server_stopped"
        assert mw.drain.state is State.STOPPED
        async with LifespanManager(mw):
            assert (await c.get("/v1/models")).status_code == 200
    assert mw.drain.counters()["rejected"] == {"server_stopped": 1}


async def test_with_nothing_missing_serving_without_a_lifespan_is_not_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No admin socket and no SIGTERM drain asked for: nothing is lacking, so the log says it at DEBUG only."""
    caplog.set_level(logging.DEBUG, logger="graceful")
    mw = wrap(admin=False, drain_on_sigterm=False)
    async with client(mw) as c:
        assert (await c.get("/ready")).status_code == 200
    assert not [w for w in warnings_in(caplog) if NO_LIFESPAN in w]
    assert any(NO_LIFESPAN in r.getMessage() and r.levelno == logging.DEBUG for r in caplog.records)


async def test_the_sigterm_drain_is_named_as_missing_without_a_lifespan(caplog: pytest.LogCaptureFixture) -> None:
    mw = wrap(admin=False, drain_on_sigterm=True)
    async with client(mw) as c:
        assert (await c.get("/startup")).status_code == 200
    (warning,) = [w for w in warnings_in(caplog) if NO_LIFESPAN in w]
    assert "the SIGTERM drain" in warning and "admin socket" not in warning


async def test_two_lifespans_at_once_end_the_lifecycle_when_the_last_one_shuts_down() -> None:
    """One app object run by two servers together: the first shutdown leaves the other serving; the
    lifecycle ends (STOPPED) with the last one."""
    mw = wrap(drain_on_sigterm=False)
    async with client(mw) as c:
        first = LifespanManager(mw)
        await first.__aenter__()
        try:
            async with LifespanManager(mw):
                assert mw.drain.state is State.SERVING
                await first.__aexit__(None, None, None)
                assert mw.drain.state is State.SERVING
                assert (await c.get("/v1/models")).status_code == 200
        finally:
            if mw.drain.state is State.SERVING:  # the test failed before the first one's shutdown
                await first.__aexit__(None, None, None)
    assert mw.drain.state is State.STOPPED
