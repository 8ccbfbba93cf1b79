"""A replica whose engine died says so at once: FAILED, readiness fails, new work is refused retryably.

The frames and bodies are vLLM 0.32's own (see tests/asgi/test_engine_abort.py for the stream's):
- a dead engine core raises ``EngineDeadError`` (vllm/v1/engine/exceptions.py), whose message is
  fixed; mid-stream vLLM's stream generators send it as an error event with code 500, then
  ``[DONE]`` (vllm/entrypoints/openai/chat_completion/serving.py);
- a new request that reaches the dead engine gets ``engine_error_handler``'s answer
  (vllm/entrypoints/serve/exception_handling/handlers/vllm_error.py): ``JSONResponse`` of
  ``create_error_response(exc).model_dump()`` with status 500
  (vllm/entrypoints/serve/exception_handling/error_response.py);
- a request's own generation failure is a ``GenerationError`` (vllm/exceptions.py), also a 500
  "InternalServerError", whose message is "Internal server error": not the engine's death.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from graceful import State
from graceful._asgi._types import Receive, Scope, Send
from graceful._drain._state import core
from tests.asgi.test_engine_abort import CONTENT, DONE, ENGINE_DEAD, last_event, sse_app
from tests.asgi.test_middleware_raw import Recorder, http_scope, make, no_body

pytestmark = pytest.mark.anyio

# Starlette's JSONResponse body of the same ErrorResponse: json.dumps with compact separators.
DEAD_BODY = (
    b'{"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the root cause.",'
    b'"type":"InternalServerError","param":null,"code":500}}'
)
GENERATION_ERROR = b'{"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}'
GENERATION_EVENT = b"data: " + GENERATION_ERROR + b"\n\n"


def json_app(status: int, body: bytes, calls: list[str] | None = None) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if calls is not None:
            calls.append(scope["path"])
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


async def call(mw: Any, path: str = "/v1/chat/completions", method: str = "POST") -> Recorder:
    recorder = Recorder(mw.drain)
    scope = http_scope(path)
    scope["method"] = method
    await mw(scope, no_body, recorder)
    return recorder


def status(recorder: Recorder) -> int:
    return int(recorder.messages[0]["status"])


def headers(recorder: Recorder) -> dict[bytes, bytes]:
    return dict(recorder.messages[0]["headers"])


async def test_a_stream_that_says_the_engine_died_fails_the_replica_at_once() -> None:
    """1. a stream ends with vLLM's EngineDeadError event and [DONE]
    2. FAILED, before the stream's final frame reaches its client; the cause is in the status and metrics
    3. /ready 503, /startup 200, /live 200 (liveness left to the app)
    4. a new request gets the not-started 503 (server_failed, Retry-After, the marker) and never
       reaches the app; nothing brings it back to SERVING"""
    calls: list[str] = []
    frames = sse_app(CONTENT, ENGINE_DEAD, DONE)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        calls.append(scope["path"])
        await frames(scope, receive, send)

    mw = make(app)
    seen: list[State] = []
    recorder = Recorder(mw.drain)

    async def send(message: Any) -> None:
        seen.append(mw.drain.state)
        await recorder(message)

    await mw(http_scope("/v1/chat/completions"), no_body, send)
    assert last_event(recorder.body)["error"]["type"] == "server_shutdown"
    assert seen[-2] is State.FAILED  # the final frame already left from a FAILED replica
    assert mw.drain.state is State.FAILED
    failure = mw.drain.status().as_dict()["failure"]
    assert isinstance(failure, dict) and failure["reason"] == "engine_dead"
    assert "EngineCore encountered an issue" in str(failure["detail"])
    assert mw.drain.counters()["failures"] == {"engine_dead": 1}

    assert status(await call(mw, "/ready", "GET")) == 503
    assert status(await call(mw, "/startup", "GET")) == 200
    assert status(await call(mw, "/live", "GET")) == 200

    refused = await call(mw)
    assert status(refused) == 503
    assert headers(refused)[b"retry-after"] == b"1"
    assert headers(refused)[b"x-graceful-not-started"] == b"1"
    assert headers(refused)[b"x-envoy-immediate-health-check-fail"] == b"true"
    assert json.loads(refused.body)["error"]["type"] == "server_failed"
    assert calls == ["/v1/chat/completions"]  # the app never saw the refused request
    assert mw.drain.counters()["rejected"] == {"server_failed": 1}

    assert mw.drain.resume() is False
    mw.drain.mark_serving()
    assert mw.drain.state is State.FAILED


async def test_fail_liveness_fails_live_once_the_engine_died() -> None:
    mw = make(sse_app(CONTENT, ENGINE_DEAD, DONE), fail_liveness=True)
    assert status(await call(mw, "/live", "GET")) == 200
    await call(mw)
    assert mw.drain.state is State.FAILED
    assert status(await call(mw, "/live", "GET")) == 503


async def test_a_500_that_says_the_engine_died_passes_as_sent_and_costs_no_request_a_check() -> None:
    """A new request that meets the dead engine gets vLLM's 500 as vLLM sent it: graceful reads no status
    or body on the request path (its per-request cost stays), and vLLM shuts its server down at such a
    request (engine_error_handler calls terminate_if_errored). The streams and exceptions graceful carries
    to their end are where it sees the engine die."""
    mw = make(json_app(500, DEAD_BODY))
    first = await call(mw)
    assert status(first) == 500 and first.body == DEAD_BODY
    assert mw.drain.state is State.SERVING


@pytest.mark.parametrize(
    "app",
    [
        json_app(500, GENERATION_ERROR),  # one request's generation error
        json_app(503, b'{"error":{"message":"busy","type":"ServiceUnavailableError","code":503}}'),
        json_app(400, DEAD_BODY),  # the words, but not a server failure
        json_app(500, b"Internal Server Error"),  # not JSON
        json_app(200, DEAD_BODY),
        sse_app(CONTENT, GENERATION_EVENT, DONE),  # a request's own error mid-stream
    ],
    ids=["generation-error", "503", "400-with-the-words", "500-not-json", "200", "stream-generation-error"],
)
async def test_other_failures_leave_the_replica_serving(app: Any) -> None:
    mw = make(app)
    await call(mw)
    assert mw.drain.state is State.SERVING
    assert mw.drain.counters()["failures"] == {}


async def test_a_failure_during_a_drain_keeps_its_run_and_refuses_at_once() -> None:
    """1. a drain runs with a long propagation wait (new requests still admitted)  2. the engine dies
    3. FAILED: new requests are refused at once; the drain is joined, not restarted, and ends drained"""
    mw = make(sse_app(CONTENT, ENGINE_DEAD, DONE))
    drain = mw.drain
    assert drain.begin_drain(propagation_wait=20, propagation_quiet=0.2)
    run = core(drain).run
    await call(mw)
    assert drain.state is State.FAILED
    refused = await call(mw)
    assert status(refused) == 503 and json.loads(refused.body)["error"]["type"] == "server_failed"
    assert drain.begin_drain() is False
    result = await drain.drain()
    assert core(drain).run is run
    assert result.drained and drain.state is State.FAILED


class EngineDeadError(Exception):
    """Named as vLLM's (vllm/v1/engine/exceptions.py): the rule reads the class name, not the class."""


async def test_the_engine_dying_under_a_started_response_fails_the_replica() -> None:
    """vLLM's Responses stream lets EngineDeadError out of a response already started; Starlette raises
    RuntimeError("Caught handled exception, but response already started.") from it
    (starlette/_exception_handler.py). The exception reaches the server as it was, and the replica is FAILED."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"event: response.created\ndata: {}\n\n", "more_body": True})
        try:
            raise EngineDeadError("EngineCore encountered an issue. See stack trace (above) for the root cause.")
        except EngineDeadError as exc:
            raise RuntimeError("Caught handled exception, but response already started.") from exc

    mw = make(app)
    with pytest.raises(RuntimeError, match="already started"):
        await call(mw, "/v1/responses")
    assert mw.drain.state is State.FAILED
    assert "EngineDeadError" in mw.drain.failure.detail  # type: ignore[union-attr]
    assert mw.drain.in_flight == 0


async def test_another_exception_leaves_the_replica_serving() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("a bug") from ValueError("bad input")

    mw = make(app)
    with pytest.raises(RuntimeError):
        await call(mw)
    assert mw.drain.state is State.SERVING
