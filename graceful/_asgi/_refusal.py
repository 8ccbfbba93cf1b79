"""Refusals: the answer to a request or WebSocket that the app never saw.

One refusal for HTTP and WebSocket alike: a 503 with ``retry-after`` (the ``retry_after``
option), ``x-graceful-not-started: 1`` and the request id when one is echoed, and a JSON
error body whose ``type`` is the reason. A WebSocket handshake gets it where the server
offers the denial extension (``websocket.http.response``), else a close with 1013 (Try Again
Later). Which requests are refused is decided in one place, the middleware's admission.
"""

from __future__ import annotations

import json

import anyio

from .._drain._admission import WOULD_NOT_FINISH
from .._drain._status import State
from .._stream._rules import NOT_STARTED_HEADER
from ._answers import json_response
from ._shared import Shared
from ._types import Receive, Scope, Send

__all__ = [
    "HTTP1",
    "REFUSAL",
    "REFUSAL_BODY_LIMIT",
    "TRY_AGAIN_LATER",
    "reject",
    "reject_websocket",
    "request_id",
]

# The header that marks a refusal not started (its name's home: ``_stream/_rules.py``).
_NOT_STARTED = NOT_STARTED_HEADER.encode()
TRY_AGAIN_LATER = 1013  # RFC 6455 registry: the close code of a refused handshake without the denial extension

# HTTP versions whose connections a response closes with ``connection: close``.
HTTP1 = frozenset({"1.0", "1.1"})
# Before a refusal, read and drop this much of the request body at most, for this long
# at most (a slow client must not hold a draining server). See _drop_body. Prompts of
# 100 KB and more are normal, and base64 images make bodies of several MB.
REFUSAL_BODY_LIMIT = 16 << 20
REFUSAL_BODY_TIMEOUT = 1.0

# Why a request was refused, by state (SERVING: only the reject_over limit refuses).
REFUSAL = {
    State.STARTING: "server_starting",
    State.DRAINING: "server_draining",
    State.STOPPED: "server_stopped",
    State.SERVING: "server_overloaded",
    State.FAILED: "server_failed",
}

_MESSAGES = {
    "server_draining": "This server is draining for shutdown and did not start the request; retry it elsewhere.",
    "server_starting": "This server is still starting and did not start the request; retry it elsewhere.",
    "server_stopped": "This server has stopped and did not start the request; retry it elsewhere.",
    "server_overloaded": "This server is at its in-flight limit and did not start the request; retry it elsewhere.",
    "server_failed": "This server's engine has failed and the request was not started; retry it elsewhere.",
    # admission="fits" (``_admission.judge``): during a drain, a request expected to outrun the deadline.
    WOULD_NOT_FINISH: "This server is draining and would not finish the request before its deadline; it did "
    "not start it; retry it elsewhere.",
}


def request_id(shared: Shared, scope: Scope) -> bytes:
    wanted = shared.request_id_header
    for name, value in scope["headers"]:
        if name == wanted:
            return bytes(value)
    return b"%b%d" % (shared.id_prefix, next(shared.ids))


def _refusal(shared: Shared, scope: Scope, reason: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The body and headers of a refusal, for HTTP and the WebSocket denial alike."""
    body = json.dumps({"error": {"message": _MESSAGES[reason], "type": reason, "code": 503}}).encode()
    headers = [(b"retry-after", shared.retry_after), (_NOT_STARTED, b"1"), *shared.announce()]
    if shared.request_id_header is not None:
        headers.append((shared.request_id_header, request_id(shared, scope)))
    return body, headers


async def reject(shared: Shared, scope: Scope, receive: Receive, send: Send, reason: str) -> None:
    """A retryable 503 for a request the app never saw."""
    body_read = await _drop_body(scope, receive)
    body, headers = _refusal(shared, scope, reason)
    if body_read and scope.get("http_version", "1.1") in HTTP1:
        headers.append((b"connection", b"close"))
    await json_response(send, 503, body, headers)


async def reject_websocket(shared: Shared, scope: Scope, receive: Receive, send: Send, reason: str) -> None:
    """The same refusal for a WebSocket handshake the app never saw."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return  # the peer left before connecting: nothing to answer
    if "websocket.http.response" not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close", "code": TRY_AGAIN_LATER})  # most servers answer 403
        return
    body, headers = _refusal(shared, scope, reason)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), *headers]
    await send({"type": "websocket.http.response.start", "status": 503, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})


async def _drop_body(scope: Scope, receive: Receive) -> bool:
    """Read and drop a refused request's body; True once it has ended, so closing is safe.

    Closing a connection with unread request bytes in its socket makes the kernel
    answer with a reset, which can destroy the 503 before the peer reads it (nginx
    then shows a 502 and does not retry). Past REFUSAL_BODY_LIMIT or
    REFUSAL_BODY_TIMEOUT we stop and answer without ``Connection: close``: uvicorn
    (h11 and httptools alike) then reads and drops the rest itself and keeps the
    connection, so nothing is left unread when it closes. (hypercorn 0.18 and granian
    2.8 close the connection there anyway, so past the limit a reset can still come.)
    """
    for name, value in scope["headers"]:
        if name == b"content-length":
            if not value.isdigit() or int(value) > REFUSAL_BODY_LIMIT:
                return False
            break
    seen = 0
    with anyio.move_on_after(REFUSAL_BODY_TIMEOUT):
        while seen <= REFUSAL_BODY_LIMIT:
            message = await receive()
            if message["type"] != "http.request":
                return True  # the client is gone: nothing more will arrive
            seen += len(message.get("body", b""))
            if not message.get("more_body", False):
                return True
    return False
