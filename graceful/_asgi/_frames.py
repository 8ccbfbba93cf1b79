"""The last frame of a stream that the drain deadline ends (docs/deadline.md, "At the deadline")."""

from __future__ import annotations

import json
from collections.abc import Callable

from .._stream._rules import event_stream, final_error, media_type

__all__ = ["FinalFrame", "default_final_frame", "responses_final_event", "resumable_final_frame", "shutdown_error"]

# Given the response's content type, return the bytes to send before ending the
# stream, or None to end it without a frame (the request is then only cancelled).
FinalFrame = Callable[[bytes], "bytes | None"]


_RETRY = "The server is shutting down; retry the request with the same idempotency key."
_CONTINUE = "The server is shutting down; continue the stream on another replica (docs/resume.md)."


def shutdown_error(message: str = _RETRY, *, resumable: bool = False) -> bytes:
    return json.dumps({"error": final_error(message, resumable=resumable)}, separators=(",", ":")).encode()


_ERROR = shutdown_error()
_RESUMABLE = shutdown_error(_CONTINUE, resumable=True)


def default_final_frame(content_type: bytes) -> bytes | None:
    """An OpenAI-style error event for SSE, an error line for NDJSON, nothing otherwise."""
    if event_stream(content_type):
        return b"data: " + _ERROR + b"\n\n"
    if media_type(content_type) in ("application/x-ndjson", "application/jsonl", "application/jsonlines"):
        return _ERROR + b"\n"
    return None


def resumable_final_frame(content_type: bytes) -> bytes | None:
    """The final SSE event for a request that carried ``x-graceful-resumable: 1``: ``"resumable": true``."""
    if event_stream(content_type):
        return b"data: " + _RESUMABLE + b"\n\n"
    return default_final_frame(content_type)


def responses_final_event(sequence_number: int, *, resumable: bool = False) -> bytes:
    """The final event of a Responses API stream that graceful ends early (docs/protocol.md, "The final frame").

    An ``error`` event of the Responses framing (``type``, ``code``, ``message``, ``param`` and the next
    ``sequence_number``) that also carries graceful's ``error`` object: the openai SDK raises ``APIError``
    on a data object with a top-level ``error`` (its ``_streaming.py``), where a bare ``error`` event or
    ``response.failed`` would end its iteration as if the answer were whole.
    """
    error = final_error(_CONTINUE if resumable else _RETRY, resumable=resumable)
    event = {
        "type": "error",
        "code": error["type"],
        "message": error["message"],
        "param": None,
        "sequence_number": sequence_number,
        "error": error,
    }
    return b"event: error\ndata: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"
