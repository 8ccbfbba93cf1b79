"""Behind ``--gateway litellm``, Responses callers: ``/v1/responses`` streams read by clients that run none of our code.

Three kinds of caller take turns: the openai SDK for Node's ``responses.create({stream: true})`` and its
``responses.stream()`` helper (``node tests/node/responses.mjs BASE_URL MODEL MAX_OUTPUT_TOKENS API_KEY
HOW``), and ``curl -N`` reading the raw event stream. LiteLLM sends each to the replicas' own
``/v1/responses`` (its native path), which the example server serves in vLLM's framing, and graceful's
handler continues a stream that a replica hands off. Each stream is judged as the demo judges its own:
whole (``ok``) when it read one response: one response id, one run of ``sequence_number`` from 0, the
deltas spelling the example's exact count ``tok0 ... tokN-1``, and ``response.completed`` with that
text and usage counting every token; ``token_mismatch`` when the text or usage is wrong; ``truncated``
when it ended otherwise after it began, ``http_error`` when it failed before. Records are
``RequestRecord`` s with ids ``responses-...``.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from graceful.soak import Attempt, RequestRecord

from ..server import token_text
from .node import ROOT, run_client

__all__ = ["RESPONSES_KINDS", "RESPONSES_PREFIX", "Read", "judge_read", "read_events", "responses_streams"]

CLIENT = os.path.join(ROOT, "tests", "node", "responses.mjs")
RESPONSES_PREFIX = "responses-"  # the request id of every Responses stream begins so
# The callers, in turn: the Node SDK's two ways to stream a response, and curl -N.
RESPONSES_KINDS = ("node-create", "node-stream", "curl")


@dataclass
class Read:
    """What a caller read of one Responses stream: the response ids its events named, their sequence
    numbers, the deltas' text, the final response (its event, status, whole text and usage), an error."""

    ids: set[str] = field(default_factory=set)
    sequence: list[int] = field(default_factory=list)
    text: str = ""
    final: dict[str, Any] | None = None
    error: str | None = None


def read_events(lines: list[str]) -> Read:
    """The ``data:`` lines of a Responses event stream (as ``curl -N`` prints it), read."""
    read = Read()
    for line in lines:
        if not line.startswith("data: "):
            continue
        try:
            event = json.loads(line[6:])
        except ValueError:
            read.error = f"not JSON: {line[:120]!r}"
            continue
        kind = event.get("type")
        read.sequence.append(event.get("sequence_number"))
        response = event.get("response") or {}
        if response.get("id"):
            read.ids.add(response["id"])
        if kind == "response.output_text.delta":
            read.text += event.get("delta") or ""
        elif kind in ("response.completed", "response.incomplete"):
            output = response.get("output") or []
            whole = "".join(part.get("text") or "" for item in output for part in item.get("content") or [])
            usage = response.get("usage")
            read.final = {"event": kind, "status": response.get("status"), "text": whole, "usage": usage}
        elif kind in ("response.failed", "error"):
            read.error = f"{kind}: {json.dumps(response.get('error') or event.get('error') or event)[:200]}"
    return read


def _read_node(lines: list[str]) -> Read:
    """tests/node/responses.mjs's lines: one per event, then its end or its error."""
    read = Read()
    for line in lines:
        try:
            record: dict[str, Any] = json.loads(line)
        except ValueError:
            continue
        if "event" in record:
            read.sequence.append(len(read.sequence))  # counted here; the end line has the numbers
        elif "end" in record:
            end = record["end"]
            read.ids, read.sequence, read.text, read.final = set(end["ids"]), end["sequence"], end["text"], end["final"]
        elif "error" in record:
            read.error, read.text = f"the SDK raised: {str(record['error'])[:200]}", record.get("text") or ""
    return read


def judge_read(read: Read, attempt: Attempt, tokens: int) -> int:
    """Judge one caller's read into ``attempt``; the deltas it read (one per token)."""
    begun = bool(read.sequence)
    if begun:
        attempt.headers, attempt.status = True, 200
    expected = "".join(token_text(index) for index in range(tokens))
    final = read.final
    if read.error is not None or final is None:
        attempt.reason = "truncated" if begun else "http_error"
        attempt.error = read.error or "the stream ended without response.completed"
    elif len(read.ids) != 1 or read.sequence != list(range(len(read.sequence))):
        attempt.reason = "truncated"
        attempt.error = f"response ids {sorted(read.ids)!r}, sequence numbers {read.sequence[:8]!r}..."
    elif read.text != expected or final["text"] != expected:
        attempt.reason = "token_mismatch"
        attempt.error = f"text {read.text[:40]!r}, final {final['text'][:40]!r} for {tokens} tokens asked"
    elif (final.get("usage") or {}).get("output_tokens") != tokens:
        attempt.reason = "token_mismatch"
        attempt.error = f"usage {final.get('usage')!r} for {tokens} tokens asked"
    else:
        attempt.reason = "ok"
    return len(read.text.split()) if read.text else 0


def _judge_node(lines: list[str], attempt: Attempt, tokens: int) -> int:
    return judge_read(_read_node(lines), attempt, tokens)


def _judge_curl(lines: list[str], attempt: Attempt, tokens: int) -> int:
    return judge_read(read_events(lines), attempt, tokens)


async def responses_streams(
    base: str,
    *,
    model: str,
    tokens: int,
    api_key: str,
    callers: int,
    timeout: float,
    stop: anyio.Event,
    keep: Callable[[RequestRecord], None],
    node: bool,
) -> None:
    """``callers`` Responses callers (the kinds in turn; curl alone without ``node``) streaming ``tokens``
    tokens each, back to back, until ``stop``."""
    run = secrets.token_hex(4)
    issued = 0
    kinds = RESPONSES_KINDS if node else ("curl",)

    async def caller(kind: str) -> None:
        nonlocal issued
        while not stop.is_set():
            issued += 1
            request_id = f"{RESPONSES_PREFIX}{kind}-{run}-{issued:06d}"
            if kind == "curl":
                body = {"model": model, "input": "Count for me please", "max_output_tokens": tokens, "stream": True}
                argv = [
                    "curl", "-sS", "-N", "--max-time", f"{timeout:g}", f"{base}/v1/responses",
                    "-H", "content-type: application/json", "-H", f"authorization: Bearer {api_key}",
                    "-d", json.dumps(body),
                ]  # fmt: skip
                keep(await run_client(request_id, argv, tokens, timeout, _judge_curl))
            else:
                how = kind.removeprefix("node-")
                argv = ["node", CLIENT, f"{base}/v1", model, str(tokens), api_key, how]
                keep(await run_client(request_id, argv, tokens, timeout, _judge_node))

    async with anyio.create_task_group() as tg:
        for index in range(callers):
            tg.start_soon(caller, kinds[index % len(kinds)])
