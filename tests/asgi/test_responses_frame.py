"""A Responses API stream that graceful ends early ends with one final event in the Responses framing.

The frames are a real vLLM 0.32's (tests/resume/fixtures/README.md); the final event is an ``error``
event with the next ``sequence_number`` and graceful's ``error`` object (docs/protocol.md).
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from graceful import State
from graceful._asgi._types import Receive, Scope, Send
from tests.asgi.test_engine_death import EngineDeadError
from tests.asgi.test_middleware_raw import Recorder, http_scope, make, no_body
from tests.resume.test_responses import FIRST, data

pytestmark = pytest.mark.anyio

OPENING = FIRST[:5]  # response.created ... the first delta
LAST_SEQUENCE = data(OPENING[-1])["sequence_number"]


def responses_app(*, then: str) -> Any:
    """Streams the opening events of a real vLLM Responses stream, then hangs or raises."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for event in OPENING:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        if then == "hang":
            await anyio.sleep_forever()
        if then == "engine":
            try:
                raise EngineDeadError("EngineCore encountered an issue. See stack trace (above) for the root cause.")
            except EngineDeadError as exc:
                raise RuntimeError("Caught handled exception, but response already started.") from exc
        raise ValueError("a generation error the stream generator does not catch")

    return app


def final_event(recorder: Recorder) -> dict[str, Any]:
    body = recorder.body
    assert body.startswith(b"".join(OPENING))
    tail = body[len(b"".join(OPENING)) :]
    assert tail.startswith(b"event: error\ndata: ") and tail.endswith(b"\n\n") and tail.count(b"\n\n") == 1
    event: dict[str, Any] = json.loads(tail[len(b"event: error\ndata: ") : -2])
    assert event["type"] == "error" and event["sequence_number"] == LAST_SEQUENCE + 1
    assert event["error"]["type"] == "server_shutdown" and event["error"]["retryable"] is True
    assert recorder.messages[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    return event


@pytest.mark.parametrize("resumable", [False, True])
async def test_the_deadline_ends_a_responses_stream_with_its_final_event(resumable: bool) -> None:
    """1. a Responses stream is in flight  2. the drain deadline passes  3. the stream ends with the Responses
    error event (resumable for a marked request), never response.completed; counted as a deadline cut"""
    mw = make(responses_app(then="hang"))
    recorder = Recorder(mw.drain)
    headers = [(b"x-graceful-resumable", b"1")] if resumable else []
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope("/v1/responses", headers=headers), no_body, recorder)
        with anyio.fail_after(5):
            while len(recorder.messages) < 1 + len(OPENING):
                await anyio.sleep(0.01)
        result = await mw.drain.drain(propagation_wait=0, timeout=0.2)
    event = final_event(recorder)
    assert event["error"].get("resumable", False) is resumable
    assert b"response.completed" not in recorder.body
    assert result.truncated == 1 and mw.drain.counters()["truncated"] == {"deadline": 1}


async def test_an_app_that_raises_mid_stream_ends_it_with_the_final_event_and_the_error_goes_on() -> None:
    """vLLM's Responses generator lets a generation error out of a started response: the caller gets the
    final event, the server still sees the app's exception, and the cut is counted as app_error."""
    mw = make(responses_app(then="raise"))
    recorder = Recorder(mw.drain)
    with pytest.raises(ValueError, match="generation error"):
        await mw(http_scope("/v1/responses"), no_body, recorder)
    final_event(recorder)
    assert mw.drain.counters()["truncated"] == {"app_error": 1}
    assert mw.drain.counters()["requests"]["error"] == 1 and mw.drain.in_flight == 0
    assert mw.drain.state is State.SERVING


async def test_an_engine_that_died_under_a_responses_stream_ends_it_and_fails_the_replica() -> None:
    mw = make(responses_app(then="engine"))
    recorder = Recorder(mw.drain)
    with pytest.raises(RuntimeError, match="already started"):
        await mw(http_scope("/v1/responses"), no_body, recorder)
    final_event(recorder)
    assert mw.drain.counters()["truncated"] == {"engine_error": 1}
    assert mw.drain.state is State.FAILED


async def test_a_chat_stream_the_app_raises_in_is_left_as_it_was() -> None:
    """Chat Completions streams keep their rule: an app that raises mid-stream cuts it (a resuming client
    continues a cut), and graceful adds no frame there."""
    mw = make(responses_app(then="raise"))
    recorder = Recorder(mw.drain)
    with pytest.raises(ValueError):
        await mw(http_scope("/v1/chat/completions"), no_body, recorder)
    assert recorder.body == b"".join(OPENING)
    assert mw.drain.counters()["truncated"] == {}
