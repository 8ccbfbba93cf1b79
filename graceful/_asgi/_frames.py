"""The last frame of a stream that the drain deadline ends (docs/deadline.md, "At the deadline")."""

from __future__ import annotations

import json
from collections.abc import Callable

__all__ = ["FinalFrame", "default_final_frame", "responses_final_event", "resumable_final_frame", "shutdown_error"]

# Given the response's content type, return the bytes to send before ending the
# stream, or None to end it without a frame (the request is then only cancelled).
FinalFrame = Callable[[bytes], "bytes | None"]


_RETRY = "The server is shutting down; retry the request with the same idempotency key."
_CONTINUE = "The server is shutting down; continue the stream on another replica (docs/resume.md)."


def _error_object(message: str, resumable: bool) -> dict[str, object]:
    """graceful's error object: the one the final frames, the deadline's 503 and the Responses event carry."""
    error: dict[str, object] = {"type": "server_shutdown", "message": message, "retryable": True, "code": 503}
    if resumable:
        error["resumable"] = True
    return error


def shutdown_error(message: str = _RETRY, *, resumable: bool = False) -> bytes:
    return json.dumps({"error": _error_object(message, resumable)}, separators=(",", ":")).encode()


_ERROR = shutdown_error()
_RESUMABLE = shutdown_error(_CONTINUE, resumable=True)


def default_final_frame(content_type: bytes) -> bytes | None:
    """An OpenAI-style error event for SSE, an error line for NDJSON, nothing otherwise."""
    media = content_type.split(b";", 1)[0].strip().lower()
    if media == b"text/event-stream":
        return b"data: " + _ERROR + b"\n\n"
    if media in (b"application/x-ndjson", b"application/jsonl", b"application/jsonlines"):
        return _ERROR + b"\n"
    return None


def resumable_final_frame(content_type: bytes) -> bytes | None:
    """The final SSE event for a request that carried ``x-graceful-resumable: 1``: ``"resumable": true``."""
    if content_type.split(b";", 1)[0].strip().lower() == b"text/event-stream":
        return b"data: " + _RESUMABLE + b"\n\n"
    return default_final_frame(content_type)


def responses_final_event(sequence_number: int, *, resumable: bool = False) -> bytes:
    """The final event of a Responses API stream that graceful ends early (docs/protocol.md, "The final frame").

    An ``error`` event of the Responses framing (``type``, ``code``, ``message``, ``param`` and the next
    ``sequence_number``) that also carries graceful's ``error`` object: the openai SDK raises ``APIError``
    on a data object with a top-level ``error`` (its ``_streaming.py``), where a bare ``error`` event or
    ``response.failed`` would end its iteration as if the answer were whole.
    """
    error = _error_object(_CONTINUE if resumable else _RETRY, resumable)
    event = {
        "type": "error",
        "code": "server_shutdown",
        "message": error["message"],
        "param": None,
        "sequence_number": sequence_number,
        "error": error,
    }
    return b"event: error\ndata: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"
