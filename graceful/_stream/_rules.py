"""What an OpenAI-style stream or error says, read the same way by the middleware and the resuming transport.

The server side (``_asgi``) and the client side (``_resume``, and ``_soak``'s reading of an answer)
must agree on these: a copy on each side would drift. No I/O, and nothing here runs on the
middleware's hot path (per request or per frame): there, only once a stream or a response ends early.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "NOT_STARTED_HEADER",
    "RESUMABLE_HEADER",
    "engine_dead",
    "engine_dead_body",
    "engine_dead_exception",
    "event_stream",
    "final_error",
    "final_event",
    "json_object",
    "media_type",
    "responses_path",
    "server_failed",
]

# A client that can continue a cut stream elsewhere says so on its request (docs/resume.md).
RESUMABLE_HEADER = "x-graceful-resumable"
# Marks a 503 whose request never reached the app, so a client or gateway knows a retry is safe
# (docs/protocol.md): written by the refusal (``_asgi/_refusal.py``), read by ``graceful soak``.
NOT_STARTED_HEADER = "x-graceful-not-started"

# What an engine's HTTP server says once its engine has died, as opposed to a request that failed
# (docs/resume.md, "An engine that died"). Each is the fixed message of the engine's own error:
# - vLLM: EngineDeadError (vllm/v1/engine/exceptions.py), whose message is fixed; vLLM's error
#   response keeps it (vllm/entrypoints/serve/exception_handling/error_response.py, type
#   "InternalServerError", code 500), mid-stream as an error event and for a new request as the
#   500's JSON body (handlers/vllm_error.py, engine_error_handler).
_DEAD_MESSAGES = ("EngineCore encountered an issue.",)
# The engine's own exception, where it escapes the app with no answer on the wire: vLLM's Responses
# stream generator (vllm/entrypoints/openai/responses/serving.py) lets EngineDeadError out of a
# response already started, and Starlette raises RuntimeError from it (starlette/_exception_handler.py).
_DEAD_EXCEPTIONS = frozenset({"EngineDeadError"})
# The type of graceful's own error object, which its final frames carry (docs/protocol.md).
_SHUTDOWN = "server_shutdown"


def media_type(content_type: bytes | str) -> str:
    """The media type of a Content-Type value, lower-case, without its parameters."""
    text = content_type.decode("latin-1") if isinstance(content_type, bytes) else content_type
    return text.split(";", 1)[0].strip().lower()


def event_stream(content_type: bytes | str) -> bool:
    """Whether a Content-Type value says the body is a stream of server-sent events (``text/event-stream``)."""
    return media_type(content_type) == "text/event-stream"


def responses_path(path: str) -> bool:
    """Whether a request path is the Responses API's (``POST /v1/responses``)."""
    return path.rstrip("/").endswith("/responses")


def final_error(message: str, *, resumable: bool) -> dict[str, object]:
    """graceful's error object: the one its final frames, the deadline's 503 and the Responses event carry."""
    error: dict[str, object] = {"type": _SHUTDOWN, "message": message, "retryable": True, "code": 503}
    if resumable:
        error["resumable"] = True
    return error


def final_event(error: object) -> bool:
    """Whether an error object is graceful's own (``final_error``): the server ended the stream early and
    says whether the client may continue it (``resumable``)."""
    return isinstance(error, dict) and error.get("type") == _SHUTDOWN


def server_failed(error: object) -> bool:
    """Whether an error object (the value of ``{"error": ...}``) says the server failed: a 5xx ``code``.

    graceful's own final event (type ``server_shutdown``, code 503) is not one: a second graceful in
    the path passes it on.
    """
    if not isinstance(error, dict) or final_event(error):
        return False
    code = error.get("code")
    return type(code) is int and 500 <= code <= 599


def engine_dead(error: object) -> bool:
    """Whether an error object says the engine behind the server has died: no request there can succeed."""
    if not server_failed(error):
        return False
    assert isinstance(error, dict)
    message = error.get("message")
    return isinstance(message, str) and message.startswith(_DEAD_MESSAGES)


def json_object(data: bytes) -> dict[str, Any] | None:
    """The JSON object that a body or an event's data holds, or None (not JSON, or not an object)."""
    try:
        value = json.loads(data)
    except ValueError:  # UnicodeDecodeError too
        return None
    return value if isinstance(value, dict) else None


def engine_dead_body(body: bytes) -> bool:
    """Whether a response body (a 5xx answer's JSON) says the engine has died."""
    payload = json_object(body)
    return payload is not None and engine_dead(payload.get("error"))


def engine_dead_exception(exc: BaseException) -> str | None:
    """The engine's death in an exception that escaped the app (itself, its cause or its context), or None."""
    seen: BaseException | None = exc
    for _ in range(8):  # a chain is short; a loop of causes must not hang the request's end
        if seen is None:
            return None
        if type(seen).__name__ in _DEAD_EXCEPTIONS:
            return f"{type(seen).__name__}: {seen}"
        seen = seen.__cause__ or seen.__context__
    return None
