"""A stream the engine aborts does not reach the client as a whole answer.

vLLM finishes a request it aborts with a chunk whose ``finish_reason`` is ``"abort"`` and
then ``data: [DONE]`` (vllm-project/vllm#57082). The frames below are the ones a real vLLM
0.32 sent for an aborted chat stream with ``return_token_ids`` and ``include_usage``
(``vllm/entrypoints/openai/chat_completion/serving.py``): the last content chunk, the abort
chunk with an empty delta, the usage chunk, ``[DONE]``. tests/vllm/ aborts a stream on a real
vLLM too.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from graceful._asgi._types import Receive, Scope, Send
from tests.asgi.test_middleware_raw import Recorder, http_scope, make, no_body

pytestmark = pytest.mark.anyio

CONTENT = (
    b'data: {"id":"chatcmpl-abc123","object":"chat.completion.chunk","created":1796489422,"model":"m","choices":'
    b'[{"index":0,"delta":{"content":"X"},"logprobs":null,"finish_reason":null,"token_ids":[61]}]}\n\n'
)
ABORT = (
    b'data: {"id":"chatcmpl-abc123","object":"chat.completion.chunk","created":1796489422,"model":"m","choices":'
    b'[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"abort","stop_reason":null,'
    b'"token_ids":[]}]}\n\n'
)
USAGE = (
    b'data: {"id":"chatcmpl-abc123","object":"chat.completion.chunk","created":1796489422,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":9,"total_tokens":903,"completion_tokens":894}}\n\n'
)
# A whole answer whose last word is "abort": the word is in the frame, the finish is not.
WORD = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    b'[{"index":0,"delta":{"content":"abort"},"logprobs":null,"finish_reason":null}]}\n\n'
)
STOP = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    b'[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}\n\n'
)
DONE = b"data: [DONE]\n\n"


def sse_app(*frames: bytes, media: bytes = b"text/event-stream") -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", media)]})
        for frame in frames:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


async def run(app: Any, headers: Any = ()) -> tuple[Recorder, Any]:
    mw = make(app)
    recorder = Recorder(mw.drain)
    await mw(http_scope("/v1/chat/completions", headers=headers), no_body, recorder)
    return recorder, mw


def last_event(body: bytes) -> dict[str, Any]:
    events = [part for part in body.split(b"\n\n") if part]
    data: dict[str, Any] = json.loads(events[-1].removeprefix(b"data: "))
    return data


@pytest.mark.parametrize(
    "frames",
    [(CONTENT, ABORT, USAGE), (CONTENT, ABORT), (ABORT,)],
    ids=["with-usage", "without-usage", "abort-the-only-frame"],
)
async def test_an_aborted_stream_ends_with_the_final_frame_not_done(frames: tuple[bytes, ...]) -> None:
    """1. content, the abort chunk (and the usage chunk) pass as sent  2. [DONE] is replaced by the
    retryable server_shutdown event  3. the response ends once, the count is back to 0, and the
    truncation is counted with the reason engine_abort."""
    recorder, mw = await run(sse_app(*frames, DONE))
    assert recorder.body.startswith(b"".join(frames))
    assert DONE not in recorder.body
    error = last_event(recorder.body)["error"]
    assert error["type"] == "server_shutdown" and error["retryable"] is True and "resumable" not in error
    assert [m.get("more_body", False) for m in recorder.messages[1:]][-1] is False
    assert sum(1 for m in recorder.messages if m["type"] == "http.response.body" and not m.get("more_body")) == 1
    assert mw.drain.in_flight == 0
    assert mw.drain.counters()["truncated"] == {"engine_abort": 1}


async def test_a_resumable_aborted_stream_ends_resumable() -> None:
    """The request carried x-graceful-resumable: 1, so the final event says the client may continue."""
    recorder, _ = await run(sse_app(CONTENT, ABORT, USAGE, DONE), headers=[(b"x-graceful-resumable", b"1")])
    assert last_event(recorder.body)["error"]["resumable"] is True


@pytest.mark.parametrize(
    "frames, media",
    [
        ((CONTENT, WORD, STOP, DONE), b"text/event-stream"),  # "abort" as a word of the answer
        ((CONTENT, ABORT, DONE), b"application/x-ndjson"),  # not an event stream
        ((CONTENT, STOP, DONE), b"text/event-stream"),
        ((DONE,), b"text/event-stream"),  # [DONE] the first frame: no frame before it to read
    ],
    ids=["abort-as-a-word", "not-sse", "whole", "done-first"],
)
async def test_other_streams_pass_unchanged(frames: tuple[bytes, ...], media: bytes) -> None:
    recorder, mw = await run(sse_app(*frames, media=media))
    assert recorder.body == b"".join(frames)
    assert mw.drain.counters()["truncated"] == {}


# An engine that fails mid-stream: vLLM's stream generators catch the error and yield
# f"data: {self.create_streaming_error_response(e)}\n\n", then "data: [DONE]\n\n"
# (vllm/entrypoints/openai/chat_completion/serving.py). create_streaming_error_response is
# json.dumps(ErrorResponse(...).model_dump()) with the fields of ErrorInfo in order: message, type,
# param, code (vllm/entrypoints/serve/engine/protocol.py). A dead engine core raises
# EngineDeadError, a VLLMServerError, whose message and 500 are these
# (vllm/v1/engine/exceptions.py, vllm/entrypoints/serve/exception_handling/error_response.py).
ENGINE_DEAD = (
    b'data: {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.", '
    b'"type": "InternalServerError", "param": null, "code": 500}}\n\n'
)
# A request's own fault found mid-stream: a 400, which another replica would answer the same way.
BAD_REQUEST = b'data: {"error": {"message": "bad grammar", "type": "BadRequestError", "param": null, "code": 400}}\n\n'


async def test_an_engine_error_mid_stream_ends_with_the_final_frame(caplog: pytest.LogCaptureFixture) -> None:
    """1. content, then vLLM's error event for a dead engine core, pass as sent  2. [DONE] is replaced
    by graceful's retryable final event (resumable for a resumable request)  3. counted as
    engine_error; the log carries the engine's own message"""
    with caplog.at_level("WARNING", logger="graceful"):
        recorder, mw = await run(sse_app(CONTENT, ENGINE_DEAD, DONE), headers=[(b"x-graceful-resumable", b"1")])
    assert recorder.body.startswith(CONTENT + ENGINE_DEAD)
    assert DONE not in recorder.body
    error = last_event(recorder.body)["error"]
    assert error["type"] == "server_shutdown" and error["retryable"] is True and error["resumable"] is True
    assert mw.drain.in_flight == 0
    assert mw.drain.counters()["truncated"] == {"engine_error": 1}
    assert mw.drain.counters()["requests"]["error"] == 1
    [record] = [r for r in caplog.records if "engine ended the stream" in r.getMessage()]
    assert "500 InternalServerError: EngineCore encountered an issue" in record.getMessage()


@pytest.mark.parametrize(
    "frames",
    [
        (CONTENT, BAD_REQUEST, DONE),  # the request's fault: passed on as vLLM sent it
        (CONTENT, b'data: {"error": "not an object"}\n\n', DONE),
        (CONTENT, b'data: {"error": {"message": "m", "code": "500"}}\n\n', DONE),  # a code that is not a number
        (CONTENT, b'data: {"error": {not json\n\n', DONE),
    ],
    ids=["client-error", "error-not-an-object", "code-a-string", "not-json"],
)
async def test_other_error_events_pass_unchanged(frames: tuple[bytes, ...]) -> None:
    recorder, mw = await run(sse_app(*frames))
    assert recorder.body == b"".join(frames)
    assert mw.drain.counters()["truncated"] == {}
