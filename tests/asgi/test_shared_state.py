"""What the process shares is not graceful's (docs/middleware.md, "Process-wide state").

The Prometheus registry, the root logger and the SIGTERM handler belong to the process and to
other code in it. graceful trusts nothing it remembers about them, adds nothing to the app's
logs above DEBUG outside a drain, and keeps what it installs readable by those who look for
the server through it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
from asgi_lifespan import LifespanManager
from prometheus_client import REGISTRY, CollectorRegistry, Gauge, generate_latest
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from graceful import GracefulMiddleware, State
from graceful._asgi._metrics import GracefulCollector
from graceful._asgi._types import ASGIApp
from tests.utils import listening_socket

pytestmark = pytest.mark.anyio

app_log = logging.getLogger("tests.app")


def starlette_app() -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app_log.info("app started")
        yield
        app_log.info("app stopped")

    async def hello(request: Request) -> PlainTextResponse:
        app_log.info("hello from %s", request.url.path)
        return PlainTextResponse("hello")

    return Starlette(routes=[Route("/hello", hello)], lifespan=lifespan)


# -- the Prometheus registry -------------------------------------------------------------------


@contextmanager
def default_registry_restored() -> Iterator[None]:
    """Let a test empty prometheus_client.REGISTRY, as a metrics plugin's tests do, and put it back after."""
    saved = list(REGISTRY._collector_to_names)  # the same private map such tests walk
    try:
        yield
    finally:
        for collector in list(REGISTRY._collector_to_names):
            REGISTRY.unregister(collector)
        for collector in saved:
            REGISTRY.register(collector)


def empty_the_registry() -> None:
    for collector in list(REGISTRY._collector_to_names):
        REGISTRY.unregister(collector)


def unregister_gracefuls() -> None:
    for collector in list(REGISTRY._collector_to_names):
        if isinstance(collector, GracefulCollector):
            REGISTRY.unregister(collector)


async def serves(mw: GracefulMiddleware) -> str:
    async with LifespanManager(mw), httpx.AsyncClient(transport=httpx.ASGITransport(app=mw), base_url="http://t") as c:
        return (await c.get("/hello")).text


@pytest.mark.parametrize("other_party", [empty_the_registry, unregister_gracefuls])
async def test_a_middleware_built_after_another_party_changed_the_registry_serves_and_exposes_metrics(
    other_party: Any, socket_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1. a middleware on the default registry  2. another party empties the registry, or takes
    graceful's collector out  3. a new middleware is built  4. it serves, and its metrics are exposed."""
    monkeypatch.setenv("GRACEFUL_SOCKET_DIR", socket_dir)
    with default_registry_restored():
        GracefulMiddleware(starlette_app())
        other_party()
        mw = GracefulMiddleware(starlette_app())
        assert await serves(mw) == "hello"
        page = generate_latest(REGISTRY).decode()
        assert 'graceful_state{state="SERVING"} 0.0' in page  # STOPPED after the lifespan's end
        assert 'graceful_state{state="STOPPED"} 1.0' in page
        assert 'graceful_requests_total{outcome="completed"} 1.0' in page


async def test_a_name_taken_by_another_party_leaves_the_app_serving_and_says_so(
    socket_dir: str, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    monkeypatch.setenv("GRACEFUL_SOCKET_DIR", socket_dir)
    registry = CollectorRegistry(auto_describe=True)  # finds clashes, as the default registry does
    Gauge("graceful_in_flight", "someone else's", registry=registry)
    with caplog.at_level(logging.WARNING, logger="graceful"):
        mw = GracefulMiddleware(starlette_app(), registry=registry)
    assert await serves(mw) == "hello"
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("graceful_* metrics are not exposed: ") and "graceful_in_flight" in warning
    assert "registry of its own" in warning
    assert b"graceful_state" not in generate_latest(registry)


async def test_a_second_middleware_on_one_registry_replaces_the_first(registry: CollectorRegistry) -> None:
    first = GracefulMiddleware(starlette_app(), registry=registry, admin=False)
    second = GracefulMiddleware(starlette_app(), registry=registry, admin=False)
    first.drain.mark_serving()
    collectors: list[Collector] = list(registry._collector_to_names)
    assert [c.drain for c in collectors if isinstance(c, GracefulCollector)] == [second.drain]
    assert b'graceful_state{state="STARTING"} 1.0' in generate_latest(registry)


# -- the app's logs ----------------------------------------------------------------------------


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[tuple[str, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.name, record.levelname, record.getMessage()))


@contextmanager
def root_records() -> Iterator[Records]:
    """The root logger at INFO with a handler of the test's own, as apps and their tests configure it."""
    root = logging.getLogger()
    handler, level = Records(), root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


async def startup_and_requests(app: ASGIApp) -> list[tuple[str, str, str]]:
    with root_records() as records:
        async with LifespanManager(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                for _ in range(3):
                    assert (await client.get("/hello")).text == "hello"
                assert (await client.get("/missing")).status_code == 404
    return [record for record in records.seen if not record[0].startswith("httpx")]


async def test_outside_a_drain_the_apps_root_logger_records_are_the_same_wrapped(
    registry: CollectorRegistry, socket_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1. startup, four requests and shutdown, unwrapped  2. the same wrapped with default options
    (admin socket and SIGTERM drain on)  3. the root logger saw the same records."""
    monkeypatch.setenv("GRACEFUL_SOCKET_DIR", socket_dir)
    unwrapped = await startup_and_requests(starlette_app())
    wrapped = await startup_and_requests(GracefulMiddleware(starlette_app(), registry=registry))
    assert unwrapped == [
        ("tests.app", "INFO", "app started"),
        *[("tests.app", "INFO", "hello from /hello")] * 3,
        ("tests.app", "INFO", "app stopped"),
    ]
    assert wrapped == unwrapped


async def test_a_drain_is_logged_at_info(registry: CollectorRegistry, caplog: Any) -> None:
    mw = GracefulMiddleware(starlette_app(), registry=registry, admin=False, propagation_wait=0)
    with caplog.at_level(logging.INFO, logger="graceful"):
        async with LifespanManager(mw):
            await mw.drain.drain(reason="test")
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(m.startswith("state SERVING -> DRAINING") for m in infos)
    assert any(m.startswith("state DRAINING -> STOPPED") for m in infos)
    assert any(m.startswith("drain drained: reason=test") for m in infos)
    assert not any("STARTING -> SERVING" in m for m in infos)


# -- the SIGTERM handler: sse-starlette finds uvicorn's Server through it ---------------------


def sse_app(frames: list[str]) -> Starlette:
    from sse_starlette import EventSourceResponse

    async def events(request: Request) -> EventSourceResponse:
        async def endless() -> AsyncIterator[dict[str, str]]:
            while True:
                frames.append("hello")
                yield {"data": "hello"}
                await asyncio.sleep(0.05)

        return EventSourceResponse(endless())

    return Starlette(routes=[Route("/events", events)])


@pytest.mark.parametrize("drain_first", [False, True], ids=["told-to-exit", "draining-then-told-to-exit"])
async def test_an_event_source_stream_ends_when_uvicorn_is_told_to_exit(
    drain_first: bool, registry: CollectorRegistry, socket_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sse-starlette ends open streams once ``signal.getsignal(SIGTERM).__self__.should_exit`` is true:
    1. a real uvicorn in this (main) thread installs its SIGTERM handler; graceful takes it over at startup
    2. an endless EventSourceResponse stream is open  3. (a drain begins: the stream goes on)
    4. the server is told to exit  5. the stream ends and uvicorn exits, well before the drain's deadline."""
    monkeypatch.setenv("GRACEFUL_SOCKET_DIR", socket_dir)
    frames: list[str] = []
    mw = GracefulMiddleware(sse_app(frames), registry=registry, grace_period=60, propagation_wait=0)
    sock = listening_socket()
    server = uvicorn.Server(uvicorn.Config(mw, log_level="warning", timeout_graceful_shutdown=30))
    port = sock.getsockname()[1]
    before = signal.getsignal(signal.SIGTERM)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:  # ends when uvicorn's serve() returns
            tg.start_soon(server.serve, [sock])
            while not server.started:  # uvicorn offers a flag, not an event
                await anyio.sleep(0.01)
            handler = signal.getsignal(signal.SIGTERM)
            assert getattr(handler, "__self__", None) is not server  # graceful's handler is in front
            assert handler.__self__.should_exit is False  # type: ignore[union-attr]
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                async with client.stream("GET", "/events") as response:
                    lines = response.aiter_lines()
                    assert await anext(lines) == "data: hello"
                    if drain_first:
                        mw.drain.begin_drain("test")
                        seen = len(frames)
                        while len(frames) < seen + 3:  # the stream goes on through the drain
                            await anyio.sleep(0.01)
                        assert mw.drain.state is State.DRAINING
                    server.should_exit = True
                    assert handler.__self__.should_exit is True  # type: ignore[union-attr]
                    async for _ in lines:  # ends once sse-starlette sees should_exit
                        pass
    assert mw.drain.state is State.STOPPED
    assert signal.getsignal(signal.SIGTERM) == before
