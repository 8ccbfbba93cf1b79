"""The middleware driven with raw scope/receive/send messages.

httpx.ASGITransport buffers whole bodies, so streaming, disconnects and the exact
moment the count drops can only be seen at this level.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry

from graceful import Drain, GracefulMiddleware, State
from graceful._asgi._types import Message, Receive, Scope, Send
from graceful._drain._state import core

pytestmark = pytest.mark.anyio


def http_scope(path: str = "/v1/completions", *, http_version: str = "1.1", headers: Any = ()) -> Scope:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": http_version,
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": list(headers),
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


class Recorder:
    """A server-side send that records messages and can observe the count at each one."""

    def __init__(self, drain: Drain) -> None:
        self.drain = drain
        self.messages: list[Message] = []
        self.in_flight_at_send: list[int] = []

    async def __call__(self, message: Message) -> None:
        self.in_flight_at_send.append(self.drain.in_flight)
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.messages[0]["headers"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")


def make(app: Callable[[Scope, Receive, Send], Awaitable[None]], **options: Any) -> GracefulMiddleware:
    options.setdefault("registry", CollectorRegistry())
    options.setdefault("admin", False)
    options.setdefault("grace_period", 30)
    options.setdefault("reserve", 5)
    mw = GracefulMiddleware(app, **options)
    mw.drain.mark_serving()
    return mw


class Hang:
    """Awaited by an app: waits until cancelled, and records that it was."""

    cancelled = False

    async def __call__(self) -> None:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise


async def no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def streaming_app(frames: int, *, after_last: Callable[[], Awaitable[None]] | None = None) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(frames):
            await send({"type": "http.response.body", "body": b"data: %d\n\n" % i, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        if after_last is not None:
            await after_last()

    return app


async def test_stream_is_counted_until_its_last_frame_is_handed_to_the_server() -> None:
    done_generating = anyio.Event()
    mw = make(streaming_app(200))
    rec = Recorder(mw.drain)
    await mw(http_scope(), no_body, rec)
    done_generating.set()
    # Every frame, the final one included, reached the server while still counted.
    assert rec.in_flight_at_send == [1] * 202
    assert mw.drain.in_flight == 0
    assert mw.drain.counters()["requests"]["completed"] == 1
    assert rec.body.endswith(b"data: [DONE]\n\n")


async def test_count_drops_right_after_the_final_frame_not_when_the_app_returns() -> None:
    seen: list[int] = []
    mw: GracefulMiddleware

    async def after_last() -> None:  # e.g. a background task after the response
        seen.append(mw.drain.in_flight)

    mw = make(streaming_app(3, after_last=after_last))
    await mw(http_scope(), no_body, Recorder(mw.drain))
    assert seen == [0]


@pytest.mark.parametrize(
    "last",
    [
        {"type": "http.response.pathsend", "path": "/srv/model-card.md"},
        {"type": "http.response.zerocopysend", "file": 3, "more_body": False},
    ],
    ids=["pathsend", "zerocopysend"],
)
async def test_a_response_ended_by_an_extension_message_is_completed(last: Message) -> None:
    """1. the response starts  2. it ends with an extension's last message (Starlette's FileResponse
    sends http.response.pathsend where the server offers it)  3. the count drops once the server
    has it, and the request counts as completed, not as an error when the app returns."""
    seen: list[int] = []
    mw: GracefulMiddleware

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/markdown")]})
        await send(last)
        seen.append(mw.drain.in_flight)

    mw = make(app)
    rec = Recorder(mw.drain)
    await mw(http_scope(), no_body, rec)
    assert rec.messages[-1] is last and rec.in_flight_at_send == [1, 1]
    assert seen == [0]
    assert mw.drain.counters()["requests"]["completed"] == 1 and mw.drain.counters()["requests"]["error"] == 0


async def test_client_disconnect_is_its_own_outcome_and_counted_once() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
        message = await receive()
        assert message["type"] == "http.disconnect"
        # uvicorn's send() returns silently after a disconnect; the app may still send the end.
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def disconnect() -> Message:
        return {"type": "http.disconnect"}

    mw = make(app)
    await mw(http_scope(), disconnect, Recorder(mw.drain))
    counters = mw.drain.counters()["requests"]
    assert counters == {"completed": 0, "client_disconnected": 1, "error": 0, "cancelled": 0, "handed_off": 0}
    assert mw.drain.in_flight == 0


async def test_send_raising_oserror_counts_as_disconnect() -> None:
    mw = make(streaming_app(5))

    async def broken_send(message: Message) -> None:
        if message["type"] == "http.response.body":
            raise OSError("client went away")

    with pytest.raises(OSError):
        await mw(http_scope(), no_body, broken_send)
    assert mw.drain.counters()["requests"]["client_disconnected"] == 1
    assert mw.drain.in_flight == 0


async def test_app_exception_is_counted_and_reraised() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("model crashed")

    mw = make(app)
    with pytest.raises(RuntimeError, match="model crashed"):
        await mw(http_scope(), no_body, Recorder(mw.drain))
    assert mw.drain.counters()["requests"]["error"] == 1
    assert mw.drain.in_flight == 0


async def test_app_returning_without_finishing_is_an_error() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})

    mw = make(app)
    await mw(http_scope(), no_body, Recorder(mw.drain))
    assert mw.drain.counters()["requests"]["error"] == 1


async def test_cancelled_task_is_counted_as_cancelled() -> None:
    started = anyio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        started.set()
        await anyio.sleep_forever()

    mw = make(app)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope(), no_body, Recorder(mw.drain))
        await started.wait()
        assert mw.drain.in_flight == 1
        tg.cancel_scope.cancel()
    assert mw.drain.counters()["requests"]["cancelled"] == 1
    assert mw.drain.in_flight == 0


async def test_draining_refuses_new_work_before_the_app_sees_it() -> None:
    called = False

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal called
        called = True  # pragma: no cover

    mw = make(app, retry_after=3, request_id_header="x-request-id")
    mw.drain.begin_drain("test")
    rec = Recorder(mw.drain)
    await mw(http_scope(headers=[(b"x-request-id", b"req-7")]), no_body, rec)
    assert not called
    assert rec.status == 503
    headers = rec.headers
    assert headers[b"retry-after"] == b"3"
    assert headers[b"connection"] == b"close"
    assert headers[b"x-graceful-not-started"] == b"1"
    assert headers[b"x-request-id"] == b"req-7"
    error = json.loads(rec.body)["error"]
    assert error["type"] == "server_draining" and error["code"] == 503 and error["message"]
    assert mw.drain.counters()["rejected"] == {"server_draining": 1}
    assert mw.drain.in_flight == 0


@pytest.mark.parametrize(("state", "kind"), [(State.STARTING, "server_starting"), (State.STOPPED, "server_stopped")])
async def test_refusal_names_the_state(state: State, kind: str) -> None:
    # STARTING refuses while the app is not ready yet (ready_on_startup=False), STOPPED after a drain:
    # without a lifespan, either would otherwise serve (tests/asgi/test_dropin.py).
    mw = GracefulMiddleware(streaming_app(1), registry=CollectorRegistry(), admin=False, ready_on_startup=False)
    if state is State.STOPPED:
        mw.drain.mark_serving()
        mw.drain.begin_drain("test")
        mw.drain.mark_stopped()
    rec = Recorder(mw.drain)
    await mw(http_scope(), no_body, rec)
    assert json.loads(rec.body)["error"]["type"] == kind


async def test_no_connection_close_on_http2() -> None:
    mw = make(streaming_app(1))
    mw.drain.begin_drain("test")
    rec = Recorder(mw.drain)
    await mw(http_scope(http_version="2"), no_body, rec)
    assert rec.status == 503
    assert b"connection" not in rec.headers


async def test_responses_that_start_after_the_drain_carry_connection_close() -> None:
    gate = anyio.Event()
    mw: GracefulMiddleware

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    mw = make(app)
    http1, http2 = Recorder(mw.drain), Recorder(mw.drain)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope(), no_body, http1)
        tg.start_soon(mw, http_scope(http_version="2"), no_body, http2)
        await anyio.wait_all_tasks_blocked()
        mw.drain.begin_drain("test")
        gate.set()
    assert http1.status == 200 and http1.headers[b"connection"] == b"close"
    assert http2.status == 200 and b"connection" not in http2.headers


async def test_serving_responses_keep_alive_and_pass_through_untouched() -> None:
    """By default (no request-id echo) a serving response's start message is the app's own object."""
    shared = [(b"content-type", b"text/plain")]
    seen: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        start = {"type": "http.response.start", "status": 200, "headers": shared}
        seen.append(start)
        await send(start)
        await send({"type": "http.response.body", "body": b"ok"})

    mw = make(app)
    rec = Recorder(mw.drain)
    sent: list[Message] = []

    async def spy(message: Message) -> None:
        sent.append(message)
        await rec(message)

    await mw(http_scope(), no_body, spy)
    assert b"connection" not in rec.headers and b"x-request-id" not in rec.headers
    assert sent[0] is seen[0] and sent[0]["headers"] is shared


async def test_request_id_echo_generates_one_per_response_without_touching_the_apps_list() -> None:
    shared = [(b"content-type", b"text/plain")]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": shared})
        await send({"type": "http.response.body", "body": b"ok"})

    mw = make(app, request_id_header="X-Request-ID")
    rec, rec2, echoed = Recorder(mw.drain), Recorder(mw.drain), Recorder(mw.drain)
    await mw(http_scope(), no_body, rec)
    await mw(http_scope(), no_body, rec2)
    await mw(http_scope(headers=[(b"x-request-id", b"mine")]), no_body, echoed)
    generated = rec.headers[b"x-request-id"]
    assert generated and rec2.headers[b"x-request-id"] != generated
    assert echoed.headers[b"x-request-id"] == b"mine"
    assert shared == [(b"content-type", b"text/plain")], "the app's own header list is never changed"


async def test_app_headers_are_not_mutated() -> None:
    shared = [(b"content-type", b"text/plain")]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": shared})
        await send({"type": "http.response.body", "body": b"ok"})

    mw = make(app, admit_during_propagation=True)
    mw.drain.begin_drain("x", propagation_wait=20)
    await mw(http_scope(), no_body, Recorder(mw.drain))
    assert shared == [(b"content-type", b"text/plain")]


async def test_admit_during_propagation_admits_until_the_window_ends() -> None:
    mw = make(streaming_app(1), admit_during_propagation=True)
    mw.drain.begin_drain("test", propagation_wait=20)
    rec = Recorder(mw.drain)
    await mw(http_scope(), no_body, rec)
    assert rec.status == 200 and rec.headers[b"connection"] == b"close"

    closed = make(streaming_app(1), admit_during_propagation=True)
    closed.drain.begin_drain("test", propagation_wait=0)
    rec = Recorder(closed.drain)
    await closed(http_scope(), no_body, rec)
    assert rec.status == 503


async def test_pinned_connection_is_served_once_after_the_window() -> None:
    mw = make(streaming_app(1), admit_during_propagation=True)
    core(mw.drain).set_launcher("a test", lambda: {("127.0.0.1", 50000)})  # its open connection, pinned
    mw.drain.begin_drain("test", propagation_wait=0)
    first, second = Recorder(mw.drain), Recorder(mw.drain)
    await mw(http_scope(), no_body, first)
    await mw(http_scope(), no_body, second)
    assert first.status == 200 and first.headers[b"connection"] == b"close"
    assert second.status == 503


async def test_a_connection_busy_at_the_drain_start_is_pinned_by_the_middleware_alone() -> None:
    """Inside a server graceful does not launch (vLLM), nobody pins connections for it:
    1. a stream is in flight on peer A when the drain begins (propagation wait 0)
    2. after the wait, A's next request is served once, with Connection: close; A's third is refused
    3. peer B, idle at the drain's start, is refused: the middleware cannot see idle connections"""
    gate = anyio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        if scope["path"] == "/stream":
            await gate.wait()
        await send({"type": "http.response.body", "body": b"ok"})

    mw = make(app, admit_during_propagation=True)
    a, b = ("10.0.0.1", 40000), ["10.0.0.2", 40001]  # a server may give the address as a list
    streaming = Recorder(mw.drain)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, {**http_scope("/stream"), "client": a}, no_body, streaming)
        await anyio.wait_all_tasks_blocked()
        mw.drain.begin_drain("preStop", propagation_wait=0)
        gate.set()
    replies = [Recorder(mw.drain) for _ in range(3)]
    for reply, peer in zip(replies, (a, a, b)):
        await mw({**http_scope(), "client": peer}, no_body, reply)
    assert replies[0].status == 200 and replies[0].headers[b"connection"] == b"close"
    assert [reply.status for reply in replies[1:]] == [503, 503]


async def test_probes_are_answered_without_the_app_and_never_counted() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("probes must not reach the app")  # pragma: no cover

    healthy = True
    mw = GracefulMiddleware(
        app, registry=CollectorRegistry(), admin=False, live_check=lambda: healthy, ready_on_startup=False
    )

    async def probe(path: str) -> int:
        rec = Recorder(mw.drain)
        await mw(http_scope(path), no_body, rec)
        assert rec.in_flight_at_send == [0, 0]
        body = json.loads(rec.body)
        assert body["state"] == mw.drain.state.value
        return rec.status

    assert (await probe("/startup"), await probe("/ready"), await probe("/live")) == (503, 503, 200)
    mw.drain.mark_serving()
    assert (await probe("/startup"), await probe("/ready"), await probe("/live")) == (200, 200, 200)
    mw.drain.begin_drain("test")
    assert (await probe("/startup"), await probe("/ready"), await probe("/live")) == (200, 503, 200)
    healthy = False
    assert await probe("/live") == 503
    assert mw.drain.counters()["rejected"] == {}


async def test_live_check_that_raises_reports_not_live() -> None:
    def broken() -> bool:
        raise RuntimeError("no")

    mw = make(streaming_app(1), live_check=broken)
    rec = Recorder(mw.drain)
    await mw(http_scope("/live"), no_body, rec)
    assert rec.status == 503


async def test_probe_paths_are_configurable() -> None:
    mw = make(streaming_app(1), ready_path="/healthz/ready")
    mw.drain.begin_drain("x")
    rec = Recorder(mw.drain)
    await mw(http_scope("/healthz/ready"), no_body, rec)
    assert rec.status == 503 and json.loads(rec.body)["state"] == "DRAINING"


async def test_exempt_paths_pass_through_uncounted_and_unrefused() -> None:
    seen: list[int] = []
    mw: GracefulMiddleware

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(mw.drain.in_flight)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"metrics"})

    mw = make(app, exempt_paths=["/metrics"])
    mw.drain.begin_drain("x")
    rec = Recorder(mw.drain)
    await mw(http_scope("/metrics"), no_body, rec)
    assert rec.status == 200 and seen == [0]
    assert mw.drain.counters()["requests"]["completed"] == 0


async def test_max_in_flight_fails_readiness_and_reject_over_refuses() -> None:
    gate = anyio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    mw = make(app, max_in_flight=1, reject_over=2)

    async def ready() -> int:
        rec = Recorder(mw.drain)
        await mw(http_scope("/ready"), no_body, rec)
        return rec.status

    assert await ready() == 200
    over = Recorder(mw.drain)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope(), no_body, Recorder(mw.drain))
        await anyio.wait_all_tasks_blocked()
        assert await ready() == 503
        tg.start_soon(mw, http_scope(), no_body, Recorder(mw.drain))
        await anyio.wait_all_tasks_blocked()
        await mw(http_scope(), no_body, over)
        gate.set()
    assert over.status == 503 and json.loads(over.body)["error"]["type"] == "server_overloaded"
    assert await ready() == 200


async def test_deadline_ends_sse_with_a_final_retryable_frame_and_cancels_the_app() -> None:
    sent_after_deadline = False
    app_cancelled = anyio.Event()
    mw: GracefulMiddleware

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal sent_after_deadline
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        try:
            while True:
                await send({"type": "http.response.body", "body": b"data: tok\n\n", "more_body": True})
                if mw.drain.state is State.DRAINING and mw.drain.last_result is not None:
                    sent_after_deadline = True  # pragma: no cover
                await anyio.sleep(0.01)
        except asyncio.CancelledError:
            app_cancelled.set()
            raise

    mw = make(app)
    rec = Recorder(mw.drain)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope(), no_body, rec)
        await anyio.wait_all_tasks_blocked()
        result = await mw.drain.drain(timeout=0.1)
    assert app_cancelled.is_set()
    assert not sent_after_deadline
    assert result.result == "timeout" and result.truncated == 1 and result.in_flight == 1
    bodies = [m for m in rec.messages if m["type"] == "http.response.body"]
    final_event, end = bodies[-2], bodies[-1]
    assert end == {"type": "http.response.body", "body": b"", "more_body": False}
    assert final_event["body"].startswith(b"data: ") and final_event["body"].endswith(b"\n\n")
    error = json.loads(final_event["body"][len(b"data: ") :])["error"]
    assert error == {"type": "server_shutdown", "message": error["message"], "retryable": True, "code": 503}
    assert all(m["body"] == b"data: tok\n\n" for m in bodies[:-2])
    assert mw.drain.counters()["truncated"] == {"deadline": 1}
    assert mw.drain.counters()["requests"]["cancelled"] == 1
    assert mw.drain.in_flight == 0


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_deadline_before_headers_answers_503_shutdown(anyio_backend: str) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await anyio.sleep_forever()

    mw = make(app)
    rec = Recorder(mw.drain)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope(), no_body, rec)
        await anyio.wait_all_tasks_blocked()
        await mw.drain.drain(timeout=0.05)
    assert rec.status == 503
    assert json.loads(rec.body)["error"]["type"] == "server_shutdown"
    assert b"x-graceful-not-started" not in rec.headers  # it did start


async def test_deadline_ends_ndjson_with_an_error_line_and_plain_bodies_without_a_frame() -> None:
    def app_for(content_type: bytes) -> Any:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]})
            await send({"type": "http.response.body", "body": b"{}\n", "more_body": True})
            await anyio.sleep_forever()

        return app

    for content_type, expect_frame in ((b"application/x-ndjson", True), (b"application/json", False)):
        mw = make(app_for(content_type))
        rec = Recorder(mw.drain)
        async with anyio.create_task_group() as tg:
            tg.start_soon(mw, http_scope(), no_body, rec)
            await anyio.wait_all_tasks_blocked()
            await mw.drain.drain(timeout=0.05)
        bodies = [m["body"] for m in rec.messages if m["type"] == "http.response.body"]
        if expect_frame:
            assert json.loads(bodies[-2])["error"]["type"] == "server_shutdown"
            assert bodies[-1] == b""
        else:
            assert bodies == [b"{}\n"]
        assert mw.drain.in_flight == 0


async def test_custom_final_frame() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await anyio.sleep_forever()

    mw = make(app, final_frame=lambda content_type: b"event: bye\ndata: {}\n\n")
    rec = Recorder(mw.drain)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope(), no_body, rec)
        await anyio.wait_all_tasks_blocked()
        await mw.drain.drain(timeout=0.05)
    assert rec.messages[1]["body"] == b"event: bye\ndata: {}\n\n"


def test_unknown_option_is_refused_clearly() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:  # pragma: no cover
        pass

    with pytest.raises(TypeError, match="propagation_delay"):
        GracefulMiddleware(app, propagation_delay=3, registry=CollectorRegistry())
    with pytest.raises(TypeError, match="Drain"):
        GracefulMiddleware(app, Drain(), grace_period=10, registry=CollectorRegistry())
    with pytest.raises(ValueError, match="max_in_flight: 0 "):
        GracefulMiddleware(app, max_in_flight=0, registry=CollectorRegistry())
    with pytest.raises(ValueError, match="retry_after"):
        GracefulMiddleware(app, retry_after=-1, registry=CollectorRegistry())


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_deadline_on_trio_uses_a_cancel_scope(anyio_backend: str) -> None:
    hang = Hang()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await hang()

    mw = make(app)
    rec = Recorder(mw.drain)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope(), no_body, rec)
        await anyio.wait_all_tasks_blocked()
        result = await mw.drain.drain(timeout=0.05)
    assert hang.cancelled and result.truncated == 1
    assert json.loads(rec.messages[1]["body"][len(b"data: ") :])["error"]["type"] == "server_shutdown"
    assert rec.messages[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert mw.drain.in_flight == 0


def test_a_later_event_loop_is_still_cut_at_the_deadline() -> None:
    """1. a request served on one event loop  2. the same middleware on a second loop (a test
    client made twice, a server run twice in one process)  3. a request there that never ends
    is still cut at the deadline: a 503 before its response starts, its task cancelled."""
    hang = Hang()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/quick":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        await hang()

    mw = make(app)
    quick = Recorder(mw.drain)
    asyncio.run(mw(http_scope("/quick"), no_body, quick))
    assert quick.status == 200 and mw.drain.in_flight == 0

    async def second_loop() -> Recorder:
        rec = Recorder(mw.drain)
        with anyio.fail_after(10):  # the request not cancelled would hold the task group open
            async with anyio.create_task_group() as tg:
                tg.start_soon(mw, http_scope(), no_body, rec)
                await anyio.wait_all_tasks_blocked()
                result = await mw.drain.drain(timeout=0.05)
        assert result.truncated == 1
        return rec

    rec = asyncio.run(second_loop())
    assert hang.cancelled and rec.status == 503 and json.loads(rec.body)["error"]["type"] == "server_shutdown"
    assert mw.drain.in_flight == 0


async def test_request_id_echo_can_be_turned_off() -> None:
    mw = make(streaming_app(1), request_id_header=None)
    ok, refused = Recorder(mw.drain), Recorder(mw.drain)
    await mw(http_scope(headers=[(b"x-request-id", b"r1")]), no_body, ok)
    mw.drain.begin_drain("test")
    await mw(http_scope(headers=[(b"x-request-id", b"r1")]), no_body, refused)
    assert b"x-request-id" not in ok.headers and b"x-request-id" not in refused.headers


async def test_other_scope_types_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    mw = make(app)
    await mw({"type": "custom.protocol"}, no_body, Recorder(mw.drain))
    assert seen == ["custom.protocol"] and mw.drain.in_flight == 0


async def test_deadline_with_a_departed_client_still_cancels_and_counts() -> None:
    cancelled = anyio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()

    started = False

    async def gone_after_headers(message: Message) -> None:
        nonlocal started
        if started:
            raise OSError("client went away")
        started = True

    mw = make(app)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope(), no_body, gone_after_headers)
        await anyio.wait_all_tasks_blocked()
        result = await mw.drain.drain(timeout=0.05)
    assert cancelled.is_set() and result.truncated == 1
    assert mw.drain.counters()["requests"]["cancelled"] == 1 and mw.drain.in_flight == 0


async def test_deadline_before_headers_on_http2_sends_no_connection_header() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await anyio.sleep_forever()

    mw = make(app)
    rec = Recorder(mw.drain)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope(http_version="2"), no_body, rec)
        await anyio.wait_all_tasks_blocked()
        await mw.drain.drain(timeout=0.05)
    assert rec.status == 503 and b"connection" not in rec.headers


async def test_deadline_on_a_response_without_content_type_sends_no_frame() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        await anyio.sleep_forever()

    mw = make(app)
    rec = Recorder(mw.drain)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope(), no_body, rec)
        await anyio.wait_all_tasks_blocked()
        await mw.drain.drain(timeout=0.05)
    assert [m.get("body") for m in rec.messages[1:]] == [b"partial"]
    assert mw.drain.counters()["truncated"] == {"deadline": 1}


async def test_work_admitted_after_the_drain_ended_is_waited_for_within_the_same_deadline() -> None:
    """
    1. the preStop drain ends "drained" (nothing in flight)
    2. a pinned connection brings its one more request (served, with Connection: close)
    3. SIGTERM's drain call joins: it waits for that request instead of returning at once
    4. the request ends; the join returns drained, and only one drain is counted
    """
    gate = anyio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await gate.wait()
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    mw = make(app, admit_during_propagation=True)
    core(mw.drain).set_launcher("a test", lambda: {("127.0.0.1", 50000)})  # its open connection, pinned
    first = await mw.drain.drain(propagation_wait=0, timeout=10)
    assert first.drained
    rec = Recorder(mw.drain)
    results: list[object] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope(), no_body, rec)
        await anyio.wait_all_tasks_blocked()
        assert mw.drain.in_flight == 1

        async def sigterm() -> None:
            results.append(await mw.drain.drain(reason="SIGTERM"))

        tg.start_soon(sigterm)
        await anyio.wait_all_tasks_blocked()
        assert results == []  # still waiting for the pinned request
        gate.set()
    [joined] = results
    assert getattr(joined, "result") == "drained"
    assert rec.headers[b"connection"] == b"close" and rec.body.endswith(b"[DONE]\n\n")
    assert mw.drain.counters()["drains"] == {"drained": 1}


async def test_work_admitted_after_the_drain_ended_meets_the_original_deadline() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await anyio.sleep_forever()

    mw = make(app, admit_during_propagation=True)
    core(mw.drain).set_launcher("a test", lambda: {("127.0.0.1", 50000), ("127.0.0.1", 50001)})
    assert (await mw.drain.drain(propagation_wait=0, timeout=0.3)).drained
    rec = Recorder(mw.drain)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope(), no_body, rec)
        await anyio.wait_all_tasks_blocked()
        with anyio.fail_after(5):
            joined = await mw.drain.drain(reason="SIGTERM")
    assert joined.result == "timeout" and joined.truncated == 1
    assert json.loads(rec.messages[1]["body"][len(b"data: ") :])["error"]["type"] == "server_shutdown"
    # After the deadline a pinned connection is refused like any other.
    late = Recorder(mw.drain)
    await mw({**http_scope(), "client": ("127.0.0.1", 50001)}, no_body, late)
    assert late.status == 503


@pytest.mark.parametrize("admit", [True, False])
async def test_ready_fails_at_once_in_both_modes(admit: bool) -> None:
    """Readiness fails the instant the drain begins; only new requests differ between the modes."""
    mw = make(streaming_app(1), admit_during_propagation=admit)
    mw.drain.begin_drain("test", propagation_wait=20)
    ready = Recorder(mw.drain)
    await mw(http_scope("/ready"), no_body, ready)
    assert ready.status == 503
    request = Recorder(mw.drain)
    await mw(http_scope(), no_body, request)
    if admit:
        assert request.status == 200 and request.headers[b"connection"] == b"close"
    else:
        assert request.status == 503 and request.headers[b"x-graceful-not-started"] == b"1"


def refusing() -> GracefulMiddleware:
    mw = make(streaming_app(1), admit_during_propagation=False)
    mw.drain.begin_drain("test", propagation_wait=20)
    return mw


async def test_refusal_reads_the_body_before_closing() -> None:
    """The body is read and dropped first, so Connection: close never meets unread bytes."""
    chunks = [b"a" * 1000, b"b" * 1000, b""]
    received: list[Message] = []

    async def receive() -> Message:
        message = {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}
        received.append(message)
        return message

    mw = refusing()
    rec = Recorder(mw.drain)
    await mw(http_scope(headers=[(b"content-length", b"2000")]), receive, rec)
    assert len(received) == 3 and not received[-1]["more_body"]
    assert rec.status == 503 and rec.headers[b"connection"] == b"close"


async def test_refusal_past_the_cap_or_the_time_limit_keeps_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the cap (announced or streamed) or too slow: answer without Connection: close, at once."""
    from graceful._asgi import _refusal

    async def never(*_: object) -> Message:
        raise AssertionError("a body announced over the cap must not be read")

    mw = refusing()
    rec = Recorder(mw.drain)
    too_big = str(_refusal.REFUSAL_BODY_LIMIT + 1).encode()
    await mw(http_scope(headers=[(b"content-length", too_big)]), never, rec)
    assert rec.status == 503 and b"connection" not in rec.headers

    reads = 0

    async def endless() -> Message:  # chunked, no length: stops once past the cap
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": b"c" * 65536, "more_body": True}

    mw = refusing()
    rec = Recorder(mw.drain)
    await mw(http_scope(), endless, rec)
    assert rec.status == 503 and b"connection" not in rec.headers
    assert reads == _refusal.REFUSAL_BODY_LIMIT // 65536 + 1

    monkeypatch.setattr(_refusal, "REFUSAL_BODY_TIMEOUT", 0.05)
    first = True

    async def stalls() -> Message:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": b"d", "more_body": True}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    mw = refusing()
    rec = Recorder(mw.drain)
    with anyio.fail_after(5):  # 100 x the bound: only a hang fails this
        await mw(http_scope(headers=[(b"content-length", b"10")]), stalls, rec)
    assert rec.status == 503 and b"connection" not in rec.headers
    assert rec.headers[b"x-graceful-not-started"] == b"1" and rec.headers[b"retry-after"] == b"1"
