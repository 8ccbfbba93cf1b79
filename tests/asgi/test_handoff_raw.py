"""Early handoff driven with raw ASGI messages (docs/resume.md, "Early handoff (`handoff_streams`)").

Once the propagation wait has passed, every in-flight SSE stream whose request carried
``x-graceful-resumable: 1`` gets the final event at once; a marked request admitted earlier whose
response starts after that moment gets its start and then the final event; streams of other clients
and responses that are not event streams are waited for as before.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry

from graceful import GracefulMiddleware
from graceful._asgi._types import Message, Receive, Scope, Send

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

RESUMABLE = (b"x-graceful-resumable", b"1")


class Exchange:
    """One request from a client that stays connected: what the server was sent, and when it ended."""

    def __init__(self, path: str, *, port: int, marked: bool) -> None:
        self.scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "headers": [RESUMABLE] if marked else [],
            "client": ("127.0.0.1", port),
            "server": ("127.0.0.1", 8000),
        }
        self.sent: list[Message] = []
        self.ended = anyio.Event()
        self.asked = False

    async def receive(self) -> Message:
        if not self.asked:
            self.asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await anyio.Event().wait()  # the client stays
        raise AssertionError("unreachable")

    async def send(self, message: Message) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.ended.set()

    async def run(self, mw: GracefulMiddleware) -> None:
        await mw(self.scope, self.receive, self.send)

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])


class App:
    """Streams until released; ``/queued`` starts its response only once released."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.started: dict[str, anyio.Event] = {}

    def admitted(self, path: str) -> anyio.Event:
        return self.started.setdefault(path, anyio.Event())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        kind = b"application/json" if path == "/json" else b"text/event-stream"
        if path == "/queued":
            self.admitted(path).set()
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        self.admitted(path).set()
        await self.release.wait()
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def final_event(body: bytes) -> dict[str, Any]:
    last = body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b"data: "), body
    return dict(json.loads(last.removeprefix(b"data: "))["error"])


async def test_a_queued_marked_stream_gets_its_start_then_the_final_event_and_the_rest_are_waited_for() -> None:
    """1. four requests admitted: a marked stream, a marked request still queued, an unmarked stream, a
    marked JSON response 2. the drain: its propagation wait (0) passes 3. the marked stream gets the final
    event at once 4. the queued one starts: its start, then the final event 5. the unmarked stream and the
    JSON response run to their end 6. the drain reports 2 handed off."""
    app = App()
    mw = GracefulMiddleware(
        app, registry=CollectorRegistry(), admin=False, handoff_streams=True, grace_period=30, reserve=5
    )
    mw.drain.mark_serving()
    marked = Exchange("/v1/stream", port=1, marked=True)
    queued = Exchange("/queued", port=2, marked=True)
    unmarked = Exchange("/v1/stream-b", port=3, marked=False)
    plain = Exchange("/json", port=4, marked=True)
    async with anyio.create_task_group() as tg:
        for exchange in (marked, queued, unmarked, plain):
            tg.start_soon(exchange.run, mw)
        with anyio.fail_after(10):
            for path in ("/v1/stream", "/queued", "/v1/stream-b", "/json"):
                await app.admitted(path).wait()
        result: list[Any] = []

        async def drain() -> None:
            result.append(await mw.drain.drain(propagation_wait=0))

        tg.start_soon(drain)
        with anyio.fail_after(10):
            await marked.ended.wait()
        assert final_event(marked.body)["resumable"] is True
        assert not unmarked.ended.is_set() and not plain.ended.is_set()
        app.release.set()
        with anyio.fail_after(10):
            for exchange in (queued, unmarked, plain):
                await exchange.ended.wait()
    assert queued.status == 200
    assert queued.body.startswith(b"data: ") and b"data: 1" not in queued.body  # its start, then the final event
    assert final_event(queued.body)["resumable"] is True
    assert unmarked.body == plain.body == b"data: 1\n\ndata: [DONE]\n\n"
    (done,) = result
    assert done.drained and done.handed_off == 2
    counted = {outcome: n for outcome, n in mw.drain.counters()["requests"].items() if n}
    assert counted == {"completed": 2, "handed_off": 2}


async def test_after_the_handoff_a_new_marked_request_is_refused_and_an_unmarked_one_is_not() -> None:
    """A marked request that reaches the replica after the handoff began (on a connection pinned at the
    drain's start) is refused with the not-started 503; an unmarked one on such a connection is served."""
    app = App()
    mw = GracefulMiddleware(
        app, registry=CollectorRegistry(), admin=False, handoff_streams=True, grace_period=30, reserve=5
    )
    mw.drain.mark_serving()
    first = Exchange("/v1/stream", port=1, marked=True)
    other = Exchange("/v1/stream-b", port=2, marked=False)
    async with anyio.create_task_group() as tg:
        tg.start_soon(first.run, mw)
        tg.start_soon(other.run, mw)
        with anyio.fail_after(10):
            await app.admitted("/v1/stream").wait()
            await app.admitted("/v1/stream-b").wait()
        tg.start_soon(mw.drain.drain)  # propagation_wait=0 (the default without a budget that needs one)
        with anyio.fail_after(10):
            await first.ended.wait()
        again = Exchange("/v1/stream", port=1, marked=True)
        await again.run(mw)
        assert again.status == 503
        assert json.loads(again.body)["error"]["type"] == "server_draining"
        app.release.set()
