"""When streams resume and when they must not: a killed replica, a 503, a tool call, max_resumes, handoff off.

Each test uses the real ``openai`` SDK over the resuming transports, against example
servers under real uvicorn (one under ``graceful run`` in its own process) behind the
rollout demo's HAProxy where a second replica is involved.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
import uvicorn
from prometheus_client import CollectorRegistry

import graceful
from examples.rollout.replica import Replica as ProcessReplica
from examples.rollout.replica import ReplicaSettings
from graceful import GracefulMiddleware
from tests.resume_utils import TOKENS_PER_SECOND, expected_text, replica, service

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

PROMPT = "Count for me please"


def _client(url: str, *, max_resumes: int = 3, max_retries: int = 0) -> openai.AsyncOpenAI:
    transport = graceful.AsyncResumingTransport(max_resumes=max_resumes)
    http = httpx.AsyncClient(transport=transport, timeout=30)
    return openai.AsyncOpenAI(base_url=url, api_key="unused", http_client=http, max_retries=max_retries)


class Reader:
    """Reads one chat stream through the SDK, telling ``progress`` after each chunk."""

    def __init__(self) -> None:
        self.text = ""
        self.chunks = 0
        self.resumes = -1
        self.error: BaseException | None = None
        self.waiters: list[tuple[int, int, anyio.Event]] = []

    def reached(self, chunks: int, resumes: int = 0) -> anyio.Event:
        event = anyio.Event()
        self.waiters.append((chunks, resumes, event))
        return event

    async def read(self, client: openai.AsyncOpenAI, max_tokens: int) -> None:
        try:
            stream = await client.chat.completions.create(
                model="graceful-example",
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=max_tokens,
                stream=True,
            )
            async with stream:
                async for chunk in stream:
                    self.chunks += 1
                    self.text += chunk.choices[0].delta.content or "" if chunk.choices else ""
                    self.resumes = stream.response.extensions["graceful_resumes"]
                    for chunks, resumes, event in self.waiters:
                        if self.chunks >= chunks and self.resumes >= resumes:
                            event.set()
        except (openai.APIError, httpx.HTTPError) as exc:
            self.error = exc
        finally:
            for _, _, event in self.waiters:
                event.set()


async def test_a_replica_killed_mid_stream_is_resumed_from_the_cut(tmp_path: Path) -> None:
    """1. a stream runs on replica K (its own `graceful run` process) 2. B joins, K is SIGKILLed
    3. the transport sees the cut before [DONE] and continues through the balancer (K's
    dead endpoint is still listed: the refused continuation is sent again) 4. the text is exact."""
    settings = ReplicaSettings(
        kind="graceful", grace_period=30, propagation_wait=0.2, tokens_per_second=TOKENS_PER_SECOND, load_delay=0.0
    )
    settings = ReplicaSettings(**{**settings.__dict__, "log_dir": str(tmp_path)})
    killed = ProcessReplica("k", settings)
    await killed.start()
    try:
        await killed.wait_started(timeout=30)
        async with replica("b") as b, service() as balancer:
            await balancer.add("k", killed.port)
            reader = Reader()
            started = reader.reached(5)
            async with _client(f"http://127.0.0.1:{balancer.port}/v1") as client, anyio.create_task_group() as tg:
                tg.start_soon(reader.read, client, 80)
                with anyio.fail_after(20):
                    await started.wait()
                await balancer.add(b.name, b.port)
                killed.kill()
            assert reader.error is None
            assert reader.text == expected_text(80)
            assert reader.resumes == 1
            assert b.app.drain.counters()["requests"]["completed"] == 1
    finally:
        await killed.stop()


async def test_a_503_is_not_resumed_but_left_to_the_sdk() -> None:
    """1. the only replica drains with admit_during_propagation=False 2. a stream request gets
    its 503 3. the transport passes it through: the SDK's own retries (2) make 3 requests, no more."""
    async with replica("a", admit_during_propagation=False, propagation_wait=20) as a, service(a) as balancer:
        a.app.drain.begin_drain("test")
        client = _client(f"http://127.0.0.1:{balancer.port}/v1", max_retries=2)
        async with client:
            client = client.with_options(timeout=10)
            with pytest.raises(openai.InternalServerError) as caught:
                await client.chat.completions.create(
                    model="graceful-example", messages=[{"role": "user", "content": PROMPT}], stream=True
                )
        assert caught.value.status_code == 503
        assert a.app.drain.counters()["rejected"] == {"server_draining": 3}


async def _tool_call_app(scope: Any, receive: Any, send: Any) -> None:
    """Streams the start of a tool call, then waits: the cut falls inside its arguments."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    _tool_call_app.calls += 1  # type: ignore[attr-defined]
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    base = {"id": "chatcmpl-tool", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    deltas = [
        {"role": "assistant", "content": None},
        {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather"}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Par'}}]},
    ]
    for delta in deltas:
        event = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        await send(
            {"type": "http.response.body", "body": b"data: " + json.dumps(event).encode() + b"\n\n", "more_body": True}
        )
    await anyio.sleep_forever()


@contextlib.asynccontextmanager
async def _serve(app: GracefulMiddleware) -> AsyncIterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            with anyio.fail_after(10):
                while not server.started:  # uvicorn offers a flag, not an event
                    await anyio.sleep(0.01)
            try:
                yield sock.getsockname()[1]
            finally:
                server.should_exit = server.force_exit = True
                tg.cancel_scope.cancel()
    finally:
        sock.close()


async def test_a_cut_inside_tool_call_arguments_is_not_resumed() -> None:
    """1. a stream is inside a tool call's arguments 2. the server drains with handoff_streams and
    ends it with the resumable final event 3. no continuation is sent (the app saw one request)
    and the SDK raises the server_shutdown error, as it would without the transport."""
    _tool_call_app.calls = 0  # type: ignore[attr-defined]
    app = GracefulMiddleware(_tool_call_app, registry=CollectorRegistry(), admin=False, handoff_streams=True)
    async with _serve(app) as port, _client(f"http://127.0.0.1:{port}/v1") as client:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "weather in Paris?"}], stream=True
        )
        arguments = ""
        with pytest.raises(openai.APIError, match="shutting down") as caught:
            async with stream:
                async for chunk in stream:
                    for call in chunk.choices[0].delta.tool_calls or ():
                        arguments += call.function.arguments or "" if call.function else ""
                    if arguments:
                        result = await app.drain.drain(reason="test")
        assert arguments == '{"city": "Par'
        assert caught.value.body == {
            "type": "server_shutdown",
            "message": "The server is shutting down; continue the stream on another replica (docs/resume.md).",
            "retryable": True,
            "code": 503,
            "resumable": True,
        }
        assert stream.response.extensions["graceful_resumes"] == 0
    assert _tool_call_app.calls == 1  # type: ignore[attr-defined]
    assert result.handed_off == 1


async def test_max_resumes_bounds_the_continuations() -> None:
    """1. with max_resumes=1 a stream moves from A to B 2. B drains too 3. the second handoff is
    not followed: the SDK raises the server_shutdown error after exactly the text received."""
    async with replica("a", handoff_streams=True) as a, replica("b", handoff_streams=True) as b:
        async with service(a) as balancer:
            reader = Reader()
            started, moved = reader.reached(5), reader.reached(10, resumes=1)
            async with _client(f"http://127.0.0.1:{balancer.port}/v1", max_resumes=1) as client:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(reader.read, client, 200)
                    with anyio.fail_after(20):
                        await started.wait()
                    await balancer.add(b.name, b.port)
                    first = await a.app.drain.drain(reason="rollout")
                    with anyio.fail_after(20):
                        await moved.wait()
                    second = await b.app.drain.drain(reason="rollout")
    assert first.handed_off == 1 and second.handed_off == 1
    assert isinstance(reader.error, openai.APIError) and "shutting down" in str(reader.error)
    assert reader.resumes == 1
    received = len(reader.text.split())
    assert 10 <= received < 200 and reader.text == expected_text(received)


async def test_with_handoff_off_streams_are_waited_for() -> None:
    """1. a resumable stream runs on A (handoff_streams off) 2. A drains 3. the drain waits for the
    stream, which ends on A with every token and no resume; nothing is handed off."""
    async with replica("a") as a:
        reader = Reader()
        started = reader.reached(5)
        async with _client(f"http://127.0.0.1:{a.port}/v1") as client, anyio.create_task_group() as tg:
            sent = anyio.current_time()  # the engine's clock for the stream starts after this
            tg.start_soon(reader.read, client, 60)
            with anyio.fail_after(20):
                await started.wait()
            result = await a.app.drain.drain(reason="rollout")
            returned = anyio.current_time()
    assert reader.error is None and reader.text == expected_text(60) and reader.resumes == 0
    assert result.result == "drained" and result.handed_off == 0
    # The drain outlasted the stream: the example engine paces its 60 tokens on a fixed clock from the
    # stream's start, so the last one comes no sooner than 60 / 40 s after the request was sent.
    assert returned - sent >= 60 / TOKENS_PER_SECOND - 1e-3
    assert a.app.drain.counters()["requests"]["completed"] == 1


def test_max_resumes_must_be_a_whole_number() -> None:
    with pytest.raises(ValueError, match=r"max_resumes=-1 must be a whole number, 0 or more"):
        graceful.ResumingTransport(max_resumes=-1)
    with pytest.raises(ValueError, match=r"max_resumes='3'"):
        graceful.AsyncResumingTransport(max_resumes="3")  # type: ignore[arg-type]


async def test_a_stream_queued_past_the_handoff_is_handed_off_as_it_starts() -> None:
    """1. A has one engine slot; stream 1 holds it, stream 2 waits in A's queue 2. B joins, A drains:
    stream 1 is handed off at once, then stream 2 starts on A and is handed off as it starts
    3. both end on B with every token; A drained without waiting for either."""
    async with replica("a", handoff_streams=True, slots=1) as a, replica("b") as b:
        async with service(a) as balancer:
            first, second = Reader(), Reader()
            started = first.reached(5)
            async with _client(f"http://127.0.0.1:{balancer.port}/v1") as client, anyio.create_task_group() as tg:
                tg.start_soon(first.read, client, 80)
                with anyio.fail_after(20):
                    await started.wait()
                tg.start_soon(second.read, client, 80)
                with anyio.fail_after(20):
                    while a.app.engine.waiting < 1:  # A's own queue: stream 2 is in line
                        await anyio.sleep(0.01)
                await balancer.add(b.name, b.port)
                result = await a.app.drain.drain(reason="rollout")
    assert first.error is None and first.text == expected_text(80) and first.resumes == 1
    assert second.error is None and second.text == expected_text(80) and second.resumes == 1
    assert result.result == "drained" and result.handed_off == 2
