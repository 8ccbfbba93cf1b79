"""A small OpenAI-compatible server for soak tests, told per request how to misbehave.

``OpenAIApp(plan=...)`` serves ``POST /v1/chat/completions`` and
``GET /debug/executions``. ``plan(n, body)`` returns the mode for the n-th request
(0-based), or a ``Status`` (an early error answer with chosen headers) or ``Frames``
(a body given byte for byte, optionally cut). Connection-level failures that ASGI
cannot express (closing the socket without any answer) come from ``raw_http_server``
instead.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.abc
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from graceful._asgi._frames import default_final_frame

Mode = Literal[
    "ok",  # a complete answer
    "reject",  # 503 + x-graceful-not-started: the drain's refusal, before execution
    "reject_plain",  # 503 without the header, before execution (a plain server's 503)
    "lost_answer",  # executes (and stores the result), then answers 502: the answer is lost
    "stall",  # executes, then never answers until the client leaves
    "stall_body",  # headers and a first chunk, then nothing until the client leaves
    "cut",  # headers and half the body, then the connection closes
    "shutdown_frame",  # a stream: a few chunks, then the server_shutdown error frame, then the end
    "short_length",  # non-stream: finish_reason length with half the tokens
    "bad_json",  # a 200 whose body is not JSON
    "error_event",  # a stream: one chunk, then an error event other than server_shutdown
]


@dataclass(frozen=True)
class Status:
    """An error answer sent before executing the request, e.g. 429 with ``Retry-After``."""

    code: int
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Frames:
    """A response whose body is exactly ``parts``; with ``complete=False`` the connection is cut after them."""

    parts: list[bytes]
    media_type: str = "text/event-stream"
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    complete: bool = True


Answer = Mode | Status | Frames


def always_ok(n: int, body: dict[str, Any]) -> Mode:
    return "ok"


@dataclass
class OpenAIApp:
    """The app and what it saw: request ids, executions per idempotency key."""

    served_by: str = "a"
    plan: Callable[[int, dict[str, Any]], Answer] = always_ok
    idempotent: bool = True
    token_delay: float = 0.0
    seen: int = 0
    request_ids: list[str] = field(default_factory=list)
    executions: Counter[str] = field(default_factory=Counter)
    stored: dict[str, tuple[int, bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/debug/executions", self.debug_executions, methods=["GET"]),
            ]
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    async def debug_executions(self, request: Request) -> Response:
        return JSONResponse(dict(self.executions))

    async def chat(self, request: Request) -> Response:
        n, self.seen = self.seen, self.seen + 1
        body = await request.json()
        mode = self.plan(n, body)
        rid = request.headers.get("x-request-id", f"req-{n}")
        key = request.headers.get("idempotency-key")
        self.request_ids.append(rid)
        headers = {"x-served-by": self.served_by, "x-request-id": rid}
        if isinstance(mode, Status):
            error = {"error": {"type": "status", "message": f"status {mode.code}", "code": mode.code}}
            return JSONResponse(error, mode.code, {**headers, **mode.headers})
        if isinstance(mode, Frames):
            self.executions[key or rid] += 1
            return Scripted(
                mode.status, {**headers, **mode.headers}, mode.media_type, mode.parts, complete=mode.complete
            )
        if mode in ("reject", "reject_plain"):
            if mode == "reject":
                headers["x-graceful-not-started"] = "1"
            error = {"error": {"type": "server_draining", "message": "draining", "code": 503}}
            return JSONResponse(error, 503, headers)
        if key is not None and self.idempotent and key in self.stored:
            status, stored = self.stored[key]
            return Response(stored, status, {**headers, "x-idempotent-replay": "true"}, "application/json")
        self.executions[key or rid] += 1
        tokens = int(body.get("max_tokens") or 16)
        if mode == "stall":
            return Scripted(200, headers, "application/json", [], stall=True)
        if body.get("stream"):
            return self.stream(mode, tokens, headers)
        done = completion(tokens // 2 if mode == "short_length" else tokens, "length")
        if key is not None and self.idempotent:
            self.stored[key] = (200, done)
        if mode == "lost_answer":
            return JSONResponse({"error": {"type": "bad_gateway", "message": "lost"}}, 502, headers)
        if mode == "cut":
            return Scripted(200, headers, "application/json", [done[: len(done) // 2]], length=len(done))
        if mode == "stall_body":
            return Scripted(200, headers, "application/json", [done[:1]], length=len(done), stall=True)
        return Response(b"{not json" if mode == "bad_json" else done, 200, headers, "application/json")

    def stream(self, mode: Mode, tokens: int, headers: dict[str, str]) -> Response:
        parts = [b"data: " + json.dumps(chunk(i, tokens)).encode() + b"\n\n" for i in range(tokens)]
        if mode == "cut":
            return Scripted(200, headers, "text/event-stream", parts[: tokens // 2], delay=self.token_delay)
        if mode == "stall_body":
            return Scripted(200, headers, "text/event-stream", parts[:1], stall=True)
        if mode == "error_event":
            error = b'data: {"error": {"type": "overloaded", "message": "busy"}}\n\n'
            return Scripted(200, headers, "text/event-stream", [parts[0], error], complete=True)
        if mode == "shutdown_frame":
            frame = default_final_frame(b"text/event-stream")
            assert frame is not None
            return Scripted(200, headers, "text/event-stream", [*parts[: tokens // 2], frame], complete=True)
        return Scripted(
            200, headers, "text/event-stream", [*parts, b"data: [DONE]\n\n"], complete=True, delay=self.token_delay
        )


def completion(tokens: int, finish: str) -> bytes:
    return json.dumps(
        {
            "id": "cmpl-soak",
            "object": "chat.completion",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "t " * tokens}, "finish_reason": finish}
            ],
            "usage": {"prompt_tokens": 4, "completion_tokens": tokens, "total_tokens": tokens + 4},
        }
    ).encode()


def chunk(i: int, tokens: int) -> dict[str, Any]:
    finish = "length" if i == tokens - 1 else None
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": "t "}, "finish_reason": finish}],
    }


class Scripted(Response):
    """A response sent frame by frame; it may stall or stop without finishing (uvicorn then closes the connection)."""

    def __init__(
        self,
        status: int,
        headers: dict[str, str],
        media_type: str,
        parts: list[bytes],
        *,
        complete: bool = False,
        stall: bool = False,
        length: int | None = None,
        delay: float = 0.0,
    ) -> None:
        self.status_code, self.parts, self.complete, self.stall, self.delay = status, parts, complete, stall, delay
        self.raw = [(k.encode(), v.encode()) for k, v in headers.items()] + [(b"content-type", media_type.encode())]
        if length is not None:
            self.raw.append((b"content-length", str(length).encode()))
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.stall and not self.parts:
            await _until_disconnect(receive)
            return
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw})
        for part in self.parts:
            await send({"type": "http.response.body", "body": part, "more_body": True})
            if self.delay:
                await anyio.sleep(self.delay)
        if self.stall:
            await _until_disconnect(receive)
        elif self.complete:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _until_disconnect(receive: Receive) -> None:
    # The body was read already, so the next message is the client leaving.
    while (await receive())["type"] != "http.disconnect":
        pass


Handler = Callable[[anyio.abc.SocketStream, bytes], Awaitable[None]]


async def read_request(stream: anyio.abc.SocketStream) -> bytes:
    """Read one HTTP/1.1 request with a content-length body; b"" if the client closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            data += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return b""
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += await stream.receive()
    return head + b"\r\n\r\n" + rest


async def close_without_answer(stream: anyio.abc.SocketStream, request: bytes) -> None:
    """Read the request, then close: the client cannot know whether it ran."""


async def headers_then_cut(stream: anyio.abc.SocketStream, request: bytes) -> None:
    """Answer with headers and one chunk of a stream, then close mid-body."""
    event = b"data: " + json.dumps(chunk(0, 8)).encode() + b"\n\n"
    await stream.send(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-served-by: raw\r\n"
        b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\n" % len(event) + event + b"\r\n"
    )


async def keepalive_then_close(stream: anyio.abc.SocketStream, request: bytes) -> None:
    """Answer the first request and keep the connection open; read the next one and close.

    This is what a plain server does on SIGTERM to a keep-alive client: the client
    reuses an idle connection just as the server closes it.
    """
    body = completion(4, "length")
    await stream.send(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-served-by: raw\r\n"
        b"content-length: %d\r\n\r\n" % len(body) + body
    )
    await read_request(stream)


@contextlib.asynccontextmanager
async def raw_http_server(handler: Handler) -> AsyncIterator[int]:
    """A TCP server on 127.0.0.1 that reads each request and lets ``handler`` misbehave; yields the port."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)

    async def serve(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            request = await read_request(stream)
            if request:
                await handler(stream, request)

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        yield int(listener.extra(anyio.abc.SocketAttribute.local_port))
        tg.cancel_scope.cancel()
