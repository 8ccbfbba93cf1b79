"""The resume protocol on the wire: the header, the final event, the continuation and the spliced bytes.

Raw httpx over the resuming transport, against real servers (example-server replicas
behind the demo's HAProxy, or a small header-echo app) under uvicorn.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
import uvicorn

import graceful
from graceful._resume._splice import Splice
from tests.resume_utils import expected_text, replica, service

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

PROMPT = "Count for me please"


def _events(raw: bytes) -> list[str]:
    return [part[len("data: ") :] for part in raw.decode().split("\n\n") if part.startswith("data: ")]


async def _stream(client: httpx.AsyncClient, path: str, body: dict[str, Any], started: anyio.Event) -> bytes:
    raw = b""
    async with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        async for data in response.aiter_bytes():
            raw += data
            if raw.count(b"\n\n") >= 5:
                started.set()
    return raw


@pytest.mark.parametrize("kind", ["chat", "completion"])
async def test_the_spliced_stream_reads_as_one_response(kind: str) -> None:
    """1. a stream with include_usage starts on A 2. B joins, A drains and hands it off 3. the caller's
    bytes: one id/created/model, one role delta, no shutdown event, one usage, one [DONE] at the end."""
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    body: dict[str, Any] = {"model": "graceful-example", "max_tokens": 90, "stream": True}
    body["stream_options"] = {"include_usage": True}
    body |= {"messages": [{"role": "user", "content": PROMPT}]} if kind == "chat" else {"prompt": PROMPT}
    async with replica("a", handoff_streams=True) as a, replica("b", handoff_streams=True) as b:
        async with service(a) as balancer:
            transport = graceful.AsyncResumingTransport()
            base = f"http://127.0.0.1:{balancer.port}"
            async with httpx.AsyncClient(transport=transport, base_url=base, timeout=30) as client:
                started = anyio.Event()
                async with anyio.create_task_group() as tg:
                    result: list[bytes] = []

                    async def read() -> None:
                        result.append(await _stream(client, path, body, started))

                    tg.start_soon(read)
                    with anyio.fail_after(20):
                        await started.wait()
                    await balancer.add(b.name, b.port)
                    await a.app.drain.drain(reason="rollout")
    events = _events(result[0])
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [json.loads(event) for event in events[:-1]]
    assert not any("error" in chunk for chunk in chunks)
    assert len({(chunk["id"], chunk["created"], chunk["model"]) for chunk in chunks}) == 1
    usage = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
    assert usage == [{"prompt_tokens": 4, "completion_tokens": 90, "total_tokens": 94}]
    choices = [chunk["choices"][0] for chunk in chunks if chunk["choices"]]
    if kind == "chat":
        assert [choice["delta"].get("role") for choice in choices].count("assistant") == 1
        text = "".join(choice["delta"].get("content") or "" for choice in choices)
    else:
        text = "".join(choice["text"] for choice in choices)
    assert text == expected_text(90)
    assert [choice["finish_reason"] for choice in choices].count("length") == 1
    assert a.app.drain.counters()["requests"]["handed_off"] == 1


@pytest.mark.parametrize("resumable", [True, False])
async def test_the_deadline_event_says_resumable_when_the_request_did(resumable: bool) -> None:
    """1. a stream runs on A (handoff off) 2. A's drain deadline cuts it 3. the final event carries
    "resumable": true only when the request carried x-graceful-resumable (max_resumes=0 shows it)."""
    async with replica("a", drain_timeout=0.5, propagation_wait=0) as a:
        transport = graceful.AsyncResumingTransport(max_resumes=0) if resumable else httpx.AsyncHTTPTransport()
        async with httpx.AsyncClient(transport=transport, base_url=f"http://127.0.0.1:{a.port}", timeout=30) as client:
            started = anyio.Event()
            body = {"model": "m", "max_tokens": 400, "stream": True, "prompt": PROMPT}
            async with anyio.create_task_group() as tg:
                result: list[bytes] = []

                async def read() -> None:
                    result.append(await _stream(client, "/v1/completions", body, started))

                tg.start_soon(read)
                with anyio.fail_after(20):
                    await started.wait()
                outcome = await a.app.drain.drain(reason="rollout")
    final = json.loads(_events(result[0])[-1])
    assert final["error"]["type"] == "server_shutdown"
    assert final["error"].get("resumable") is (True if resumable else None)
    assert outcome.result == "timeout" and outcome.truncated == 1 and outcome.handed_off == 0


async def _echo_headers(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    while (await receive()).get("more_body"):
        pass
    body = json.dumps({name.decode(): value.decode() for name, value in scope["headers"]}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def _echo_server() -> AsyncIterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(_echo_headers, log_level="warning", lifespan="on"))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            with anyio.fail_after(10):
                while not server.started:  # uvicorn offers a flag, not an event
                    await anyio.sleep(0.01)
            try:
                yield f"http://127.0.0.1:{sock.getsockname()[1]}"
            finally:
                server.should_exit = True
                tg.cancel_scope.cancel()
    finally:
        sock.close()


@pytest.mark.parametrize(
    ("method", "path", "body", "marked"),
    [
        ("POST", "/v1/chat/completions", {"stream": True, "messages": [{"role": "user", "content": "hi"}]}, True),
        ("POST", "/v1/completions", {"stream": True, "prompt": "hi"}, True),
        ("POST", "/v1/completions", {"stream": True, "prompt": ["hi"]}, True),
        ("POST", "/v1/chat/completions", {"stream": False, "messages": [{"role": "user", "content": "hi"}]}, False),
        (
            "POST",
            "/v1/chat/completions",
            {"stream": True, "n": 2, "messages": [{"role": "user", "content": "x"}]},
            False,
        ),
        ("POST", "/v1/completions", {"stream": True, "prompt": [1, 2, 3]}, False),
        ("POST", "/v1/completions", {"stream": True, "prompt": "hi", "echo": True}, False),
        ("POST", "/v1/embeddings", {"stream": True, "input": "hi"}, False),
        ("GET", "/v1/models", None, False),
    ],
)
async def test_only_resumable_requests_carry_the_header(
    method: str, path: str, body: dict[str, Any] | None, marked: bool
) -> None:
    async with _echo_server() as url:
        transport = graceful.AsyncResumingTransport()
        async with httpx.AsyncClient(transport=transport, base_url=url, timeout=10) as client:
            response = await client.request(method, path, json=body)
    headers = response.json()
    assert headers.get("x-graceful-resumable") == ("1" if marked else None)
    assert "graceful_resumes" not in response.extensions  # not an event stream: passed through untouched


def test_the_sync_transport_marks_the_same_requests() -> None:
    """The sync twin against the same echo app, run in its own event loop thread."""

    async def main() -> dict[str, str]:
        async with _echo_server() as url:

            def call() -> dict[str, str]:
                with httpx.Client(transport=graceful.ResumingTransport(), base_url=url, timeout=10) as client:
                    body = {"stream": True, "messages": [{"role": "user", "content": "hi"}]}
                    return dict(client.post("/v1/chat/completions", json=body).json())

            return await anyio.to_thread.run_sync(call)

    assert anyio.run(main)["x-graceful-resumable"] == "1"


def test_the_continuation_grows_a_prefilled_answer_and_lowers_the_limits() -> None:
    """A caller that prefilled the assistant turn (continue_final_message) gets it extended, not doubled."""
    payload = {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Sure:"}],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "max_completion_tokens": 50,
        "seed": 3,
        "temperature": 0.7,
        "stream": True,
    }
    splice = Splice("chat", payload, 3)
    splice.feed(b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":" one"}}]}\n\n')
    splice.feed(b'data: {"id":"x","choices":[{"index":0,"delta":{"content":" two"}}]}\r\n\r\n')
    body = json.loads(splice.continuation())
    assert body["messages"] == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Sure: one two"}]
    assert body["max_completion_tokens"] == 48 and body["seed"] == 3 and body["temperature"] == 0.7
    assert payload["messages"][1]["content"] == "Sure:"  # the caller's request is left as it was


def test_handoff_streams_comes_from_the_option_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from graceful import ConfigError, Drain

    assert Drain().config.handoff_streams is False
    assert Drain(handoff_streams=True).config.handoff_streams is True
    monkeypatch.setenv("GRACEFUL_HANDOFF_STREAMS", "1")
    assert Drain().config.handoff_streams is True
    assert Drain(handoff_streams=False).config.handoff_streams is False
    monkeypatch.setenv("GRACEFUL_HANDOFF_STREAMS", "maybe")
    with pytest.raises(ConfigError, match=r"GRACEFUL_HANDOFF_STREAMS: 'maybe' is not a boolean; use 1 or 0"):
        Drain()
    with pytest.raises(ConfigError, match=r"handoff_streams: expected True or False, got 'yes'"):
        Drain(handoff_streams="yes")


def test_graceful_drain_shows_handed_off_streams_apart() -> None:
    from graceful._admin._client import WorkerDrain
    from graceful._cli._drain_client import _progress_line, _report

    running = WorkerDrain("a.sock", pid=7, in_flight=1, handed_off=3, progressed=True, propagation_over=True)
    assert _progress_line([running], 2.0) == (
        "draining 1 worker: 1 in flight, 2.0 s elapsed, 3 streams handed off, propagation over"
    )
    done = WorkerDrain("a.sock", pid=7, result={"result": "drained", "duration": 1.25, "handed_off": 3, "truncated": 0})
    assert _report([done], 1.3)[0] == "worker 7: drained in 1.2 s; 3 streams handed off"
