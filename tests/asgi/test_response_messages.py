"""The messages of one response, as the middleware passes them on (docs/middleware.md, "In-flight accounting").

Raw scope/receive/send messages: frames without a body, trailers after the last body, an app that
raises after its final frame or mid-stream with its client gone, a stream the engine aborted with
``final_frame`` returning None, and the deadline's frame for a marked NDJSON stream.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from graceful import default_final_frame
from graceful._asgi._types import Message, Receive, Scope, Send
from tests.asgi.test_engine_abort import ABORT, CONTENT, DONE, sse_app
from tests.asgi.test_middleware_raw import Recorder, http_scope, make, no_body
from tests.asgi.test_responses_frame import responses_app

pytestmark = pytest.mark.anyio

NDJSON = b"application/x-ndjson"


def counted(mw: Any) -> dict[str, int]:
    return {outcome: n for outcome, n in mw.drain.counters()["requests"].items() if n}


async def test_a_frame_without_a_body_goes_to_the_server_as_it_is() -> None:
    """ASGI lets a body message leave "body" out: the frame passes as sent, and the request is counted
    until its last frame, once."""
    empty = {"type": "http.response.body", "more_body": True}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send(dict(empty))
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    mw = make(app)
    recorder = Recorder(mw.drain)
    await mw(http_scope(), no_body, recorder)
    assert recorder.messages[1] == empty
    assert recorder.in_flight_at_send == [1, 1, 1]
    assert counted(mw) == {"completed": 1} and mw.drain.in_flight == 0


async def test_the_count_ends_at_the_last_body_and_the_trailers_follow_it() -> None:
    """With response trailers, the count ends at the last body message, just before the trailers, which
    reach the server as sent."""
    trailers = {"type": "http.response.trailers", "headers": [(b"x-checksum", b"1")], "more_trailers": False}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [], "trailers": True})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})
        await send(dict(trailers))

    mw = make(app)
    recorder = Recorder(mw.drain)
    await mw(http_scope(), no_body, recorder)
    assert recorder.messages[-1] == trailers
    assert recorder.in_flight_at_send == [1, 1, 0]
    assert counted(mw) == {"completed": 1}


async def test_an_error_after_the_final_frame_is_the_servers_and_the_request_is_completed() -> None:
    """Work done after the final frame is not counted: an app that raises after it (a background task that
    fails) is counted completed, and the server sees the app's own exception."""
    failure = RuntimeError("a background task failed")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        raise failure

    mw = make(app)
    with pytest.raises(RuntimeError) as raised:
        await mw(http_scope(), no_body, Recorder(mw.drain))
    assert raised.value is failure
    assert counted(mw) == {"completed": 1}


async def test_a_responses_stream_the_app_raises_in_after_its_client_left_still_gives_the_server_the_error() -> None:
    """1. a Responses stream is half sent 2. its client leaves: the server's send raises 3. the app raises:
    graceful's final event cannot be sent 4. the server sees the app's own exception, counted as an error
    and an app_error cut."""

    class Gone(Recorder):
        async def __call__(self, message: Message) -> None:
            if message.get("body", b"").startswith(b"event: error"):
                raise OSError("the client has gone")
            await super().__call__(message)

    mw = make(responses_app(then="raise"))
    with pytest.raises(ValueError, match="generation error"):
        await mw(http_scope("/v1/responses"), no_body, Gone(mw.drain))
    assert counted(mw) == {"error": 1}
    assert mw.drain.counters()["truncated"] == {"app_error": 1}
    assert mw.drain.in_flight == 0


async def test_an_aborted_stream_with_no_final_frame_ends_without_one_and_without_done() -> None:
    """``final_frame`` returning None ends a stream early without a frame: an aborted stream's ``[DONE]``
    is still held back (it would pass for a whole answer), and the response ends empty."""
    mw = make(sse_app(CONTENT, ABORT, DONE), final_frame=lambda content_type: None)
    recorder = Recorder(mw.drain)
    await mw(http_scope("/v1/chat/completions"), no_body, recorder)
    assert recorder.body == CONTENT + ABORT
    assert recorder.messages[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert mw.drain.counters()["truncated"] == {"engine_abort": 1}


async def test_a_marked_ndjson_stream_cut_at_the_deadline_ends_with_the_plain_error_line() -> None:
    """The resumable final event is an SSE event: a marked request whose response is NDJSON gets the
    NDJSON error line at the deadline, as an unmarked one does."""
    streaming = anyio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", NDJSON)]})
        await send({"type": "http.response.body", "body": b'{"n": 1}\n', "more_body": True})
        streaming.set()
        await anyio.sleep_forever()

    mw = make(app)
    recorder = Recorder(mw.drain)
    async with anyio.create_task_group() as tg:
        tg.start_soon(mw, http_scope(headers=[(b"x-graceful-resumable", b"1")]), no_body, recorder)
        with anyio.fail_after(10):
            await streaming.wait()
        result = await mw.drain.drain(propagation_wait=0, timeout=0.05)
    assert recorder.body == b'{"n": 1}\n' + default_final_frame(NDJSON)  # type: ignore[operator]
    assert result.truncated == 1


async def test_a_refused_request_whose_client_leaves_mid_body_is_answered_with_connection_close() -> None:
    """A refusal reads and drops the request's body first; a client that leaves meanwhile sends nothing
    more, so the connection can be closed: the 503 says Connection: close."""
    mw = make(sse_app(DONE))
    mw.drain.begin_drain("test", propagation_wait=0)
    messages = iter(
        [{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}],
    )

    async def receive() -> Message:
        return next(messages)

    recorder = Recorder(mw.drain)
    await mw(http_scope(headers=[(b"content-length", b"100")]), receive, recorder)
    assert recorder.status == 503
    assert recorder.headers[b"connection"] == b"close"
