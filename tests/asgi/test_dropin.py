"""Drop-in: outside a drain, a wrapped app behaves as the unwrapped one (docs/middleware.md, "Without a lifespan").

The rules: a request that arrives while no lifespan runs is served, and the log says once what
the process then lacks; a lifespan startup after a shutdown begins a new lifecycle; a drain stays
final for its lifecycle; the app's own lifespan messages and exceptions reach the server unchanged.
``scripts/upstream-suites`` holds the same promise with Starlette's and FastAPI's own test suites.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket

from graceful import GracefulMiddleware, State
from graceful._asgi._types import ASGIApp, Message, Receive, Scope, Send
from graceful._drain._state import core
from graceful.cli import cli
from tests.servers import Launched


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_text(await websocket.receive_text())
    await websocket.close()


def app_with_lifespan(events: list[str]) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        events.append("startup")
        yield
        events.append("shutdown")

    return Starlette(routes=[Route("/hello", hello), WebSocketRoute("/ws", echo)], lifespan=lifespan)


def wrap(app: ASGIApp, **options: Any) -> GracefulMiddleware:
    # Default options but a registry of the test's own: admin socket and SIGTERM drain stay on.
    return GracefulMiddleware(app, registry=CollectorRegistry(), **options)


def no_lifespan_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "graceful" and "no lifespan runs" in r.getMessage()]


def test_without_a_lifespan_a_request_is_served_and_the_log_says_once_what_is_missing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """1. TestClient without `with`: no lifespan runs  2. two requests  3. both are served  4. one warning."""
    mw = wrap(app_with_lifespan([]))
    client = TestClient(mw)
    with caplog.at_level(logging.DEBUG, logger="graceful"):
        first = client.get("/hello")
        second = client.get("/hello")
    assert (first.status_code, first.text) == (200, "hello")
    assert (second.status_code, second.text) == (200, "hello")
    assert mw.drain.state is State.SERVING
    (warning,) = no_lifespan_warnings(caplog)
    assert "the admin socket" in warning and "the SIGTERM drain" in warning and "--lifespan on" in warning
    assert [r.levelname for r in caplog.records if "no lifespan runs" in r.getMessage()] == ["WARNING"]
    assert "state STARTING -> SERVING" in caplog.text and "reason=no lifespan" in caplog.text


def test_without_a_lifespan_the_probes_report_serving() -> None:
    """A kubelet probing a server run with --lifespan off must see it ready, or it never gets traffic."""
    mw = wrap(app_with_lifespan([]))
    client = TestClient(mw)
    assert client.get("/startup").status_code == 200
    assert client.get("/ready").json() == {"ok": True, "state": "SERVING", "in_flight": 0}


def test_without_a_lifespan_a_websocket_is_served() -> None:
    client = TestClient(wrap(app_with_lifespan([])))
    with client.websocket_connect("/ws") as ws:
        ws.send_text("ping")
        assert ws.receive_text() == "ping"


def test_ready_on_startup_false_still_waits_for_mark_serving() -> None:
    mw = wrap(app_with_lifespan([]), ready_on_startup=False)
    client = TestClient(mw)
    assert client.get("/hello").json()["error"]["type"] == "server_starting"
    mw.drain.mark_serving()
    assert client.get("/hello").text == "hello"


def test_only_what_is_missing_is_named(caplog: pytest.LogCaptureFixture) -> None:
    mw = wrap(app_with_lifespan([]), admin=False)
    with caplog.at_level(logging.INFO, logger="graceful"):
        assert TestClient(mw).get("/hello").status_code == 200
    (warning,) = no_lifespan_warnings(caplog)
    assert "admin socket" not in warning and "the SIGTERM drain" in warning


def test_a_second_lifespan_cycle_serves(socket_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """1. lifespan, request, shutdown  2. the same app object started again  3. it serves, its startup ran twice."""
    monkeypatch.setenv("GRACEFUL_SOCKET_DIR", socket_dir)
    events: list[str] = []
    mw = wrap(app_with_lifespan(events))
    for _ in range(2):
        with TestClient(mw) as client:
            assert mw.drain.state is State.SERVING
            assert client.get("/hello").text == "hello"
            assert os.listdir(socket_dir) == [f"{os.getpid()}.sock"]  # each cycle has its admin socket
        assert mw.drain.state is State.STOPPED
        assert os.listdir(socket_dir) == []
    assert events == ["startup", "shutdown", "startup", "shutdown"]


def test_after_a_plain_shutdown_a_request_without_lifespan_is_served(
    socket_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One test's `with TestClient(app)`, the next test's TestClient(app) without `with`: as unwrapped."""
    monkeypatch.setenv("GRACEFUL_SOCKET_DIR", socket_dir)
    mw = wrap(app_with_lifespan([]))
    with TestClient(mw) as client:
        assert client.get("/hello").status_code == 200
    assert mw.drain.state is State.STOPPED
    assert TestClient(mw).get("/hello").text == "hello"
    assert mw.drain.state is State.SERVING


def test_a_drain_stays_final_for_its_lifecycle(socket_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """1. cycle 1 drains: refused  2. its shutdown: still refused without a lifespan  3. cycle 2 serves."""
    monkeypatch.setenv("GRACEFUL_SOCKET_DIR", socket_dir)
    mw = wrap(app_with_lifespan([]))
    with TestClient(mw) as client:
        mw.drain.begin_drain("test")
        refused = client.get("/hello")
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "server_draining"
    assert mw.drain.state is State.STOPPED and core(mw.drain).stopped_draining
    after = TestClient(mw).get("/hello")
    assert after.status_code == 503 and after.json()["error"]["type"] == "server_stopped"
    assert after.headers["x-graceful-not-started"] == "1"
    with TestClient(mw) as client:
        assert client.get("/hello").text == "hello"
    assert mw.drain.counters()["rejected"] == {"server_draining": 1, "server_stopped": 1}


# -- the app's own lifespan messages and errors reach the server unchanged -------------------


class Driver:
    """A server's side of lifespan: startup, then shutdown; records what the app sends and raises."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.raised: BaseException | None = None

    async def run(self, app: ASGIApp) -> None:
        incoming = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
        gate = anyio.Event()

        async def receive() -> Message:
            message = next(incoming, None)
            if message is None:
                await gate.wait()  # pragma: no cover - a well-behaved app never asks again
            assert message is not None
            if message["type"] == "lifespan.shutdown":
                # A server sends shutdown only after startup has been answered.
                assert self.sent, "shutdown asked before startup was answered"
            return message

        async def send(message: Message) -> None:
            self.sent.append(message)

        try:
            await app(
                {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}, receive, send
            )
        except BaseException as exc:
            self.raised = exc


def failing_lifespan(where: str, error: Exception) -> Callable[[], Starlette]:
    def make() -> Starlette:
        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            if where == "startup":
                raise error
            yield
            raise error

        return Starlette(routes=[Route("/hello", hello)], lifespan=lifespan)

    return make


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["startup", "shutdown"])
async def test_the_apps_lifespan_error_reaches_the_server_unchanged(
    where: str, socket_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRACEFUL_SOCKET_DIR", socket_dir)
    error = KeyError("weights")
    unwrapped, wrapped = Driver(), Driver()
    await unwrapped.run(failing_lifespan(where, error)())
    mw = wrap(failing_lifespan(where, error)())
    await wrapped.run(mw)
    assert unwrapped.raised is error
    assert wrapped.raised is error  # the same object: not wrapped in an ExceptionGroup, not swallowed
    assert type(wrapped.raised) is KeyError
    # lifespan.startup.failed / shutdown.failed as the app sent them: Starlette's message is the
    # traceback, whose outer frames are the caller's (here they include the middleware's).
    assert [m["type"] for m in wrapped.sent] == [m["type"] for m in unwrapped.sent]
    assert wrapped.sent[-1]["type"] == f"lifespan.{where}.failed"
    assert (
        wrapped.sent[-1]["message"].splitlines()[-1]
        == unwrapped.sent[-1]["message"].splitlines()[-1]
        == "KeyError: 'weights'"
    )
    assert mw.drain.state is State.STOPPED


@pytest.mark.anyio
async def test_the_apps_failure_messages_pass_through_as_sent() -> None:
    failed = {"type": "lifespan.startup.failed", "message": "no GPU"}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "lifespan.startup"
        await send(failed)

    driver = Driver()
    await driver.run(wrap(app, admin=False))
    assert driver.raised is None and driver.sent == [failed]


@pytest.mark.anyio
async def test_an_app_that_raises_on_the_lifespan_scope_is_not_swallowed() -> None:
    error = AssertionError("http only")

    async def http_only(scope: Scope, receive: Receive, send: Send) -> None:
        raise error

    driver = Driver()
    await driver.run(wrap(http_only, admin=False))
    assert driver.raised is error and driver.sent == []


def test_an_exception_from_a_request_reaches_the_server_unchanged() -> None:
    error = LookupError("from the app")

    async def boom(request: Request) -> PlainTextResponse:
        raise error

    app = Starlette(routes=[Route("/boom", boom)])
    with pytest.raises(LookupError) as raised:
        TestClient(wrap(app, admin=False)).get("/boom")
    assert raised.value is error


# -- SIGTERM that cannot be taken over, and the hook's own arguments ---------------------------


@pytest.mark.parametrize("workers", ["1", "0"])
def test_hypercorn_with_workers_warns_that_sigterm_cannot_drain(workers: str, launch: Callable[..., Launched]) -> None:
    """1. hypercorn --workers N (N >= 1 spawns workers whose parent takes SIGTERM)  2. one warning naming the fix."""
    server = launch("--workers", workers, app="tests.apps.compat:app", server="hypercorn-asyncio")
    server.wait_ready()
    warning = "SIGTERM cannot drain this worker: hypercorn --workers N stops it through its parent process"
    if workers == "1":
        assert server.log.count(warning) == 1, server.log
        assert "run hypercorn with --workers 0, or drain from the preStop hook (graceful drain)" in server.log
    else:
        assert warning not in server.log
        assert httpx.get(server.url("/ready"), timeout=5).status_code == 200


IMPOSSIBLE = ["drain", "--grace-period", "10", "--propagation-wait", "20s"]


def test_graceful_drain_checks_its_budget_before_it_looks_for_servers(tmp_path: Any) -> None:
    empty = str(tmp_path)  # no server here: the budget error must come first
    expected = (
        "graceful drain: --propagation-wait 20s is longer than the whole drain: --grace-period 10s leaves the drain 5s "
        "after the reserve 5s; shorten --propagation-wait or raise --grace-period, the pod's "
        "terminationGracePeriodSeconds"
    )
    hook = subprocess.run(
        [sys.executable, "-m", "graceful", *IMPOSSIBLE, "--socket-dir", empty],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (hook.returncode, hook.stderr.strip()) == (2, expected)
    clicked = CliRunner().invoke(cli, [*IMPOSSIBLE, "--socket-dir", empty])
    assert clicked.exit_code == 2 and expected in clicked.output
    timed = CliRunner().invoke(cli, ["drain", "--timeout", "3", "--propagation-wait", "20s", "--socket-dir", empty])
    assert timed.exit_code == 2 and "--timeout is 3s; shorten --propagation-wait or raise --timeout" in timed.output
    fits = CliRunner().invoke(
        cli, ["drain", "--grace-period", "60", "--propagation-wait", "20s", "--socket-dir", empty]
    )
    assert fits.exit_code == 3  # a budget that fits: now it looks, and finds nobody
