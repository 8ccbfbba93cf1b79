"""The splicing of one resumable Responses API stream, without I/O (docs/resume.md, "The Responses API").

A Responses stream is ``event: <type>`` / ``data: <json>`` pairs with one increasing
``sequence_number`` and no ``[DONE]``: ``response.created`` and ``response.in_progress``, then per
output item ``output_item.added``, ``content_part.added``, the deltas and the ``.done`` events,
and last ``response.completed`` (``response.incomplete``, ``response.failed``). The shapes are vLLM's
(vllm/entrypoints/openai/responses/serving.py, ``responses_stream_generator``; the events of
streaming_events.py and the openai SDK's types, written by api_router.py's
``_convert_stream_to_sse_events``).

A cut answer is continued by sending the request again with the text so far as an incomplete assistant
message at the end of ``input``, which vLLM continues (it sets ``continue_final_message`` itself), with
the original response id as ``request_id`` and ``max_output_tokens`` lowered by the tokens received.
The continuation's events are rewritten into the caller's one response: its ids, item ids and output
indexes, one run of ``sequence_number``, and ``.done`` events and ``response.completed`` that carry the
whole text and the whole usage.
"""

from __future__ import annotations

import json
from typing import Any

from ._attempts import Attempts, streamed_body

__all__ = ["ResponsesSplice", "plan_responses"]

# The events that end a Responses answer.
_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})
# The events of a continuation that the caller has had already, for the same response or message.
_OPENING = frozenset({"response.created", "response.in_progress"})


def plan_responses(body: bytes) -> dict[str, Any] | None:
    """The request's JSON body when a Responses request can be continued elsewhere, else None.

    Not: a request that builds on a stored response (``previous_response_id``, ``conversation``), whose
    store is the replica's own; ``background`` mode, whose stream the replica keeps; anything that does
    not stream.
    """
    payload = streamed_body(body)
    if payload is None:
        return None
    if payload.get("previous_response_id") or payload.get("conversation") or payload.get("background"):
        return None
    if not isinstance(payload.get("input"), (str, list)):
        return None
    return payload


class ResponsesSplice(Attempts):
    """The state of one resumable Responses stream across its attempts.

    ``response`` is the response object of the first ``response.created`` (its id is the answer's);
    ``items`` the output items finished so far, as the caller saw them; ``current`` the message being
    written when the stream was cut (its id, indexes and text). ``seq`` is the last sequence number
    the caller got. ``tokens`` counts one per logprob where deltas carry them, else one per delta.
    """

    LIMITS = ("max_output_tokens",)

    def __init__(self, payload: dict[str, Any], max_resumes: int) -> None:
        super().__init__(payload, max_resumes)
        self.response: dict[str, Any] | None = None
        self.items: list[dict[str, Any]] = []
        self.current: dict[str, Any] | None = None
        self.seq = -1
        self.mapped: str | None = None  # the continuation's id for the caller's current message

    # -- reading an attempt ------------------------------------------------------------

    def _event(self, event: dict[str, Any], raw: bytes) -> bytes:
        kind = event.get("type")
        if kind == "error" or event.get("error") is not None:
            self.blocked = "an error event"
            return raw
        if self.resumes and not self._splice(event):
            return b""
        self._read(event)
        self.events += 1
        if not self.resumes:
            self.seq = event.get("sequence_number", self.seq)
            return raw
        self.seq += 1
        event["sequence_number"] = self.seq
        name = str(kind)
        return f"event: {name}\ndata: ".encode() + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"

    def _read(self, event: dict[str, Any]) -> None:
        """What the caller has now: the response, the finished items, the message being written."""
        kind = event.get("type")
        if kind == "response.created" and self.response is None:
            self.response = event.get("response") or {}
            self.first = {"id": self.response.get("id")}
        elif kind == "response.output_item.added":
            item = event.get("item") or {}
            if item.get("type") != "message":
                self.blocked = f"a {item.get('type')} item (a continuation cannot carry it)"
            self.current = {"id": item.get("id"), "output_index": event.get("output_index"), "text": ""}
        elif kind == "response.content_part.added" and self.current is not None:
            self.current["content_index"] = event.get("content_index", 0)
            if (event.get("part") or {}).get("type") != "output_text":
                self.blocked = "a content part that is not output text"
        elif kind == "response.output_text.delta" and self.current is not None:
            self.current["text"] += event.get("delta") or ""
            logprobs = event.get("logprobs")
            self.tokens += len(logprobs) if isinstance(logprobs, list) and logprobs else 1
        elif kind == "response.output_item.done":
            self.items.append(event.get("item") or {})
            self.current = None
        elif kind in _ENDS:
            self.done = True
        elif isinstance(kind, str) and kind.startswith(("response.reasoning", "response.function_call")):
            self.blocked = "reasoning or a tool call (a continuation cannot carry it)"

    def _splice(self, event: dict[str, Any]) -> bool:
        """Make a continuation's event read as part of the caller's response; False to drop it."""
        kind = event.get("type")
        if kind in _OPENING:
            return False
        current = self.current
        if kind == "response.output_item.added" and current is not None and self.mapped is None:
            self.mapped = (event.get("item") or {}).get("id")  # the continued message: the caller has it
            return False
        if kind == "response.content_part.added" and current is not None and event.get("item_id") == self.mapped:
            return False
        if current is not None and event.get("item_id") == self.mapped:
            event["item_id"] = current["id"]
            event["output_index"] = current["output_index"]
            event["content_index"] = current.get("content_index", 0)
            if kind == "response.output_text.done":
                event["text"] = current["text"]
            elif kind == "response.content_part.done":
                event["part"] = {**(event.get("part") or {}), "text": current["text"]}
        elif "output_index" in event:
            event["output_index"] = event["output_index"] + len(self.items)
        if kind == "response.output_text.delta" and current is not None and event.get("item_id") == current["id"]:
            return True  # its text is added by _read
        if kind == "response.output_item.done":
            item = event.get("item") or {}
            if current is not None and item.get("id") == self.mapped:
                item["id"] = current["id"]
                _set_item_text(item, current["text"])
            event["item"] = item
        if kind in _ENDS:
            event["response"] = self._whole_response(event.get("response") or {})
        return True

    def _whole_response(self, response: dict[str, Any]) -> dict[str, Any]:
        """The continuation's final response object as the caller's one response: its id, creation time
        and limits, every item, and the usage of every attempt."""
        first = self.response or {}
        whole = {**response}
        for name in ("id", "created_at", "max_output_tokens", "model"):
            if name in first:
                whole[name] = first[name]
        whole["output"] = [*self.items]  # the final item is already among them (output_item.done)
        usage = response.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
            carried = self.carried_tokens
            usage = {**usage, "output_tokens": usage["output_tokens"] + carried}
            if isinstance(usage.get("input_tokens"), int):
                usage["input_tokens"] = max(0, usage["input_tokens"] - carried)
            usage["total_tokens"] = usage.get("input_tokens", 0) + usage["output_tokens"]
            whole["usage"] = usage
        return whole

    # -- between attempts ----------------------------------------------------------------

    def _framing_verdict(self) -> str | None:
        return "cut before response.created" if self.response is None else None

    def _new_attempt(self) -> None:
        self.mapped = None

    def _carry(self, body: dict[str, Any]) -> None:
        """The items so far and the message being written, as ``input``."""
        given = body["input"]
        items: list[Any] = [{"role": "user", "content": given}] if isinstance(given, str) else list(given)
        for item in self.items:
            items.append(_as_input(item, "completed"))
        current = self.current
        if current is not None and current["text"]:
            items.append(_message(current["text"], "incomplete"))
        body["input"] = items
        if self.response is not None and self.response.get("id"):
            body["request_id"] = self.response["id"]  # vLLM names the response after it


def _message(text: str, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text}],
    }


def _as_input(item: dict[str, Any], status: str) -> dict[str, Any]:
    return _message(_item_text(item), status)


def _item_text(item: dict[str, Any]) -> str:
    parts = item.get("content") or []
    return "".join(part.get("text") or "" for part in parts if isinstance(part, dict))


def _set_item_text(item: dict[str, Any], text: str) -> None:
    parts = [part for part in item.get("content") or [] if isinstance(part, dict)]
    if parts:
        parts[0]["text"] = text
        item["content"] = parts[:1]
    else:
        item["content"] = [{"type": "output_text", "text": text, "annotations": []}]
