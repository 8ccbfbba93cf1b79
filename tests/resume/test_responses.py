"""Responses API streams: graceful's final event in their own framing, and a cut answer continued as one response.

The events are a real vLLM 0.32's (tests/resume/fixtures/README.md names the upstream files). The
openai SDK reads the spliced stream through ``httpx.MockTransport``: ``responses.create(stream=True)``
and the ``responses.stream()`` helper both get one response with ``response.completed``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import graceful
from graceful._asgi._frames import responses_final_event
from graceful._resume._responses import ResponsesSplice, plan_responses

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

FIXTURES = Path(__file__).parent / "fixtures"
REQUEST = {"model": "graceful-tiny", "input": "hello world, the server drains", "stream": True, "max_output_tokens": 8}


def events(name: str) -> list[bytes]:
    raw = (FIXTURES / name).read_bytes()
    return [part + b"\n\n" for part in raw.split(b"\n\n") if part.strip()]


def data(event: bytes) -> dict[str, Any]:
    line = next(line for line in event.split(b"\n") if line.startswith(b"data: "))
    parsed: dict[str, Any] = json.loads(line[6:])
    return parsed


FIRST = events("responses_first.sse")
CONTINUED = events("responses_continued.sse")
# The first response cut after its first delta, as graceful ends it: its final event, resumable.
CUT_AT = next(i for i, event in enumerate(FIRST) if data(event)["type"] == "response.output_text.delta") + 1
CUT = FIRST[:CUT_AT] + [responses_final_event(data(FIRST[CUT_AT - 1])["sequence_number"] + 1, resumable=True)]


def test_the_final_event_is_the_responses_error_event_with_gracefuls_error() -> None:
    event = responses_final_event(7, resumable=True)
    assert event.startswith(b"event: error\ndata: ") and event.endswith(b"\n\n")
    body = data(event)
    assert body["type"] == "error" and body["code"] == "server_shutdown" and body["sequence_number"] == 7
    assert body["error"]["type"] == "server_shutdown" and body["error"]["retryable"] and body["error"]["resumable"]
    assert "resumable" not in data(responses_final_event(0))["error"]


def sse(*parts: bytes) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=httpx.ByteStream(b"".join(parts)))


def client(*answers: httpx.Response, resume: bool = True) -> tuple[openai.OpenAI, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        sent.append({"headers": dict(request.headers), "body": json.loads(request.content)})
        return answers[len(sent) - 1]

    mock: httpx.BaseTransport = httpx.MockTransport(upstream)
    transport = graceful.ResumingTransport(mock) if resume else mock
    return openai.OpenAI(
        base_url="http://replica.test/v1", api_key="x", http_client=httpx.Client(transport=transport), max_retries=0
    ), sent


def test_a_cut_stream_makes_the_sdk_raise_without_the_transport() -> None:
    """graceful's final event on a Responses stream: the openai SDK raises, never a quiet end."""
    sdk, _ = client(sse(*CUT), resume=False)
    with pytest.raises(openai.APIError, match="shutting down"):
        for _ in sdk.responses.create(**REQUEST):
            pass


def test_a_cut_answer_is_continued_as_one_response() -> None:
    """1. the first response is cut after its first delta with graceful's resumable final event
    2. the transport sends the continuation: the request marked, input = the prompt and the incomplete
       assistant message, the original response id as request_id, max_output_tokens lowered
    3. the caller reads one response: the first response's id and item id, one run of sequence numbers,
       the whole text in the .done events and response.completed, the usage of both attempts"""
    sdk, sent = client(sse(*CUT), sse(*CONTINUED))
    seen = list(sdk.responses.create(**REQUEST))
    assert len(sent) == 2 and all(one["headers"]["x-graceful-resumable"] == "1" for one in sent)
    first_id = data(FIRST[0])["response"]["id"]
    item_id = data(FIRST[2])["item"]["id"]
    head = data(CUT[CUT_AT - 1])["delta"]
    body = sent[1]["body"]
    assert body["request_id"] == first_id
    assert body["input"][0] == {"role": "user", "content": REQUEST["input"]}
    content = [{"type": "output_text", "text": head}]
    assert body["input"][-1] == {"type": "message", "role": "assistant", "status": "incomplete", "content": content}
    assert body["max_output_tokens"] == 8 - 1
    assert [event.sequence_number for event in seen] == list(range(len(seen)))
    assert [event.type for event in seen].count("response.created") == 1
    deltas = "".join(event.delta for event in seen if event.type == "response.output_text.delta")
    continued = "".join(data(e)["delta"] for e in CONTINUED if data(e)["type"] == "response.output_text.delta")
    assert deltas == head + continued
    assert {event.item_id for event in seen if hasattr(event, "item_id")} == {item_id}
    done = next(event for event in seen if event.type == "response.output_text.done")
    assert done.text == deltas
    completed = seen[-1]
    assert completed.type == "response.completed" and completed.response.id == first_id
    assert completed.response.output_text == deltas and completed.response.output[0].id == item_id
    usage = data(CONTINUED[-1])["response"]["usage"]
    assert completed.response.usage.output_tokens == usage["output_tokens"] + 1
    assert completed.response.usage.total_tokens == completed.response.usage.input_tokens + usage["output_tokens"] + 1


def test_the_stream_helper_reads_one_final_response() -> None:
    """The SDK's responses.stream() helper accumulates the spliced events into one final response."""
    sdk, _ = client(sse(*CUT), sse(*CONTINUED))
    with sdk.responses.stream(**{k: v for k, v in REQUEST.items() if k != "stream"}) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    continued = "".join(data(e)["delta"] for e in CONTINUED if data(e)["type"] == "response.output_text.delta")
    assert final.id == data(FIRST[0])["response"]["id"]
    assert final.output_text == data(CUT[CUT_AT - 1])["delta"] + continued


def test_logprobs_count_the_tokens_carried() -> None:
    """With include: ["message.output_text.logprobs"] each delta says how many tokens it holds."""
    logprobs = events("responses_logprobs.sse")
    splice = ResponsesSplice(dict(REQUEST), 3)
    splice.feed(b"".join(logprobs[:6]))
    expected = sum(len(data(e)["logprobs"]) for e in logprobs[:6] if data(e)["type"] == "response.output_text.delta")
    assert splice.tokens == expected > 0


@pytest.mark.parametrize(
    "extra",
    [{"previous_response_id": "resp_1"}, {"conversation": "conv_1"}, {"background": True}, {"stream": False}],
    ids=["previous-response", "conversation", "background", "not-streamed"],
)
def test_requests_built_on_a_replicas_own_state_are_not_marked(extra: dict[str, Any]) -> None:
    assert plan_responses(json.dumps({**REQUEST, **extra}).encode()) is None
    sdk, sent = client(sse(*FIRST))
    try:
        for _ in sdk.responses.create(**{**REQUEST, **extra}):
            pass
    except (openai.APIError, TypeError, AttributeError):
        pass  # what the SDK makes of a non-streamed call over a stream is beside the point
    assert "x-graceful-resumable" not in sent[0]["headers"]


def reasoning(kind: str) -> bytes:
    item = {"id": "rs_1", "type": kind, "summary": [], "status": "in_progress"}
    event = {"item": item, "output_index": 0, "sequence_number": 2, "type": "response.output_item.added"}
    return b"event: response.output_item.added\ndata: " + json.dumps(event).encode() + b"\n\n"


@pytest.mark.parametrize("kind", ["reasoning", "function_call"])
def test_a_cut_inside_reasoning_or_a_tool_call_is_not_continued_and_the_caller_sees_it(kind: str) -> None:
    """The continuation cannot carry reasoning or half a tool call: no second request, and the caller
    gets graceful's final event, so the SDK raises."""
    cut = [*FIRST[:2], reasoning(kind), responses_final_event(3, resumable=True)]
    sdk, sent = client(sse(*cut))
    with pytest.raises(openai.APIError, match="shutting down"):
        for _ in sdk.responses.create(**REQUEST):
            pass
    assert len(sent) == 1


@pytest.mark.parametrize(
    "body",
    [b"not json", b'{"stream": true, "input": 3}', json.dumps({**REQUEST, "input": {"role": "user"}}).encode()],
    ids=["not-json", "input-a-number", "input-an-object"],
)
def test_bodies_that_cannot_be_continued_are_left_alone(body: bytes) -> None:
    assert plan_responses(body) is None


def test_the_splice_passes_what_it_does_not_read_and_stops_at_what_it_cannot_carry() -> None:
    """A keep-alive comment and a data value that is not an object pass as they came; nothing follows the
    answer's end; an event that is not JSON, a server's error event or a part that is not text stops the
    stream from resuming."""
    splice = ResponsesSplice(dict(REQUEST), 3)
    assert splice.feed(b": keep-alive\n\n") == b": keep-alive\n\n"
    assert splice.feed(b"data: [1, 2]\n\n") == b"data: [1, 2]\n\n"
    whole = b"".join(FIRST)
    assert splice.feed(whole) == whole and splice.done and splice.verdict() == "complete"
    assert splice.feed(FIRST[3]) == b""  # nothing after response.completed
    for bad, why in [
        (b"data: {not json\n\n", "an event that is not JSON"),
        (b'event: error\ndata: {"type":"error","code":"x","message":"m","sequence_number":5}\n\n', "an error event"),
    ]:
        blocked = ResponsesSplice(dict(REQUEST), 3)
        blocked.feed(b"".join(FIRST[:4]) + bad)
        assert blocked.verdict() == why
    part = data(FIRST[3])
    part["part"]["type"] = "refusal"
    other = ResponsesSplice(dict(REQUEST), 3)
    other.feed(b"".join(FIRST[:3]) + b"event: x\ndata: " + json.dumps(part).encode() + b"\n\n")
    assert other.verdict() == "a content part that is not output text"


def test_a_cut_before_the_response_began_or_with_no_tokens_left_is_not_continued() -> None:
    before = ResponsesSplice(dict(REQUEST), 3)
    before.feed(responses_final_event(0, resumable=True))
    assert before.verdict() == "cut before response.created"
    spent = ResponsesSplice({**REQUEST, "max_output_tokens": 1}, 3)
    spent.feed(b"".join(CUT))
    assert spent.verdict() == "no tokens left to generate"
    bounded = ResponsesSplice(dict(REQUEST), 0)
    bounded.feed(b"".join(CUT))
    assert bounded.verdict() == "max_resumes=0 reached"
