"""OpenAI request validation and response shapes for completions and chat completions.

The generated text is deterministic (``tok0 tok1 ...``) so a client can count the
tokens it received against the ``max_tokens`` it asked for.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["DONE", "Invalid", "Job", "chunk", "error_body", "full_body", "parse", "token_text"]

Kind = Literal["completion", "chat"]


class Invalid(ValueError):
    """A request field is wrong; ``param`` names it in the 400 answer."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Job:
    """One validated generation request."""

    kind: Kind
    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    id: str
    created: int


def parse(raw: bytes, kind: Kind, *, default_max_tokens: int, max_tokens: int) -> Job:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise Invalid(f"The request body is not valid JSON ({exc}); send a JSON object.", None) from None
    if not isinstance(body, dict):
        raise Invalid("The request body must be a JSON object.", None)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise Invalid("'model' is required and must be a non-empty string.", "model")
    if kind == "completion":
        prompt_tokens = _prompt_tokens(body.get("prompt", _MISSING))
    else:
        prompt_tokens = _message_tokens(body.get("messages", _MISSING))
    wanted = body.get("max_tokens", default_max_tokens)
    if wanted is None:
        wanted = default_max_tokens
    if isinstance(wanted, bool) or not isinstance(wanted, int) or not 1 <= wanted <= max_tokens:
        raise Invalid(f"'max_tokens' must be a whole number from 1 to {max_tokens}, got {wanted!r}.", "max_tokens")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise Invalid(f"'stream' must be true or false, got {stream!r}.", "stream")
    prefix = "cmpl" if kind == "completion" else "chatcmpl"
    return Job(kind, model, prompt_tokens, wanted, stream, f"{prefix}-{uuid.uuid4().hex}", int(time.time()))


_MISSING = object()


def _prompt_tokens(prompt: object) -> int:
    if isinstance(prompt, str):
        return len(prompt.split())
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return sum(len(p.split()) for p in prompt)
    raise Invalid("'prompt' is required and must be a string or a non-empty list of strings.", "prompt")


def _message_tokens(messages: object) -> int:
    if not isinstance(messages, list) or not messages:
        raise Invalid("'messages' is required and must be a non-empty list.", "messages")
    total = 0
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise Invalid(f"messages[{index}] must be an object with a string 'role'.", f"messages[{index}].role")
        content = message.get("content")
        if not isinstance(content, str):
            raise Invalid(f"messages[{index}].content must be a string.", f"messages[{index}].content")
        total += len(content.split())
    return total


def error_body(message: str, *, type: str, param: str | None = None, code: str | int | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type, "param": param, "code": code}}).encode()


def token_text(index: int) -> str:
    return f"tok{index}" if index == 0 else f" tok{index}"


def _usage(job: Job) -> dict[str, int]:
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": job.max_tokens,
        "total_tokens": job.prompt_tokens + job.max_tokens,
    }


def _envelope(job: Job, served_model: str, streaming: bool) -> dict[str, Any]:
    if job.kind == "completion":
        obj = "text_completion"
    else:
        obj = "chat.completion.chunk" if streaming else "chat.completion"
    return {"id": job.id, "object": obj, "created": job.created, "model": served_model}


def chunk(job: Job, served_model: str, index: int) -> bytes:
    """The SSE event for token ``index``; the last one carries ``finish_reason``."""
    finish = "length" if index == job.max_tokens - 1 else None
    text = token_text(index)
    if job.kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    else:
        delta = {"role": "assistant", "content": text} if index == 0 else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    event = {**_envelope(job, served_model, True), "choices": [choice]}
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def full_body(job: Job, served_model: str) -> bytes:
    text = "".join(token_text(i) for i in range(job.max_tokens))
    if job.kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
    else:
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "length"}
    return json.dumps({**_envelope(job, served_model, False), "choices": [choice], "usage": _usage(job)}).encode()
