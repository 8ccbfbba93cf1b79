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
    splice.feed(completion(" work", [379], prompt_ids=[77, 477, 554]) + completion("", [218]) + completion("s", [9]))
    splice.feed(SHUTDOWN)
    assert json.loads(splice.continuation())["prompt"] == [77, 477, 554, 379, 218, 9]


# vLLM's continuation from a prompt of token ids that ends inside a character streams that character
# wrongly: measured on vLLM 0.32 (CPU, the tests' tiny model), a completion continued right after a chunk
# with ids and no text began its text with the prompt's first word ("hello" where the uncut answer had
# "\ufffd eve"), at 15 of 16 such cuts, and at none of the cuts right after a chunk with text.


def test_a_chunk_without_text_reaches_the_caller_with_the_next_one() -> None:
    """A chunk with token ids and no text (a byte of a character not yet whole) is held until a chunk
    with text follows; the caller gets both, in order, and every token id."""
    splice = Splice("completion", {"model": "m", "prompt": "hi", "stream": True, "return_token_ids": True}, 3)
    first = completion(" work", [379], prompt_ids=[77])
    assert splice.feed(first) == first
    held = completion("", [218])
    assert splice.feed(held) == b""
    after = completion("\u00e9", [219])
    assert splice.feed(after) == held + after
    last = completion("", [220])
    assert splice.feed(last) == b""
    assert splice.feed(DONE) == last + DONE  # the end shows what was held


def test_a_cut_after_chunks_without_text_continues_before_them() -> None:
    """1. a token with text, then two without (a character split across three tokens)  2. the final
    event  3. the continuation's prompt stops after the last token with text, max_tokens counts only
    the tokens carried over, and the caller never sees the two held chunks: the continuation sends
    those tokens again, with the character whole."""
    splice = Splice("completion", {"model": "m", "prompt": "hi", "stream": True, "return_token_ids": True,
                                   "max_tokens": 10}, 3)  # fmt: skip
    seen = splice.feed(completion(" work", [379], prompt_ids=[77]) + completion("", [218]) + completion("", [5]))
    splice.feed(SHUTDOWN)
    assert splice.verdict() is None
    body = json.loads(splice.begin_resume("shutdown event", "http://x/v1/completions"))  # type: ignore[arg-type]
    assert body["prompt"] == [77, 379] and body["max_tokens"] == 9
    assert json.loads(splice.continuation())["prompt"] == [77, 379]  # once per cut
    again = completion("\u00e9", [218, 5], prompt_ids=[77, 379])
    out = splice.feed(again + completion("!", [6], finish="length") + DONE)
    ids = [i for part in (seen + out).split(b"\n\n") if part.startswith(b"data: {")
           for i in json.loads(part[6:])["choices"][0]["token_ids"]]  # fmt: skip
    assert ids == [379, 218, 5, 6]
    assert b'"text":""' not in out


def test_chunks_without_text_before_a_cut_that_is_not_continued_reach_the_caller() -> None:
    """No continuation answers: the cut is shown as it came, the held chunks and the final event."""
    splice = Splice("chat", {**CHAT, "return_token_ids": True}, max_resumes=3)
    splice.feed(chat("", [], role=True, prompt_token_ids=[1]) + chat("a", [2]))
    held = chat("", [3])
    assert splice.feed(held + SHUTDOWN) == b""
    body = json.loads(splice.begin_resume("shutdown event", "http://x/v1/chat/completions"))  # type: ignore[arg-type]
    assert body["kv_transfer_params"] == {"prompt_token_ids": [1, 2]}
    assert splice.surfaced() == held + SHUTDOWN


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
