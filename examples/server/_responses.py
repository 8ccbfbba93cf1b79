"""The Responses API (``POST /v1/responses``) as vLLM 0.32 frames it, over the example's counting "model".

The shapes follow vLLM's files under ``vllm/entrypoints/openai/responses/``:

- ``serving.py``: ``responses_stream_generator`` (``response.created`` and ``response.in_progress``,
  the output's events, then ``response.completed``, one increasing ``sequence_number`` from 0) and
  ``responses_full_generator`` (the response not streamed; status ``incomplete`` when the answer ended at
  ``max_output_tokens``, with its usage);
- ``streaming_events.py``: ``SimpleStreamingEventProcessor`` (a message item: ``output_item.added``,
  ``content_part.added``, one ``output_text.delta`` per token, then the ``.done`` events with the whole
  text);
- ``api_router.py``: ``_convert_stream_to_sse_events`` (``event: <type>`` and ``data: <json>``, compact);
- ``protocol.py``: ``ResponsesResponse.from_request`` (the response object; ``request_id`` names the
  response) and ``utils.py``'s ``should_continue_final_message`` (a message last in ``input`` whose status
  is ``in_progress`` or ``incomplete`` is continued, not answered).

So a continuation that graceful's resuming transport sends (docs/resume.md, "The Responses API") goes on
counting where the text it carries stopped, as a chat continuation does.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ._openai import Invalid, Job, count_tokens, counted, json_body, limit, model_of, streamed, token_text

__all__ = ["ResponsesFrames", "parse_responses"]

_CONTINUED = ("in_progress", "incomplete")


def parse_responses(raw: bytes, *, default_max_tokens: int, max_tokens: int, word: str = "tok") -> Job:
    """One validated Responses request: ``input`` a string or a list of messages, ``max_output_tokens``."""
    body = json_body(raw)
    model = model_of(body)
    for name in ("previous_response_id", "conversation", "background"):
        if body.get(name):
            raise Invalid(
                f"'{name}' needs a stored response, and this server stores none; send the whole conversation "
                "as 'input'.",
                name,
            )
    given = body.get("input")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise Invalid("'instructions' must be a string.", "instructions")
    prompt_tokens = count_tokens(instructions or "")
    start = 0
    if isinstance(given, str):
        prompt_tokens += count_tokens(given)
    elif isinstance(given, list) and given:
        texts = [_item_text(item, index) for index, item in enumerate(given)]
        prompt_tokens += sum(count_tokens(text) for text in texts)
        if given[-1].get("status") in _CONTINUED:
            start = counted(texts[-1], word)
    else:
        raise Invalid("'input' is required and must be a string or a non-empty list of messages.", "input")
    wanted = limit(body, "max_output_tokens", default_max_tokens, max_tokens)
    stream = streamed(body)
    request_id = body.get("request_id")
    if request_id is not None and (not isinstance(request_id, str) or not request_id):
        raise Invalid("'request_id' must be a non-empty string.", "request_id")
    response_id = request_id or f"resp_{uuid.uuid4().hex}"
    return Job("responses", model, prompt_tokens, wanted, stream, response_id, int(time.time()), start, False, word)


def _item_text(item: object, index: int) -> str:
    """The text of one ``input`` message: its content, a string or a list of text parts."""
    where = f"input[{index}]"
    if not isinstance(item, dict) or item.get("type", "message") != "message" or not isinstance(item.get("role"), str):
        raise Invalid(f"{where} must be a message: an object with a string 'role' and a 'content'.", where)
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(part, dict) and isinstance(part.get("text"), str) for part in content
    ):
        return "".join(part["text"] for part in content)
    raise Invalid(f"{where}.content must be a string or a list of parts with a string 'text'.", f"{where}.content")


class ResponsesFrames:
    """The events of one Responses answer, numbered in the order they are taken: the opening events, one
    ``response.output_text.delta`` per token, the closing events; ``body`` is the response not streamed."""

    def __init__(self, job: Job, served_model: str) -> None:
        self.job = job
        self.model = served_model
        self.item = f"msg_{uuid.uuid4().hex[:16]}"
        self.sequence = 0

    def opening(self) -> list[bytes]:
        begun = self._response("in_progress", [], None)
        message = {**self._message("", "in_progress"), "content": []}
        return [
            self._event("response.created", response=begun),
            self._event("response.in_progress", response=begun),
            self._event("response.output_item.added", item=message, output_index=0),
            self._event("response.content_part.added", **self._at(), part=self._part("", [])),
        ]

    def token(self, index: int) -> bytes:
        text = token_text(self.job.start + index, self.job.word)
        return self._event("response.output_text.delta", **self._at(), delta=text, logprobs=[])

    def closing(self) -> list[bytes]:
        text = self._text()
        return [
            self._event("response.output_text.done", **self._at(), text=text, logprobs=[]),
            self._event("response.content_part.done", **self._at(), part=self._part(text, None)),
            self._event("response.output_item.done", item=self._message(text, "completed"), output_index=0),
            self._event("response.completed", response=self._finished()),
        ]

    def body(self) -> bytes:
        return json.dumps(self._finished()).encode()

    # -- the pieces -------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {**fields, "sequence_number": self.sequence, "type": kind}
        self.sequence += 1
        return f"event: {kind}\ndata: ".encode() + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"

    def _at(self) -> dict[str, Any]:
        return {"content_index": 0, "item_id": self.item, "output_index": 0}

    def _text(self) -> str:
        job = self.job
        return "".join(token_text(job.start + index, job.word) for index in range(job.max_tokens))

    @staticmethod
    def _part(text: str, logprobs: list[Any] | None) -> dict[str, Any]:
        return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}

    def _message(self, text: str, status: str) -> dict[str, Any]:
        content = [self._part(text, None)]
        return {"id": self.item, "content": content, "role": "assistant", "status": status, "type": "message"}

    def _finished(self) -> dict[str, Any]:
        """The whole response: every token asked for was generated, so it ended at ``max_output_tokens``."""
        job = self.job
        usage = {
            "input_tokens": job.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": job.max_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": job.prompt_tokens + job.max_tokens,
        }
        return self._response("incomplete", [self._message(self._text(), "completed")], usage)

    def _response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        job = self.job
        return {
            "id": job.id,
            "created_at": job.created,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": None,
            "metadata": None,
            "model": self.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": True,
            "temperature": 1.0,
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "background": False,
            "max_output_tokens": job.max_tokens,
            "previous_response_id": None,
            "reasoning": None,
            "service_tier": "auto",
            "status": status,
            "text": None,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
        }
