"""The app decides when its lifespan ends (docs/middleware.md, "Without a lifespan").

Whatever an app does with the lifespan scope, a server driving the wrapped app sees what it
would see driving the unwrapped one: the same messages in the same order, the same return or
the same exception object, and no waiting of graceful's own. ``Driver`` speaks lifespan as
uvicorn does: it sends ``lifespan.startup``, sends ``lifespan.shutdown`` once the app has
answered startup, and otherwise only waits for the call to end.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry

from graceful import GracefulMiddleware, State
from graceful._asgi._types import ASGIApp, Message, Receive, Scope, Send

pytestmark = pytest.mark.anyio

Shape = Callable[[Scope, Receive, Send], Awaitable[None]]
BOOM = RuntimeError("the app's own error")
EXIT = SystemExit(3)  # sys.exit() in a startup handler: not an Exception, still the app's own


async def never_reads(scope: Scope, receive: Receive, send: Send) -> None:
    return


async def reads_startup_and_returns(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()


async def returns_after_startup(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()
    await send({"type": "lifespan.startup.complete"})


async def raises_at_once(scope: Scope, receive: Receive, send: Send) -> None:
    raise BOOM


async def raises_after_startup(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()
    await send({"type": "lifespan.startup.complete"})
    raise BOOM


async def raises_at_shutdown(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()
    await send({"type": "lifespan.startup.complete"})
    await receive()
    raise BOOM


async def exits_in_startup(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()
    raise EXIT


async def sends_startup_twice(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()
    await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.startup.complete"})
    await receive()
    await send({"type": "lifespan.shutdown.complete"})


async def shutdown_without_startup(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()
    await send({"type": "lifespan.shutdown.complete"})


async def complete(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()
    await send({"type": "lifespan.startup.complete"})
    await receive()
    await send({"type": "lifespan.shutdown.complete"})


SHAPES = [
    never_reads,
    reads_startup_and_returns,
    returns_after_startup,
    raises_at_once,
    raises_after_startup,
    raises_at_shutdown,
    exits_in_startup,
    sends_startup_twice,
    shutdown_without_startup,
    complete,
]


def as_lifespan_app(shape: Shape) -> ASGIApp:
    """An app whose lifespan is ``shape`` and whose HTTP answer is a 204."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await shape(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return app


async def drive(app: ASGIApp) -> tuple[list[str], object]:
    """Run one lifespan call as uvicorn does; the messages the app sent and how the call ended."""
    to_app = [{"type": "lifespan.startup"}]
    arrived = anyio.Event()
    sent: list[str] = []

    async def receive() -> Message:
        while not to_app:
            await arrived.wait()
        return to_app.pop(0)

    async def send(message: Message) -> None:
        nonlocal arrived
        sent.append(message["type"])
        if message["type"] in ("lifespan.startup.complete", "lifespan.startup.failed") and len(sent) == 1:
            to_app.append({"type": "lifespan.shutdown"})  # served, then told to stop
            arrived.set()
            arrived = anyio.Event()

    scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
    ended: object = "returned"
    with anyio.fail_after(5):  # an extra wait of graceful's own would hang here
        try:
            await app(scope, receive, send)
        except (Exception, SystemExit) as exc:
            ended = exc
    return sent, ended


@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: shape.__name__)
async def test_each_lifespan_shape_ends_as_unwrapped(
    shape: Shape, registry: CollectorRegistry, socket_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1. the unwrapped app's lifespan, driven as uvicorn does  2. the wrapped one (admin socket and
    SIGTERM drain on)  3. the same messages, and the same return or the same exception object."""
    monkeypatch.setenv("GRACEFUL_SOCKET_DIR", socket_dir)
    unwrapped = await drive(as_lifespan_app(shape))
    wrapped = await drive(GracefulMiddleware(as_lifespan_app(shape), registry=registry))
    assert wrapped == unwrapped
    if isinstance(unwrapped[1], BaseException):
        assert wrapped[1] is unwrapped[1]


@pytest.mark.parametrize("shape", [never_reads, reads_startup_and_returns, returns_after_startup])
async def test_after_a_lifespan_that_ended_early_requests_are_served_and_the_log_says_so_once(
    shape: Shape, registry: CollectorRegistry, socket_dir: str, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """1. the app's lifespan call ends before any shutdown  2. requests
    3. served, and one warning names the admin socket."""
    monkeypatch.setenv("GRACEFUL_SOCKET_DIR", socket_dir)
    mw = GracefulMiddleware(as_lifespan_app(shape), registry=registry)
    with caplog.at_level(logging.INFO, logger="graceful"):
        await drive(mw)
        transport = httpx.ASGITransport(app=mw)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert [(await client.get("/x")).status_code for _ in range(3)] == [204, 204, 204]
    assert mw.drain.state is State.SERVING
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "admin socket" in warnings[0] and "SIGTERM drain" in warnings[0]
