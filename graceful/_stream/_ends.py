"""How an OpenAI-style event stream, as vLLM writes it, ends: whole at ``data: [DONE]``, or early.

The middleware reads the last two frames of a stream here when its ``[DONE]`` arrives, and the
sequence number its own final event of a Responses stream must carry; the resuming transport reads
``[DONE]`` and the abort's finish reason here. Nothing here runs per frame: only once a stream ends.
"""

from __future__ import annotations

import re

from ._rules import engine_dead, json_object, server_failed

__all__ = ["ABORTED", "DONE", "ENGINE_ABORT", "ENGINE_ERROR", "ended_early", "ends_whole", "next_sequence_number"]

# The end of an OpenAI-style stream. (The middleware's send compares each frame with it written as
# a constant, the cheapest check per frame; tests/resume/test_stream_rules.py holds the two alike.)
DONE = b"data: [DONE]\n\n"
# Its event's data: a marker, not JSON.
_DONE_DATA = DONE.removeprefix(b"data: ").strip()
# The finish reason vLLM gives a request it aborts (its shutdown timeout, a scale-down, an abort
# call), which it then ends with [DONE] as if it had completed (vllm-project/vllm#57082).
ABORTED = "abort"
# The reasons of graceful_truncated_streams for a stream the engine ended (docs/metrics.md).
ENGINE_ABORT = "engine_abort"
ENGINE_ERROR = "engine_error"

_ABORT = f'"{ABORTED}"'.encode()
# How vLLM's stream generators write an error mid-stream: ``data: {"error": {...}}``
# (vllm/entrypoints/openai/chat_completion/serving.py, create_streaming_error_response).
_ERROR_EVENT = b'data: {"error"'
# The sequence number of a Responses API event, as vLLM writes it (compact or not).
_SEQUENCE = re.compile(rb'"sequence_number":\s*(\d+)')


def ends_whole(data: bytes) -> bool:
    """Whether an event's data (its ``data:`` lines joined) is the end of a whole stream: ``[DONE]``."""
    return data.strip() == _DONE_DATA


def ended_early(before: bytes | None, last: bytes) -> tuple[str, str, str | None] | None:
    """Why an event stream whose last two frames before ``[DONE]`` were ``before`` and ``last`` is not a
    whole answer: (reason, what happened, the engine's error when it says the engine has died), or None.

    An engine that fails mid-stream (its core process dies, a generation error) sends an error event
    with a 5xx ``code`` and then ``[DONE]`` (vLLM's stream generators). An aborted request ends with
    the finish chunk, then a usage chunk when the client asked for one, then ``[DONE]``.
    """
    if last.startswith(_ERROR_EVENT):
        error = (json_object(last[5:]) or {}).get("error")
        if not server_failed(error):
            return None
        said = _describe(error)
        return (
            ENGINE_ERROR,
            f"the engine ended the stream with an error ({said})",
            (said if engine_dead(error) else None),
        )
    frames = [frame for frame in (before, last) if frame is not None and _ABORT in frame]
    if any(map(_aborted, frames)):
        return ENGINE_ABORT, "the engine aborted the stream", None
    return None


def next_sequence_number(before: bytes | None, last: bytes | None) -> int:
    """One past the last ``sequence_number`` of a Responses stream whose last two frames are given, else 0."""
    numbers = _SEQUENCE.findall(b"".join(frame for frame in (before, last) if frame is not None))
    return int(numbers[-1]) + 1 if numbers else 0


def _describe(error: object) -> str:
    assert isinstance(error, dict)
    return f"{error.get('code')} {error.get('type', '')}: {error.get('message', '')}".strip()


def _aborted(frame: bytes) -> bool:
    """Whether an SSE frame holds an OpenAI-style chunk with a choice that finished with "abort"."""
    for line in frame.splitlines():
        if not line.startswith(b"data:"):
            continue
        choices = (json_object(line[5:]) or {}).get("choices")
        if isinstance(choices, list) and any(
            isinstance(choice, dict) and choice.get("finish_reason") == ABORTED for choice in choices
        ):
            return True
    return False
