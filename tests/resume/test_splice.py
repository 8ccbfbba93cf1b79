"""The splicing rules on their own (sans I/O), fed with frames in the shapes a real vLLM 0.32 sends.

The chunks are those of ``vllm/entrypoints/openai/chat_completion/serving.py`` and
``completion/serving.py`` with ``"return_token_ids": true``: chat puts the prompt's token ids
at the top of its first chunk, completions in the first choice, and every chunk's choice
carries the token ids it adds (some add a token and no text: a byte of a character not yet
whole). tests/vllm/ runs the same protocol against a real vLLM.
"""

from __future__ import annotations

import json
from typing import Any

from graceful._resume._splice import Splice

SHUTDOWN = b'data: {"error":{"type":"server_shutdown","message":"m","retryable":true,"code":503,"resumable":true}}\n\n'
DONE = b"data: [DONE]\n\n"


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def chat(content: str | None, ids: list[int], *, finish: str | None = None, role: bool = False, **top: Any) -> bytes:
    delta = {} if content is None else {"content": content}
    if role:
        delta = {"role": "assistant", **delta}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "token_ids": ids}
    return event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                  "choices": [choice], **top})  # fmt: skip


def completion(text: str, ids: list[int], *, prompt_ids: list[int] | None = None, finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "finish_reason": finish, "prompt_token_ids": prompt_ids, "token_ids": ids}
    return event({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "choices": [choice]})


USAGE = event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
               "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}})  # fmt: skip
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 10}


def opened_chat() -> tuple[Splice, bytes]:
    splice = Splice("chat", {**CHAT, "return_token_ids": True}, max_resumes=3)
    seen = splice.feed(chat("", [], role=True, prompt_token_ids=[0, 4, 204]))
    seen += splice.feed(chat("Frame", [854]) + chat("", [182]) + chat("\u00e9x", [465]))
    return splice, seen


def test_token_ids_make_a_chat_continuation_exact() -> None:
    """1. three tokens, one of them without text  2. the final event  3. the continuation carries
    the prompt's ids and the three received as vLLM's kv_transfer_params.prompt_token_ids, and
    max_tokens shrinks by 3 (not by the 2 chunks with text)."""
    splice, _ = opened_chat()
    splice.feed(SHUTDOWN)
    assert splice.verdict() is None
    body = json.loads(splice.continuation())
    assert body["kv_transfer_params"] == {"prompt_token_ids": [0, 4, 204, 854, 182, 465]}
    assert body["messages"] == CHAT["messages"] and "continue_final_message" not in body
    assert body["max_tokens"] == 7


def test_a_continuations_prompt_ids_are_not_shown_to_the_caller() -> None:
    splice, _ = opened_chat()
    splice.feed(SHUTDOWN)
    splice.begin_resume("shutdown event", "http://x/v1/chat/completions")  # type: ignore[arg-type]
    out = splice.feed(chat("", [], role=True, prompt_token_ids=[0, 4, 204, 854, 182, 465]) + chat("y", [77]))
    events = [json.loads(part.removeprefix(b"data: ")) for part in out.split(b"\n\n") if part]
    assert len(events) == 1  # the continuation's opening chunk (role, no text) is dropped
    assert events[0].get("prompt_token_ids") is None
    assert events[0]["choices"][0]["delta"] == {"content": "y"}


def test_a_completion_continues_with_a_token_id_prompt() -> None:
    splice = Splice("completion", {"model": "m", "prompt": "hello world", "stream": True, "return_token_ids": True}, 3)
    splice.feed(completion(" work", [379], prompt_ids=[77, 477, 554]) + completion("", [218]))
    splice.feed(SHUTDOWN)
    assert json.loads(splice.continuation())["prompt"] == [77, 477, 554, 379, 218]


def test_without_token_ids_the_text_continues() -> None:
    splice = Splice("chat", CHAT, max_resumes=3)
    splice.feed(event({"id": "c", "choices": [{"index": 0, "delta": {"content": "ab"}, "finish_reason": None}]}))
    splice.feed(SHUTDOWN)
    body = json.loads(splice.continuation())
    assert body["messages"][-1] == {"role": "assistant", "content": "ab"}
    assert "kv_transfer_params" not in body and body["continue_final_message"] is True


def test_a_token_id_prompt_without_returned_ids_is_not_resumed() -> None:
    payload = {"model": "m", "prompt": [1, 2, 3], "stream": True, "return_token_ids": True}
    splice = Splice("completion", payload, 3)
    splice.feed(event({"id": "c", "choices": [{"index": 0, "text": "ab", "finish_reason": None}]}))
    splice.feed(SHUTDOWN)
    assert splice.verdict() == "a token-id prompt, and the stream did not return the token ids to extend it with"


def test_an_engine_abort_then_the_final_event_resumes() -> None:
    """vLLM's abort chunk and usage chunk, then graceful's final event in place of [DONE]: the two
    chunks are held from the caller, the stream resumes, and they are never shown."""
    splice, seen = opened_chat()
    held = splice.feed(chat("", [], finish="abort") + USAGE + SHUTDOWN)
    assert held == b""
    assert splice.verdict() is None
    splice.begin_resume("shutdown event", "http://x/v1/chat/completions")  # type: ignore[arg-type]
    splice.resumed()  # the continuation answered
    assert splice.surfaced() == b""


def test_an_engine_abort_that_ends_with_done_reaches_the_caller_as_sent() -> None:
    """A server that does not mark the abort (no graceful in front): the caller gets the abort
    chunk, the usage chunk and [DONE], in order, once [DONE] arrives; nothing resumes."""
    splice, _ = opened_chat()
    tail = chat("", [], finish="abort") + USAGE + DONE
    assert splice.feed(tail) == tail
    assert splice.verdict() == "complete"


def test_an_abort_final_event_that_is_not_resumed_shows_everything() -> None:
    splice = Splice("chat", {**CHAT, "return_token_ids": True}, max_resumes=0)
    splice.feed(chat("x", [5], prompt_token_ids=[1]))
    tail = chat("", [], finish="abort") + USAGE
    splice.feed(tail + SHUTDOWN)
    assert splice.verdict() == "max_resumes=0 reached"
    assert splice.surfaced() == tail + SHUTDOWN


# vLLM's error event for a dead engine core (the frame of tests/asgi/test_engine_abort.py, from
# vllm/entrypoints/openai/chat_completion/serving.py and vllm/v1/engine/exceptions.py).
ENGINE_DEAD = (
    b'data: {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.", '
    b'"type": "InternalServerError", "param": null, "code": 500}}\n\n'
)


def test_an_engine_error_then_the_final_event_resumes() -> None:
    """The engine died mid-stream; graceful ended the stream with its final event in place of
    [DONE]: the error is held from the caller, the stream resumes, and the error is never shown."""
    splice, _ = opened_chat()
    assert splice.feed(ENGINE_DEAD) == b""
    assert splice.feed(SHUTDOWN) == b""
    assert splice.verdict() is None
    splice.begin_resume("shutdown event", "http://x/v1/chat/completions")  # type: ignore[arg-type]
    splice.resumed()  # the continuation answered
    assert splice.surfaced() == b""


def test_an_engine_error_without_graceful_reaches_the_caller_as_sent() -> None:
    """No graceful in front: the error, then [DONE], reach the caller in order; nothing resumes."""
    splice, _ = opened_chat()
    assert splice.feed(ENGINE_DEAD) == b""
    assert splice.feed(DONE) == ENGINE_DEAD + DONE
    assert splice.verdict() == "complete"


def test_an_engine_error_then_a_cut_is_not_resumed() -> None:
    """The error and then the connection closed, without graceful's final event: not resumed, and
    the caller gets the error as the server sent it."""
    splice, _ = opened_chat()
    splice.feed(ENGINE_DEAD)
    assert splice.verdict() == "an error event"
    assert splice.surfaced() == ENGINE_DEAD


def test_a_client_error_event_is_not_held() -> None:
    """A 400 mid-stream is the request's own fault: passed on at once, and the stream is not resumed."""
    splice, _ = opened_chat()
    bad = b'data: {"error": {"message": "m", "type": "BadRequestError", "param": null, "code": 400}}\n\n'
    assert splice.feed(bad) == bad
    splice.feed(SHUTDOWN)
    assert splice.verdict() == "an error event"


def test_a_continuation_that_never_answers_shows_the_cut_as_it_came() -> None:
    """The engine died mid-stream and graceful's final event followed; no continuation answers (every
    replica refused it, or another 500): the caller gets the engine's error and the final event, so a
    cut answer never ends quietly like a whole one."""
    splice, _ = opened_chat()
    splice.feed(ENGINE_DEAD + SHUTDOWN)
    splice.begin_resume("shutdown event", "http://x/v1/chat/completions")  # type: ignore[arg-type]
    assert splice.surfaced() == ENGINE_DEAD + SHUTDOWN
    assert splice.surfaced() == b""  # once
