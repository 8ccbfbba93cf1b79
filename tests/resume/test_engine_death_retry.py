"""The transport's rule for a continuation that reaches a replica whose engine has died.

Behind a balancer a continuation can land on the replica whose engine just died. vLLM's API
server is still up there for a moment and answers 500 with EngineDeadError's body
(vllm/entrypoints/serve/exception_handling/handlers/vllm_error.py, engine_error_handler, with
the body of vllm/entrypoints/serve/exception_handling/error_response.py; the message is fixed in
vllm/v1/engine/exceptions.py). Such an answer, or a connection the server closes before any
answer, sends the continuation elsewhere like a refusal. Any other 500 (a request's own
GenerationError, vllm/exceptions.py) ends the resume.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

import graceful
from tests.asgi.test_engine_death import DEAD_BODY, GENERATION_ERROR

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

URL = "http://replica.test/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 10}
SSE = {"content-type": "text/event-stream"}
FINAL = b'data: {"error":{"type":"server_shutdown","message":"m","retryable":true,"code":503,"resumable":true}}\n\n'


def sse(body: bytes) -> httpx.Response:
    """A streamed answer, as a server sends one (a Response made with content= counts as read already)."""
    return httpx.Response(200, headers=SSE, stream=httpx.ByteStream(body))


def chunk(content: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": content}, "finish_reason": finish}
    payload = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


ENGINE_DEAD_EVENT = b"data: " + DEAD_BODY + b"\n\n"
# The first replica: two words, then its engine dies: vLLM's error event and graceful's final event.
CUT = chunk("one ") + chunk("two ") + ENGINE_DEAD_EVENT + FINAL
REST = chunk("three", "stop") + b"data: [DONE]\n\n"


class Replicas:
    """The answers of successive requests, in order: a Response, or an exception to raise."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


async def read(replicas: Replicas) -> tuple[str, httpx.Response]:
    transport = graceful.AsyncResumingTransport(httpx.MockTransport(replicas))
    async with httpx.AsyncClient(transport=transport) as client:
        async with client.stream("POST", URL, json=BODY) as response:
            text = b"".join([part async for part in response.aiter_raw()]).decode()
    return text, response


def contents(text: str) -> str:
    words = []
    for line in text.splitlines():
        if line.startswith("data: {") and '"choices"' in line:
            words.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
    return "".join(words)


@pytest.mark.parametrize(
    "refusal",
    [
        httpx.Response(500, content=DEAD_BODY, headers={"content-type": "application/json"}),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.Response(503, content=b'{"error":{"type":"server_failed"}}', headers={"x-graceful-not-started": "1"}),
    ],
    ids=["500-engine-dead", "closed-before-a-response", "graceful-refusal"],
)
async def test_a_continuation_answered_by_a_dead_engine_is_sent_again(refusal: httpx.Response | Exception) -> None:
    """1. the stream is cut by the engine's death, with graceful's resumable final event
    2. the continuation meets the dead replica (vLLM's 500, or a closed connection): sent again
    3. the next replica continues it: one stream, whole, one [DONE], no error event"""
    replicas = Replicas(sse(CUT), refusal, sse(REST))
    text, response = await read(replicas)
    assert contents(text) == "one two three"
    assert text.count("[DONE]") == 1 and '"error"' not in text
    assert response.extensions["graceful_resumes"] == 1
    assert len(replicas.bodies) == 3 and replicas.bodies[1] == replicas.bodies[2]  # the same continuation, twice


async def test_any_other_500_ends_the_resume_and_the_caller_sees_the_cut() -> None:
    """A 500 that does not say the engine died (a request's own GenerationError) is not sent again:
    the caller reads the engine's error and graceful's final event, as the replica sent them."""
    replicas = Replicas(
        sse(CUT),
        httpx.Response(500, content=GENERATION_ERROR, headers={"content-type": "application/json"}),
    )
    text, _ = await read(replicas)
    assert contents(text) == "one two "
    assert "EngineCore encountered an issue" in text and '"server_shutdown"' in text
    assert "[DONE]" not in text
    assert len(replicas.bodies) == 2
