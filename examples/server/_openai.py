"""OpenAI request validation and response shapes for completions and chat completions (the Responses
API's are in ``_responses``).

The generated text is deterministic (``tok0 tok1 ...``) so a client can count the
tokens it received against the ``max_tokens`` it asked for (``token_word`` sets the word,
``tok`` unless configured otherwise). The "model" continues a
count: when the text it is given ends with ``tok0 tok1 ... tokK`` (a completions
prompt, or the final assistant message of a chat request with
``continue_final_message``), it goes on with `` tokK+1``. A continued stream therefore
holds exactly the tokens an uncut stream would have produced from there on.

The "tokenizer" splits text at whitespace and splits every ``tokN`` off as a token of
its own, so a prompt with generated text appended counts exactly those tokens more.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "DONE",
    "Frames",
    "Invalid",
    "Job",
    "chunk",
    "count_tokens",
    "counted",
    "error_body",
    "full_body",
    "json_body",
    "limit",
    "model_of",
    "parse",
    "streamed",
    "token_text",
    "usage_chunk",
]

Kind = Literal["completion", "chat", "responses"]


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
    start: int = 0  # the index of the first token: how far the given text has counted already
    include_usage: bool = False  # stream_options.include_usage: a final usage chunk before [DONE]
    word: str = "tok"  # the word of the count: tok0 tok1 ...


def parse(raw: bytes, kind: Kind, *, default_max_tokens: int, max_tokens: int, word: str = "tok") -> Job:
    body = json_body(raw)
    model = model_of(body)
    start = 0
    if kind == "completion":
        prompt = body.get("prompt", _MISSING)
        prompt_tokens = _prompt_tokens(prompt)
        start = counted(prompt if isinstance(prompt, str) else prompt[-1], word)
        name = "max_tokens"
    else:
        messages = body.get("messages", _MISSING)
        prompt_tokens = _message_tokens(messages)
        start = _continuation(body, messages, word)
        name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    wanted = limit(body, name, default_max_tokens, max_tokens)
    stream = streamed(body)
    include_usage = _include_usage(body.get("stream_options"), stream)
    prefix = "cmpl" if kind == "completion" else "chatcmpl"
    job_id = f"{prefix}-{uuid.uuid4().hex}"
    return Job(kind, model, prompt_tokens, wanted, stream, job_id, int(time.time()), start, include_usage, word)


def json_body(raw: bytes) -> dict[str, Any]:
    """The request's JSON object, or the 400 that says what is wrong with it."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise Invalid(f"The request body is not valid JSON ({exc}); send a JSON object.", None) from None
    if not isinstance(body, dict):
        raise Invalid("The request body must be a JSON object.", None)
    return body


def model_of(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise Invalid("'model' is required and must be a non-empty string.", "model")
    return model


def limit(body: dict[str, Any], name: str, default: int, most: int) -> int:
    """The request's token limit ``name``: the default where it is missing or null."""
    wanted = body.get(name, default)
    if wanted is None:
        wanted = default
    if isinstance(wanted, bool) or not isinstance(wanted, int) or not 1 <= wanted <= most:
        raise Invalid(f"'{name}' must be a whole number from 1 to {most}, got {wanted!r}.", name)
    return wanted


def streamed(body: dict[str, Any]) -> bool:
    stream = body.get("stream", False)
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise Invalid(f"'stream' must be true or false, got {stream!r}.", "stream")
    return stream


def _include_usage(options: object, stream: bool) -> bool:
    """vLLM's rules: stream_options only with stream=true; include_usage a boolean."""
    if options is None:
        return False
    if not stream:
        raise Invalid("'stream_options' can only be set when 'stream' is true.", "stream_options")
    if not isinstance(options, dict):
        raise Invalid(f"'stream_options' must be an object, got {options!r}.", "stream_options")
    include = options.get("include_usage", False)
    if include is None:
        return False
    if not isinstance(include, bool):
        raise Invalid(f"'stream_options.include_usage' must be true or false, got {include!r}.", "stream_options")
    return include


def _continuation(body: dict[str, Any], messages: list[dict[str, Any]], word: str) -> int:
    """Where a chat request starts counting: past the final assistant message with continue_final_message."""
    cont = body.get("continue_final_message", False)
    add = body.get("add_generation_prompt", True)
    if not isinstance(cont, bool) or not isinstance(add, bool):
        param = "continue_final_message" if not isinstance(cont, bool) else "add_generation_prompt"
        raise Invalid(f"'{param}' must be true or false.", param)
    if not cont:
        return 0
    if add:
        raise Invalid(
            "Cannot set both 'continue_final_message' and 'add_generation_prompt' to true; "
            "set 'add_generation_prompt': false to continue the final message.",
            "continue_final_message",
        )
    if messages[-1].get("role") != "assistant":
        raise Invalid(
            "'continue_final_message' needs an assistant message last, to continue; "
            f"messages[{len(messages) - 1}] has role {messages[-1].get('role')!r}.",
            "continue_final_message",
        )
    return counted(messages[-1]["content"], word)


def counted(text: str, word: str) -> int:
    """How many tokens of the count ``tok0 tok1 ...`` end ``text`` (0 if it does not end with one)."""
    at = text.rfind(f"{word}0")
    if at < 0:
        return 0
    words = text[at:].split(" ")
    if words != [f"{word}{i}" for i in range(len(words))]:
        return 0
    return len(words)


_TOKEN = re.compile(r"tok\d+|(?:(?!tok\d)\S)+")


def count_tokens(text: str) -> int:
    """The example's tokenizer: whitespace-separated words, with every ``tokN`` a token of its own."""
    return len(_TOKEN.findall(text))


_MISSING = object()


def _prompt_tokens(prompt: object) -> int:
    if isinstance(prompt, str):
        return count_tokens(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return sum(count_tokens(p) for p in prompt)
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
        total += count_tokens(content)
    return total


def error_body(message: str, *, type: str, param: str | None = None, code: str | int | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type, "param": param, "code": code}}).encode()


def token_text(index: int, word: str = "tok") -> str:
    return f"{word}{index}" if index == 0 else f" {word}{index}"


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
    """The SSE event for the job's token ``index`` (from 0); the last one carries ``finish_reason``."""
    finish = "length" if index == job.max_tokens - 1 else None
    text = token_text(job.start + index, job.word)
    if job.kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    else:
        delta = {"role": "assistant", "content": text} if index == 0 else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    event = {**_envelope(job, served_model, True), "choices": [choice]}
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def usage_chunk(job: Job, served_model: str) -> bytes:
    """The final chunk of ``stream_options.include_usage``: no choices, the usage of the whole request."""
    event = {**_envelope(job, served_model, True), "choices": [], "usage": _usage(job)}
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def full_body(job: Job, served_model: str) -> bytes:
    text = "".join(token_text(job.start + i, job.word) for i in range(job.max_tokens))
    if job.kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
    else:
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "length"}
    return json.dumps({**_envelope(job, served_model, False), "choices": [choice], "usage": _usage(job)}).encode()


class Frames:
    """The frames of one chat or completion answer: none before the tokens, one chunk per token, then the
    usage chunk where asked for and ``[DONE]``; ``body`` is the answer not streamed."""

    def __init__(self, job: Job, served_model: str) -> None:
        self.job = job
        self.model = served_model

    def opening(self) -> list[bytes]:
        return []

    def token(self, index: int) -> bytes:
        return chunk(self.job, self.model, index)

    def closing(self) -> list[bytes]:
        return [usage_chunk(self.job, self.model), DONE] if self.job.include_usage else [DONE]

    def body(self) -> bytes:
        return full_body(self.job, self.model)
