"""WebSocket paths driven with raw ASGI messages: refusals without the denial extension,
the deadline before and after accept, and how a socket's end is classified."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry

from graceful import GracefulMiddleware, State
from graceful._asgi._types import Message, Receive, Scope, Send

pytestmark = pytest.mark.anyio


def ws_scope(extensions: dict[str, Any] | None = None) -> Scope:
    return {"type": "websocket", "path": "/ws", "headers": [], "client": ("127.0.0.1", 1), "extensions": extensions}


def make(app: Any) -> GracefulMiddleware:
    mw = GracefulMiddleware(app, registry=CollectorRegistry(), admin=False, grace_period=10, reserve=2)
    mw.drain.mark_serving()
    return mw


async def connect() -> Message:
    return {"type": "websocket.connect"}


async def never_called(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("a refused handshake must not reach the app")  # pragma: no cover


@pytest.mark.parametrize(
    ("state", "reason"),
    [(State.DRAINING, "server_draining"), (State.STARTING, "server_starting"), (State.STOPPED, "server_stopped")],
)
async def test_refusal_without_the_denial_extension_closes_with_1013(state: State, reason: str) -> None:
    # STARTING refuses while the app is not ready yet (ready_on_startup=False), STOPPED after a drain:
    # without a lifespan, either would otherwise serve (tests/asgi/test_dropin.py).
    mw = GracefulMiddleware(never_called, registry=CollectorRegistry(), admin=False, ready_on_startup=False)
    if state is not State.STARTING:
        mw.drain.mark_serving()
        mw.drain.begin_drain("test")
    if state is State.STOPPED:
        mw.drain.mark_stopped()
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await mw(ws_scope(), connect, send)
    assert sent == [{"type": "websocket.close", "code": 1013}]
    assert mw.drain.counters()["rejected"] == {reason: 1}


async def test_refusal_with_the_extension_is_a_marked_503() -> None:
    mw = make(never_called)
    mw.drain.begin_drain("test")
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await mw(ws_scope({"websocket.http.response": {}}), connect, send)
    start, body = sent
    assert start["status"] == 503 and (b"x-graceful-not-started", b"1") in start["headers"]
    assert json.loads(body["body"])["error"]["type"] == "server_draining"


async def test_refusal_ignores_a_peer_that_left_before_connecting() -> None:
    mw = make(never_called)
    mw.drain.begin_drain("test")

    async def gone() -> Message:
        return {"type": "websocket.disconnect", "code": 1006}

    async def send(message: Message) -> None:
        raise AssertionError("nothing to answer")  # pragma: no cover

    await mw(ws_scope(), gone, send)


async def test_deadline_before_accept_closes_with_1013_and_cancels() -> None:
    cancelled = anyio.Event()

    async def slow_to_accept(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()

    mw = make(slow_to_accept)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, ws_scope(), connect, send)
        await anyio.wait_all_tasks_blocked()
        result = await mw.drain.drain(timeout=0.05)
    assert sent == [{"type": "websocket.close", "code": 1013}]
    assert cancelled.is_set()
    assert result.leftover[0].startswith("websocket /ws")
    assert mw.drain.counters()["requests"]["cancelled"] == 1 and mw.drain.in_flight == 0


async def test_send_failure_counts_as_client_disconnected() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": "hi"})

    async def broken(message: Message) -> None:
        if message["type"] == "websocket.send":
            raise OSError("peer gone")

    mw = make(app)
    with pytest.raises(OSError):
        await mw(ws_scope(), connect, broken)
    assert mw.drain.counters()["requests"]["client_disconnected"] == 1 and mw.drain.in_flight == 0


async def test_app_error_and_clean_close_are_told_apart() -> None:
    async def closes(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": 1000})

    async def crashes(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        raise RuntimeError("boom")

    async def sink(message: Message) -> None:
        pass

    mw = make(closes)
    await mw(ws_scope(), connect, sink)
    assert mw.drain.counters()["requests"]["completed"] == 1
    mw = make(crashes)
    with pytest.raises(RuntimeError):
        await mw(ws_scope(), connect, sink)
    assert mw.drain.counters()["requests"]["error"] == 1 and mw.drain.in_flight == 0


async def test_refusal_carries_the_configured_retry_after_and_request_id() -> None:
    """One refusal for HTTP and WebSocket: the retry_after option, not a fixed 1."""
    mw = GracefulMiddleware(
        never_called, registry=CollectorRegistry(), admin=False, retry_after=7, request_id_header="x-request-id"
    )
    mw.drain.mark_serving()
    mw.drain.begin_drain("test", propagation_wait=0)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {**ws_scope({"websocket.http.response": {}}), "headers": [(b"x-request-id", b"abc")]}
    await mw(scope, connect, send)
    start, body = sent
    assert start["status"] == 503
    headers = dict(start["headers"])
    assert (headers[b"retry-after"], headers[b"x-graceful-not-started"], headers[b"x-request-id"]) == (
        b"7",
        b"1",
        b"abc",
    )
    assert json.loads(body["body"])["error"]["type"] == "server_draining"


@pytest.mark.parametrize("extension", [False, True])
async def test_a_socket_past_reject_over_is_refused(extension: bool) -> None:
    """1. reject_over=1, one socket open  2. a second handshake  3. refused as overloaded, never reaching the app."""
    opened, release = anyio.Event(), anyio.Event()
    calls = 0

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal calls
        calls += 1
        await receive()
        await send({"type": "websocket.accept"})
        opened.set()
        await release.wait()
        await send({"type": "websocket.close", "code": 1000})

    mw = GracefulMiddleware(app, registry=CollectorRegistry(), admin=False, reject_over=1)
    mw.drain.mark_serving()
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def ignore(message: Message) -> None:
        pass

    extensions = {"websocket.http.response": {}} if extension else None
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(mw, ws_scope(), connect, ignore)
            await opened.wait()
            await mw(ws_scope(extensions), connect, send)
            release.set()
    assert calls == 1
    if extension:
        assert sent[0]["status"] == 503 and json.loads(sent[1]["body"])["error"]["type"] == "server_overloaded"
    else:
        assert sent == [{"type": "websocket.close", "code": 1013}]
    assert mw.drain.counters()["rejected"] == {"server_overloaded": 1}
