"""The splicing of one resumable stream, without I/O: which requests qualify, what the caller sees, what comes next.

``plan`` picks the requests a resuming transport may continue. ``Splice`` reads the
events of each attempt, decides whether to resume once an attempt has ended, builds the
continuation request's body and rewrites a continuation's events so that the caller
reads one stream. docs/resume.md describes the protocol.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import httpx

from .._stream._ends import ABORTED, DONE
from .._stream._rules import responses_path, server_failed
from ._attempts import RETRY_ATTEMPTS, Attempts, streamed_body
from ._responses import plan_responses

__all__ = ["RETRY_ATTEMPTS", "Kind", "Splice", "plan"]

Kind = Literal["chat", "completion", "responses"]


def plan(request: httpx.Request, body: bytes) -> tuple[Kind, dict[str, Any]] | None:
    """What kind of resumable request this is, and its JSON body; None to pass it through untouched."""
    if request.method != "POST":
        return None
    path = request.url.path.rstrip("/")
    if responses_path(path):
        payload = plan_responses(body)
        return None if payload is None else ("responses", payload)
    if path.endswith("/chat/completions"):
        kind: Kind = "chat"
    elif path.endswith("/completions"):
        kind = "completion"
    else:
        return None
    payload = streamed_body(body)
    if payload is None:
        return None
    n = payload.get("n")
    if n is not None and n != 1:
        return None  # several choices: one continuation cannot carry them all
    if kind == "chat":
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
    else:
        prompt = payload.get("prompt")
        one = isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str)
        if not (isinstance(prompt, str) or one or (_token_ids(prompt) and payload.get("return_token_ids") is True)):
            return None  # several prompts, or token ids that the stream will not extend
        if payload.get("echo"):
            return None  # the answer starts with the prompt: a continuation cannot say where it ends
    return kind, payload


def _token_ids(value: object) -> bool:
    """Whether ``value`` is a list of token ids (ints, not bools)."""
    return isinstance(value, list) and all(type(item) is int for item in value)


class Splice(Attempts):
    """The state of one resumable Chat Completions or Completions stream across its attempts.

    ``feed`` takes bytes from the current upstream response and returns the bytes to
    give the caller; ``verdict`` decides, once that response has ended, whether to
    resume; ``continuation`` builds the next request body. ``first`` holds the id, created
    and model of the first chunk; ``tokens`` counts one per chunk that carries text (or its
    token ids); ``done`` is ``[DONE]`` seen.
    """

    LIMITS = ("max_completion_tokens", "max_tokens")

    def __init__(self, kind: Kind, payload: dict[str, Any], max_resumes: int) -> None:
        super().__init__(payload, max_resumes)
        self.kind = kind
        self.text: list[str] = []
        self.finished = False  # a finish_reason seen
        self.in_tool_call = False
        # Token ids, when the server returns them (vLLM with "return_token_ids": true): the
        # prompt's, from the first chunk, and every completion token's. With both, a
        # continuation carries ids, not text, and is exact (docs/resume.md, "Exactness").
        self.prompt_ids: list[int] | None = None
        self.token_ids: list[int] = []
        self.ids_whole = True  # every chunk with text or tokens carried its token ids
        # After a chunk that finished with "abort" (an engine's abort, which vLLM ends like a
        # whole answer), the events that follow are held until the end says what it was.
        self.aborted = False
        self.held: list[bytes] = []
        # Chunks that carry token ids but no text yet (a character split across tokens: the server
        # sends its text once whole) are held too, until a chunk with text follows. At a cut they are
        # dropped, and their tokens generated again: a continuation whose prompt ends inside a
        # character streams that character wrongly (vLLM's text then began with the prompt's).
        self.textless: list[bytes] = []
        self.textless_ids = 0
        # An engine's 5xx error event (its core died mid-stream) is held too: graceful's final
        # event after it makes the stream resumable; without one it reaches the caller as sent.
        self.failed = False

    # -- reading an attempt ------------------------------------------------------------

    def _marker(self, data: bytes, raw: bytes) -> bytes | None:
        if data.strip() != b"[DONE]":
            return None
        self.done = True
        return self._release() + (DONE if self.resumes else raw)

    def _event(self, event: dict[str, Any], raw: bytes) -> bytes:
        error = event.get("error")
        if error is not None:
            if server_failed(error) and not self.failed:
                self.failed = True
                self.held.append(raw)
                return b""
            self.blocked = "an error event"
            return self._release() + raw
        if self.failed:  # an answer event after the engine's error: the error stands
            self.blocked = "an error event"
            return self._release() + raw
        self.events += 1  # a complete event of the answer (graceful's final event is not one)
        if self.first is None:
            self.first = {key: event[key] for key in ("id", "created", "model") if key in event}
            if _token_ids(event.get("prompt_token_ids")):  # chat: at the top of the first chunk
                self.prompt_ids = event["prompt_token_ids"]
        self._read_choices(event)
        out = raw
        if self.resumes:
            out = (
                b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n" if self._splice(event) else b""
            )
        if self.aborted:
            self.held.append(out)
            return b""
        ids = self._textless_ids(event)
        if ids:
            self.textless.append(out)
            self.textless_ids += ids
            return b""
        if self.textless:
            out = self._release_textless() + out
        return out

    def _textless_ids(self, event: dict[str, Any]) -> int:
        """How many token ids a chunk carries without text (0 for any other chunk): one choice, not
        finished, with ids, and neither text nor anything else in it to show."""
        choices = event.get("choices")
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            return 0
        choice = choices[0]
        ids = choice.get("token_ids")
        if choice.get("finish_reason") is not None or not ids or not _token_ids(ids):
            return 0
        if self.kind == "chat":
            delta = choice.get("delta")
            if not isinstance(delta, dict) or any(value for key, value in delta.items() if key != "role"):
                return 0
        elif choice.get("text"):
            return 0
        return len(ids)

    def _release_textless(self) -> bytes:
        textless, self.textless, self.textless_ids = self.textless, [], 0
        return b"".join(textless)

    def _release(self) -> bytes:
        """The events held (without text yet, or after an abort), for the caller: the stream ended as
        the server sent it."""
        held, self.held = self.held, []
        self.aborted = False
        return self._release_textless() + b"".join(held)

    def _rewind(self) -> None:
        """At a cut: the tokens of the chunks held without text are not carried over; the continuation
        generates them again, and sends the character whole. The chunks stay held: the caller gets them
        if no continuation answers. Once per cut, however often it is called."""
        if self.textless_ids:
            del self.token_ids[len(self.token_ids) - self.textless_ids :]
            self.tokens -= self.textless_ids
            self.events -= len(self.textless)
            self.textless_ids = 0

    def _read_choices(self, event: dict[str, Any]) -> None:
        choices = event.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) != 0:
                self.blocked = "a second choice"
            if self.kind == "chat":
                delta = choice.get("delta") or {}
                content = delta.get("content")
                if delta.get("tool_calls"):
                    self.in_tool_call = True
                if delta.get("reasoning_content") or delta.get("reasoning"):
                    self.blocked = "reasoning deltas (a continuation cannot carry them)"
            else:
                content = choice.get("text")
                if self.prompt_ids is None and _token_ids(choice.get("prompt_token_ids")):
                    self.prompt_ids = choice["prompt_token_ids"]  # completions: in the first choice
            ids = choice.get("token_ids")
            if isinstance(content, str) and content:
                self.text.append(content)
            if isinstance(ids, list) and _token_ids(ids):
                self.token_ids.extend(ids)
                self.tokens += len(ids)
            elif isinstance(content, str) and content:
                self.ids_whole = False
                self.tokens += 1
            reason = choice.get("finish_reason")
            if reason == ABORTED:
                self.aborted = True  # not a finish: held until the end of the stream tells
            elif reason is not None:
                self.finished = True
                self.in_tool_call = False

    def _splice(self, event: dict[str, Any]) -> bool:
        """Make a continuation's chunk read as part of the first response; False to drop it."""
        keep = True
        if self.first:
            event.update(self.first)
        if event.get("prompt_token_ids") is not None:
            event["prompt_token_ids"] = None  # the continuation's prompt holds the tokens carried over
        choices = event.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict) and choice.get("prompt_token_ids") is not None:
                    choice["prompt_token_ids"] = None
                delta = choice.get("delta") if isinstance(choice, dict) else None
                if isinstance(delta, dict) and "role" in delta:
                    del delta["role"]  # the caller has had its role delta
                    if not delta.get("content") and len(delta) <= 1 and choice.get("finish_reason") is None:
                        keep = False  # an empty opening chunk: nothing to show
        usage = event.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            carried = self.carried_tokens
            completion = usage.get("completion_tokens")
            usage["prompt_tokens"] = max(0, usage["prompt_tokens"] - carried)
            if isinstance(completion, int):
                usage["completion_tokens"] = completion + carried
                usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return keep

    # -- between attempts ----------------------------------------------------------------

    def _framing_verdict(self) -> str | None:
        if self.failed and self.shutdown is None:
            return "an error event"
        if self.in_tool_call:
            return "cut inside a tool call"
        if self.finished:
            return "cut after the finish reason"
        if self.kind == "completion" and _token_ids(self.payload.get("prompt")) and self.exact_ids() is None:
            return "a token-id prompt, and the stream did not return the token ids to extend it with"
        return None

    def _carry(self, body: dict[str, Any]) -> None:
        """The text so far as the model's own (or, exactly, its token ids)."""
        text = "".join(self.text)
        exact = self.exact_ids()
        if exact is not None and self.kind == "chat":
            # vLLM's decode-side token reuse: the ids go to the engine as they are, with no
            # chat template and no tokenizer (vllm/renderers/online_renderer.py).
            transfer = body.get("kv_transfer_params")
            body["kv_transfer_params"] = {**(transfer if isinstance(transfer, dict) else {}), "prompt_token_ids": exact}
        elif exact is not None:
            body["prompt"] = exact
        elif self.kind == "chat":
            messages = body["messages"]
            last = messages[-1] if messages else None
            if (
                isinstance(last, dict)
                and last.get("role") == "assistant"
                and body.get("continue_final_message") is True
                and isinstance(last.get("content"), str)
            ):
                last["content"] += text  # the caller prefilled the answer: it grows
            else:
                messages.append({"role": "assistant", "content": text})
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        else:
            prompt = body["prompt"]
            body["prompt"] = prompt + text if isinstance(prompt, str) else [prompt[0] + text]

    def exact_ids(self) -> list[int] | None:
        """The prompt's token ids and every one received, when the stream carried them all."""
        if self.prompt_ids is None or not self.ids_whole:
            return None
        return [*self.prompt_ids, *self.token_ids]

    def _held(self) -> bytes:
        return b"".join(self.textless) + b"".join(self.held)

    def _new_attempt(self) -> None:
        self.held = []  # the aborted attempt's last chunks: the continuation brings the rest
        self.textless, self.textless_ids = [], 0
        self.aborted = False
        self.failed = False
