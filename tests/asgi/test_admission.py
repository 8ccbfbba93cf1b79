"""admission="fits" (issue 54): during a drain, a request that cannot finish before the deadline gets the
not-started 503 before the app sees it; one that can is handed to the app with its body as the client sent
it; a SERVING request is never read. Raw scope/receive/send messages, as in test_middleware_raw.py."""

from __future__ import annotations

import json
import logging
import types
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import graceful._asgi._admission as admission
from graceful import GracefulMiddleware
from graceful._asgi._admission import BODY_LIMIT, FRAMES, Sampler
from graceful._asgi._http import FrameClock
from graceful._asgi._types import Message, Receive, Scope, Send
from graceful._drain._observed import BOUNDS, PLAIN, STREAM
from graceful._drain._state import core
from tests.asgi.test_middleware_raw import Recorder, http_scope

pytestmark = pytest.mark.anyio

RESUMABLE = (b"x-graceful-resumable", b"1")


class Echo:
    """An app that reads the whole body, keeps every message it received, and answers with the body."""

    def __init__(self) -> None:
        self.received: list[Message] = []
        self.called = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.called = True
        more = True
        while more:
            message = await receive()
            self.received.append(message)
            more = message["type"] == "http.request" and message.get("more_body", False)
        body = b"".join(m.get("body", b"") for m in self.received)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


class Client:
    """The server's receive: ``messages`` in order, then a disconnect; counts the calls."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = list(messages)
        self.calls = 0

    async def __call__(self) -> Message:
        self.calls += 1
        if self.messages:
            return self.messages.pop(0)
        return {"type": "http.disconnect"}


def body_messages(body: bytes, parts: int = 3) -> list[Message]:
    """``body`` as a client's server hands it over: in ``parts`` chunks, the last with more_body False."""
    size = -(-len(body) // parts)
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    return [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1} for i, chunk in enumerate(chunks)]


def completion(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}).encode()


def draining(
    app: Any, *, seen: Callable[[GracefulMiddleware], None] | None = None, **options: Any
) -> GracefulMiddleware:
    """A middleware in its propagation wait (20 s) with 25 s to its deadline (grace 30 s, reserve 5 s),
    having seen streams at 0.1 s a token, 0.5 s to the first."""
    options.setdefault("admission", "fits")
    mw = GracefulMiddleware(app, registry=CollectorRegistry(), admin=False, grace_period=30, reserve=5, **options)
    mw.drain.mark_serving()
    pace = core(mw.drain).tally.pace
    if seen is None:
        pace.record(0.5, 0.1)
    else:
        seen(mw)
    mw.drain.begin_drain("test", propagation_wait=20)
    return mw


async def send_one(mw: GracefulMiddleware, body: bytes, *, headers: Any = ()) -> tuple[Recorder, Client]:
    client = Client(body_messages(body))
    head = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), *headers]
    recorder = Recorder(mw.drain)
    await mw(http_scope(headers=head), client, recorder)
    return recorder, client


async def test_a_request_that_cannot_finish_is_refused_before_the_app_sees_it() -> None:
    """1. the drain begins with 25 s to its deadline 2. a completion of max_tokens 1000 (0.1 s each) arrives
    3. it gets the not-started 503, as every refusal, counted as would_not_finish; the app never ran."""
    app = Echo()
    mw = draining(app)
    recorder, client = await send_one(mw, completion(max_tokens=1000, stream=True))
    assert not app.called
    assert recorder.status == 503
    assert recorder.headers[b"x-graceful-not-started"] == b"1"
    assert recorder.headers[b"retry-after"] == b"%d" % mw.options.retry_after
    assert json.loads(recorder.body)["error"]["type"] == "would_not_finish"
    assert mw.drain.counters()["rejected"] == {"would_not_finish": 1}
    assert client.calls == 3  # the body was read whole: closing the connection after it is safe
    page = generate_latest(mw.registry).decode()
    assert 'graceful_rejected_total{reason="would_not_finish"} 1.0' in page


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens", "max_output_tokens"])
async def test_a_request_that_fits_reaches_the_app_with_the_bytes_the_client_sent(key: str) -> None:
    app = Echo()
    mw = draining(app)
    body = completion(**{key: 100})  # 0.5 + 101 x 0.1 = 10.6 s of the 25 s left
    recorder, _ = await send_one(mw, body)
    assert app.called and recorder.status == 200
    assert app.received == body_messages(body)  # the same messages, in the same chunks
    assert recorder.body == body
    # The same body with ten times the limit does not fit.
    refused, _ = await send_one(mw, completion(**{key: 1000}))
    assert refused.status == 503


async def test_admission_all_admits_what_would_not_finish() -> None:
    app = Echo()
    mw = draining(app, admission="all")
    recorder, client = await send_one(mw, completion(max_tokens=1000))
    assert app.called and recorder.status == 200
    assert mw.drain.counters()["rejected"] == {}


async def test_with_nothing_seen_every_request_is_admitted() -> None:
    app = Echo()
    mw = draining(app, seen=lambda mw: None)
    recorder, _ = await send_one(mw, completion(max_tokens=100_000))
    assert app.called and recorder.status == 200


def durations(mw: GracefulMiddleware) -> None:
    """Ten streams of up to 40 s and 190 plain requests of up to 1 s seen; no stream's pace."""
    counts = core(mw.drain).tally.histograms.counts
    counts[STREAM][BOUNDS.index(40.0)] = 10
    counts[PLAIN][BOUNDS.index(1.0)] = 190


async def test_without_a_limit_the_durations_of_its_kind_decide() -> None:
    app = Echo()
    mw = draining(app, seen=durations)
    # A stream is judged by the streams seen (p95 40 s > 25 s left), a plain request by the plain ones.
    assert (await send_one(mw, completion(stream=True)))[0].status == 503
    assert (await send_one(mw, completion(stream=False)))[0].status == 200
    # A limit without a pace seen: the durations of its kind still decide.
    assert (await send_one(mw, completion(stream=True, max_tokens=5)))[0].status == 503
    # A body that is not JSON is judged by everything seen (p95 1 s).
    assert (await send_one(mw, b"not json at all"))[0].status == 200
    assert mw.drain.counters()["rejected"] == {"would_not_finish": 2}


async def test_a_resumable_stream_must_finish_before_its_handoff() -> None:
    """With handoff_streams, a resumable stream is ended when the propagation wait ends (20 s): 22 s of
    tokens fit the deadline (25 s) but not the handoff."""
    app = Echo()
    mw = draining(app, handoff_streams=True)
    body = completion(max_tokens=210, stream=True)
    assert (await send_one(mw, body, headers=[RESUMABLE]))[0].status == 503
    assert (await send_one(mw, body))[0].status == 200
    assert (await send_one(mw, completion(max_tokens=150, stream=True), headers=[RESUMABLE]))[0].status == 200


async def test_a_serving_request_is_not_read_by_the_middleware() -> None:
    calls_at_entry: list[int] = []
    client = Client(body_messages(completion(max_tokens=10**6)))

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        calls_at_entry.append(client.calls)
        await Echo()(scope, receive, send)

    mw = GracefulMiddleware(app, registry=CollectorRegistry(), admin=False, admission="fits")
    mw.drain.mark_serving()
    core(mw.drain).tally.pace.record(0.5, 0.1)
    recorder = Recorder(mw.drain)
    await mw(http_scope(), client, recorder)
    assert calls_at_entry == [0] and recorder.status == 200


async def test_a_body_over_the_limit_is_left_to_the_app() -> None:
    app = Echo()
    mw = draining(app, seen=durations)
    body = b" " * (BODY_LIMIT + 1)
    recorder, client = await send_one(mw, body)
    # Not read (judged by everything seen, p95 1 s): every message reached the app from the server.
    assert recorder.status == 200 and len(app.received) == 3 and len(recorder.body) == len(body)


async def test_a_slow_body_is_judged_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "BODY_TIMEOUT", 0.05)
    first = {"type": "http.request", "body": b'{"max_tokens": 100', "more_body": True}
    rest = {"type": "http.request", "body": b"0}", "more_body": False}
    arrived = anyio.Event()
    given: list[Message] = []

    async def slow() -> Message:
        if not given:
            given.append(first)
            return first
        await arrived.wait()  # the rest comes after the middleware has stopped waiting
        given.append(rest)
        return rest

    app = Echo()
    mw = draining(app, seen=durations)
    recorder = Recorder(mw.drain)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope(), slow, recorder)
        with anyio.fail_after(5):
            while not app.called:
                await anyio.sleep(0.01)
        arrived.set()
    # Judged by everything seen (admitted); the app got the chunk read and then the rest.
    assert recorder.status == 200 and app.received == [first, rest]


async def test_the_summary_line_counts_the_refusals(caplog: pytest.LogCaptureFixture) -> None:
    app = Echo()
    mw = draining(app)
    await send_one(mw, completion(max_tokens=1000))
    caplog.set_level(logging.INFO, logger="graceful")
    mw.drain.resume()
    mw.drain.begin_drain("again", propagation_wait=0)
    with anyio.fail_after(10):
        await mw.drain.drain()
    assert "rejected=1 would_not_finish=1" in caplog.text


def frames_app(count: int, sent: list[int], go: anyio.Event) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await go.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(count):
            await send({"type": "http.response.body", "body": b"data: %d\n\n" % i, "more_body": True})
            sent.append(i)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


async def test_the_sampler_times_one_new_stream_for_a_few_frames_then_pauses() -> None:
    """1. a stream is admitted 2. the sweep puts a clock on it before its first frame 3. it streams more
    than FRAMES frames 4. the next sweep records its pace, and the clock comes off 5. the sweeps that follow
    start no sample on the next stream (the pause)."""
    sent: list[int] = []
    go = anyio.Event()
    mw = GracefulMiddleware(frames_app(FRAMES + 8, sent, go), registry=CollectorRegistry(), admin=False)
    mw.drain.mark_serving()
    pace = core(mw.drain).tally.pace
    sampler = Sampler(core(mw.drain).ledger, pace)
    recorder = Recorder(mw.drain)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope(), Client([]), recorder)
        with anyio.fail_after(5):
            while not mw.drain.in_flight:
                await anyio.sleep(0)
        sampler.sweep()
        clock = sampler.clock
        assert clock is not None
        go.set()
    assert clock is not None and len(sent) == FRAMES + 8 and clock.frames == FRAMES + 8
    sampler.sweep()
    assert sampler.clock is None and len(pace.per_token) == 1 and len(pace.first) == 1
    assert pace.time_per_token() is not None and pace.first_token() >= 0
    # The pause: a new stream is not sampled by the sweeps that come at once.
    go2 = anyio.Event()
    mw.app = frames_app(4, [], go2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope(), Client([]), Recorder(mw.drain))
        with anyio.fail_after(5):
            while not mw.drain.in_flight:
                await anyio.sleep(0)
        sampler.sweep()
        assert sampler.clock is None
        go2.set()


async def test_the_sampler_lets_a_stream_go_once_it_has_enough_frames() -> None:
    sent: list[int] = []
    go = anyio.Event()
    done = anyio.Event()
    mw = GracefulMiddleware(frames_app(FRAMES, sent, go), registry=CollectorRegistry(), admin=False)
    mw.drain.mark_serving()
    ledger = core(mw.drain).ledger
    sampler = Sampler(ledger, core(mw.drain).tally.pace)

    async def hold(scope: Scope, receive: Receive, send: Send) -> None:
        await frames_app(FRAMES, sent, go)(scope, receive, send)
        await done.wait()

    call_send = Recorder(mw.drain)
    async with anyio.create_task_group() as tg:
        mw.app = hold
        tg.start_soon(mw, http_scope(), Client([]), call_send)
        with anyio.fail_after(5):
            while not mw.drain.in_flight:
                await anyio.sleep(0)
        sampler.sweep()
        clock = sampler.clock
        assert clock is not None
        (call,) = ledger.items()
        go.set()
        with anyio.fail_after(5):
            while len(sent) < FRAMES:
                await anyio.sleep(0)
        sampler.sweep()  # FRAMES frames: recorded, and the server's send is the call's again
        assert sampler.clock is None and call.server_send is call_send  # type: ignore[attr-defined]
        done.set()


def test_the_pace_is_the_span_over_the_frames_without_a_finished_streams_last_three() -> None:
    """1. an OpenAI stream of ten tokens a tenth of a second apart ends with its finish chunk, a usage chunk
    and [DONE] at once: counted, they would make its tokens look faster (0.077 s) 2. a loop that was late
    sends the tokens it owes in a burst mid-stream: the span still says 0.1 s, where the median gap would
    say none."""
    ended = FrameClock(types.SimpleNamespace(last=None, open=False), admitted=-0.4, since=0.0)  # type: ignore[arg-type]
    ended.times = [0.1 * i for i in range(11)] + [1.0001, 1.0002, 1.0003]
    first, per_frame = ended.pace()
    assert first == pytest.approx(0.4) and per_frame == pytest.approx(0.1)
    late = FrameClock(types.SimpleNamespace(last=None, open=True), admitted=0.0, since=0.0)  # type: ignore[arg-type]
    late.times = [0.0, 0.1, 0.2, *(1.0 + 0.0001 * i for i in range(8))]
    assert late.pace()[1] == pytest.approx(0.1, abs=0.001)
    late.times = [0.0, 0.1]
    assert late.pace() == (None, None)  # two frames: not a stream
    streamed = FrameClock(types.SimpleNamespace(last=b"data: 0\n\n", open=True), admitted=-5.0, since=0.0)  # type: ignore[arg-type]
    streamed.times = [0.0, 0.1, 0.2]
    assert streamed.pace()[0] is None  # its first frame went before the clock: no first-token time


def held_app(go: anyio.Event, *, stream: bool) -> Any:
    """A stream that starts at once and sends its frames once ``go`` is set, or a plain answer sent then."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        kind = b"text/event-stream" if stream else b"application/json"
        if stream:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
        await go.wait()
        if not stream:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
        for i in range(8 if stream else 0):
            await send({"type": "http.response.body", "body": b"data: %d\n\n" % i, "more_body": True})
        await send({"type": "http.response.body", "body": b"{}" if not stream else b"", "more_body": False})

    return app


async def test_a_new_event_stream_is_sampled_first_and_a_plain_answer_costs_no_pause() -> None:
    """1. in one sweep's time a stream starts, then a plain request comes: the sweep samples the stream
    2. a plain request alone is sampled, answers (one frame: no pace) 3. the next sweep samples again."""
    go = anyio.Event()
    apps = [held_app(go, stream=True), held_app(go, stream=False)]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await apps[scope["path"] == "/plain"](scope, receive, send)

    mw = GracefulMiddleware(app, registry=CollectorRegistry(), admin=False)
    mw.drain.mark_serving()
    ledger = core(mw.drain).ledger
    sampler = Sampler(ledger, core(mw.drain).tally.pace)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope("/stream"), Client([]), Recorder(mw.drain))
        tg.start_soon(mw, http_scope("/plain"), Client([]), Recorder(mw.drain))
        with anyio.fail_after(5):
            while mw.drain.in_flight < 2:
                await anyio.sleep(0)
        sampler.sweep()
        assert sampler.clock is not None and sampler.clock.call.scope["path"] == "/stream"
        go.set()
    sampler.sweep()
    assert sampler.clock is None and len(core(mw.drain).tally.pace.per_token) == 1
    # A plain request, sampled: no pace from it, and no pause after it.
    go2 = anyio.Event()
    apps[1] = held_app(go2, stream=False)
    sampler.resume_at = 0.0
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope("/plain"), Client([]), Recorder(mw.drain))
        with anyio.fail_after(5):
            while not mw.drain.in_flight:
                await anyio.sleep(0)
        sampler.sweep()
        assert sampler.clock is not None
        go2.set()
    sampler.sweep()
    assert sampler.clock is None and sampler.resume_at == 0.0 and len(core(mw.drain).tally.pace.per_token) == 1
