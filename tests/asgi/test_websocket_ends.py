"""How a WebSocket session ends, with raw ASGI messages (docs/deadline.md, "At the deadline": closed with
1012; docs/middleware.md, "In-flight accounting": counted once, whatever ends it)."""

from __future__ import annotations

import anyio
import pytest

from graceful._asgi._types import Message, Receive, Scope, Send
from tests.asgi.test_websocket_raw import connect, make, ws_scope

pytestmark = pytest.mark.anyio


class Session:
    """An app that accepts, then waits until it is cancelled, and (``goodbye``) closes in its ``finally``."""

    def __init__(self, *, goodbye: bool = True) -> None:
        self.accepted = anyio.Event()
        self.goodbye = goodbye

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        self.accepted.set()
        try:
            await anyio.sleep_forever()
        finally:
            # Frameworks close the socket on the way out: once graceful has closed it, this goes nowhere.
            if self.goodbye:
                await send({"type": "websocket.close", "code": 1000})


async def test_the_deadline_closes_with_1012_once_and_the_apps_own_close_goes_nowhere() -> None:
    """1. an accepted session 2. the drain deadline: the client gets 1012 (service restart) 3. the app,
    cancelled, closes the socket itself: the server gets nothing more 4. counted cancelled, once."""
    app = Session()
    mw = make(app)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, ws_scope(), connect, send)
        with anyio.fail_after(10):
            await app.accepted.wait()
        result = await mw.drain.drain(propagation_wait=0, timeout=0.05)
    assert sent == [{"type": "websocket.accept"}, {"type": "websocket.close", "code": 1012, "reason": "server restart"}]
    assert result.truncated == 1
    assert mw.drain.counters()["requests"]["cancelled"] == 1 and mw.drain.in_flight == 0


async def test_a_session_whose_client_is_gone_at_the_deadline_is_still_ended() -> None:
    """The close at the deadline fails (the client has gone): the session still ends, counted cancelled."""
    app = Session()
    mw = make(app)

    async def send(message: Message) -> None:
        if message["type"] == "websocket.close":
            raise OSError("the client has gone")

    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, ws_scope(), connect, send)
        with anyio.fail_after(10):
            await app.accepted.wait()
        result = await mw.drain.drain(propagation_wait=0, timeout=0.05)
    assert result.truncated == 1
    assert mw.drain.counters()["requests"]["cancelled"] == 1 and mw.drain.in_flight == 0


async def test_a_session_the_server_cancels_is_counted_cancelled() -> None:
    """The server cancels a session's task (its own shutdown): the cancellation goes on, counted once."""
    app = Session(goodbye=False)
    mw = make(app)

    async def send(message: Message) -> None:
        pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, ws_scope(), connect, send)
        with anyio.fail_after(10):
            await app.accepted.wait()
        assert mw.drain.in_flight == 1
        tg.cancel_scope.cancel()
    assert mw.drain.counters()["requests"]["cancelled"] == 1 and mw.drain.in_flight == 0
