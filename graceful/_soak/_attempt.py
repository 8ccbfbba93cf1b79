"""One soak attempt: send the request, read the answer (JSON or SSE) and judge how it ended.

The distinction that matters most is *when* a connection died: before it was
established (``refused``: safe to retry), after the request was sent but before any
response header (``ambiguous``: it may have run), or after the body started
(``truncated``: it ran, at least partly).

With ``graceful soak --resume``, a stream read through the resuming transport ends
``resumed`` when it is complete after one or more continuations. A stream whose text
begins with the example server's count (``tok0 tok1 ...``) is also checked token by
token: the text the transport spliced must be exactly the uncut stream's, or the
stream ends ``token_mismatch``. Other servers' text is not judged.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from .._stream._ends import ends_whole
from .._stream._rules import NOT_STARTED_HEADER, event_stream, final_event, json_object
from ._report import Attempt

__all__ = ["COUNT_WORD", "Outcome", "count_mismatch", "describe", "run_attempt"]

# The OpenAI SDK retries these statuses (openai-python `_should_retry`).
_RETRY_STATUSES = frozenset({408, 409, 429})
# The example server's deterministic "model" counts: tok0 tok1 tok2 ... (examples/server/_openai.py).
COUNT_WORD = "tok"
# LiteLLM's proxy hands its callers the upstream's headers prefixed so: the replica's name behind it.
_GATEWAY_SERVED_BY = "llm_provider-x-served-by"


@dataclass
class Outcome:
    """What one attempt's answer says beyond its reason: tokens and retry hints."""

    expected: int = 0
    tokens: int = 0
    done: bool = False  # the stream's [DONE] arrived
    retry_after: float | None = None
    should_retry: bool | None = None
    text: list[str] | None = None  # the stream's text pieces, when its count is to be checked
    exact: bool = False  # exactly ``expected`` tokens were asked for (ignore_eos)

    def retryable(self, attempt: Attempt) -> bool:
        """The OpenAI SDK's rule, except that nothing is retried once a successful body has begun."""
        if attempt.reason in ("refused", "ambiguous"):
            return True
        if attempt.reason == "timeout":
            return not attempt.headers
        if attempt.reason not in ("rejected_retryable", "http_error") or attempt.status is None:
            return False
        if attempt.status < 300:  # a 2xx with an error inside: its body has begun
            return False
        if self.should_retry is not None:
            return self.should_retry
        return attempt.status in _RETRY_STATUSES or attempt.status >= 500

    def delay(self, n: int, *, base: float, cap: float, rng: random.Random) -> float:
        if self.retry_after is not None and 0 < self.retry_after <= 60:
            return self.retry_after
        return min(base * 2.0**n, cap) * (1 - 0.25 * rng.random())


async def run_attempt(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    stream: bool,
    attempt: Attempt,
    outcome: Outcome,
) -> None:
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            attempt.headers, attempt.status = True, response.status_code
            attempt.served_by = response.headers.get("x-served-by") or response.headers.get(_GATEWAY_SERVED_BY)
            attempt.replay = response.headers.get("x-idempotent-replay", "").lower() == "true"
            attempt.not_started = NOT_STARTED_HEADER in response.headers
            outcome.retry_after = _seconds(response.headers.get("retry-after"))
            hint = response.headers.get("x-should-retry", "").lower()
            outcome.should_retry = {"true": True, "false": False}.get(hint)
            if stream and response.status_code < 300 and event_stream(response.headers.get("content-type", "")):
                await _read_stream(response, attempt, outcome)
            else:
                await _read_body(response, attempt, outcome, stream)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        attempt.reason, attempt.error = "refused", describe(exc)
    except httpx.TimeoutException as exc:
        attempt.reason, attempt.error = "timeout", describe(exc)
    except httpx.RequestError as exc:
        if attempt.not_started:
            attempt.reason = "rejected_retryable"
        elif outcome.done and attempt.reason == "truncated" and attempt.error is None:
            # The answer is complete for the client, which stops reading at [DONE], as the SDK does.
            attempt.reason = "ok"
        elif attempt.reason != "ended_by_server":
            attempt.reason = "truncated" if attempt.headers else "ambiguous"
        attempt.error = describe(exc)


async def _read_body(response: httpx.Response, attempt: Attempt, outcome: Outcome, stream: bool) -> None:
    chunks = []
    attempt.reason = "truncated"  # until the body is complete
    async for chunk in response.aiter_bytes():
        attempt.bytes += len(chunk)
        chunks.append(chunk)
    status = response.status_code
    if attempt.not_started and status == 503:
        attempt.reason = "rejected_retryable"
        return
    if status >= 300:
        attempt.reason, attempt.error = "http_error", f"HTTP {status}: {b''.join(chunks)[:200]!r}"
        return
    if stream:
        attempt.reason = "http_error"
        attempt.error = f"asked for a stream, got content-type {response.headers.get('content-type')!r}"
        return
    try:
        data = json.loads(b"".join(chunks))
        finish = data["choices"][0].get("finish_reason")
        usage = data.get("usage") or {}
        outcome.tokens = int(usage.get("completion_tokens") or 0)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        # Valid JSON of the wrong shape (a list, a number, choices of strings) is as invalid as none.
        attempt.error = f"invalid completion body ({attempt.bytes} bytes)"
        return
    attempt.reason = _judge(finish, usage, attempt, outcome)


async def _read_stream(response: httpx.Response, attempt: Attempt, outcome: Outcome) -> None:
    attempt.reason = "truncated"  # until [DONE] or the server's final frame
    try:
        finish, usage = await _read_events(response, attempt, outcome)
    finally:
        # The resuming transport counts its continuations on the response it gives the caller.
        attempt.resumes = int(response.extensions.get("graceful_resumes", 0))
    if attempt.reason == "ended_by_server":
        return
    if attempt.error is not None and not attempt.error.startswith("malformed"):
        attempt.reason = "http_error"
    elif not outcome.done:
        attempt.error = "stream ended without [DONE]"
    elif attempt.error is None:
        chunks = outcome.tokens
        if usage.get("completion_tokens") is not None:
            outcome.tokens = int(usage["completion_tokens"])
        attempt.reason = _judge(finish, usage, attempt, outcome)
        if attempt.reason == "ok" and outcome.text is not None:
            attempt.error = count_mismatch("".join(outcome.text), chunks, usage, outcome.expected)
            if attempt.error is not None:
                attempt.reason = "token_mismatch"
        if attempt.reason == "ok" and attempt.resumes:
            attempt.reason = "resumed"


async def _read_events(response: httpx.Response, attempt: Attempt, outcome: Outcome) -> tuple[Any, dict[str, Any]]:
    """Read the SSE events to the end: counts, text, errors and [DONE] go to ``attempt`` and ``outcome``."""
    buffer, data_lines = b"", []
    finish = None
    usage: dict[str, Any] = {}
    async for chunk in response.aiter_bytes():
        attempt.bytes += len(chunk)
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                data_lines.append(line[5:].removeprefix(b" "))
                continue
            if line or not data_lines:
                continue  # comments, other fields, stray blank lines
            event, data_lines = b"\n".join(data_lines), []
            if ends_whole(event):
                outcome.done = True
                continue
            frame = _frame(event)
            if frame is None:
                attempt.error = f"malformed event {event[:80]!r}"
                continue
            if "error" in frame:
                if final_event(frame["error"]):
                    attempt.reason = "ended_by_server"
                else:
                    attempt.error = f"error event: {event[:200]!r}"
                continue
            for choice in frame.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    outcome.tokens += 1
                    if outcome.text is not None:
                        outcome.text.append(str(content))
                finish = choice.get("finish_reason") or finish
            usage = frame.get("usage") or usage
    return finish, usage


def _frame(event: bytes) -> dict[str, Any] | None:
    """The event as a chunk object whose choices, deltas and usage have the shapes read; None otherwise."""
    frame = json_object(event)
    if frame is None:
        return None
    choices, usage = frame.get("choices") or [], frame.get("usage") or {}
    if not isinstance(choices, list) or not isinstance(usage, dict):
        return None
    if not all(isinstance(c, dict) and isinstance(c.get("delta") or {}, dict) for c in choices):
        return None
    return frame if isinstance(usage.get("completion_tokens") or 0, int) else None


def _judge(finish: Any, usage: Mapping[str, Any], attempt: Attempt, outcome: Outcome) -> str:
    if outcome.exact:
        # ignore_eos: a whole answer stops for length, and its usage (when sent) counts every token asked for.
        counted = usage.get("completion_tokens") is not None
        if finish != "length" or (counted and outcome.tokens != outcome.expected):
            got = f"{outcome.tokens} of " if counted else "? of "
            attempt.error = f"finish_reason {finish!r} after {got}{outcome.expected} tokens asked with ignore_eos"
            return "truncated"
        return "ok"
    # Stopping for length with fewer tokens than asked for means the server cut the answer short.
    if finish == "length" and usage.get("completion_tokens") is not None and outcome.tokens < outcome.expected:
        attempt.error = f"finish_reason length after {outcome.tokens} of {outcome.expected} tokens"
        return "truncated"
    return "ok"


def count_mismatch(text: str, chunks: int, usage: Mapping[str, Any], expected: int) -> str | None:
    """How a stream of the example server's count differs from ``tok0 ... tok{expected-1}``; None if it does not.

    Text that does not begin with ``tok0`` is some other server's: not judged.
    """
    if not text.startswith(f"{COUNT_WORD}0"):
        return None
    got, want = text.split(" "), [f"{COUNT_WORD}{i}" for i in range(expected)]
    for index, (seen, wanted) in enumerate(zip(got, want)):
        if seen != wanted:
            return f"token {index} is {seen!r}, expected {wanted!r}"
    if len(got) != len(want):
        return f"{len(got)} tokens of the count, expected {expected}"
    completion = usage.get("completion_tokens")
    if completion is not None and completion != chunks:
        return f"usage says {completion} completion tokens, the stream carried {chunks}"
    return None


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
