"""Streams that continue on another replica: httpx transports that resume a cut completion stream.

``ResumingTransport`` (sync) and ``AsyncResumingTransport`` wrap another httpx transport.
They mark streaming ``POST .../chat/completions``, ``POST .../completions`` and ``POST
.../responses`` requests with ``x-graceful-resumable: 1``. When such a stream ends with
graceful's final ``server_shutdown`` event, or is cut before its end after at least one
complete event, they send a continuation request to the same URL and splice its events
into the one stream the caller reads. docs/resume.md describes the protocol.

The splicing is one sans-IO object (``Splice``, or ``ResponsesSplice`` for the Responses API).
What a spliced stream does around it (read, resume, retry the continuation, give up) is written
once, as ``_Continuation``, an async iterator over an I/O of either kind: the async transport
awaits it, and the sync one drives it over blocking I/O that never suspends, so it runs to each
chunk without an event loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Iterator
from typing import Any, Protocol, TypeVar

import httpx

from .._stream._rules import RESUMABLE_HEADER, engine_dead_body, event_stream, responses_path
from ._attempts import RETRY_ATTEMPTS, Attempts
from ._responses import ResponsesSplice
from ._splice import Kind, Splice, plan

__all__ = ["AsyncResumingTransport", "ResumingTransport"]

logger = logging.getLogger("graceful")

# Continuations refused by the balancer are sent again within this many seconds at most.
RETRY_WINDOW = 5.0
_RETRY_STATUS = frozenset({502, 503, 504})
# Failures before a continuation's response: refused, reset or closed by the balancer or the server
# (a dead endpoint; a server that closes the connection without answering: httpx's RemoteProtocolError).
_RETRY_ERRORS = (httpx.NetworkError, httpx.RemoteProtocolError, httpx.ConnectTimeout)


def _streamed(response: httpx.Response) -> bool:
    """Whether an answer is a stream to splice: a 200 of server-sent events (docs/resume.md)."""
    return response.status_code == 200 and event_stream(response.headers.get("content-type", ""))


def _refused(response: httpx.Response) -> bool:
    """Whether a continuation's answer (its body read) sends it elsewhere: a balancer's or graceful's
    refusal, or a 5xx whose body says the engine behind that replica has died (docs/resume.md)."""
    status = response.status_code
    return status in _RETRY_STATUS or (500 <= status <= 599 and engine_dead_body(response.content))


def _candidate(request: httpx.Request) -> bool:
    """Whether the body is worth reading: other requests (uploads) are passed on unread."""
    path = request.url.path.rstrip("/")
    return request.method == "POST" and (path.endswith("/completions") or responses_path(path))


def _prepare(request: httpx.Request, body: bytes) -> tuple[Kind, dict[str, Any]] | None:
    found = plan(request, body)
    if found is not None:
        request.headers[RESUMABLE_HEADER] = "1"
    return found


def _next_request(request: httpx.Request, body: bytes) -> httpx.Request:
    headers = httpx.Headers(request.headers)
    headers.pop("content-length", None)
    headers["content-length"] = str(len(body))
    return httpx.Request(request.method, request.url, headers=headers, content=body, extensions=request.extensions)


def _check(max_resumes: int) -> int:
    if isinstance(max_resumes, bool) or not isinstance(max_resumes, int) or max_resumes < 0:
        raise ValueError(f"max_resumes={max_resumes!r} must be a whole number, 0 or more (0: never resume)")
    return max_resumes


def _spliced(
    request: httpx.Request, response: httpx.Response, found: tuple[Kind, dict[str, Any]] | None, io: _IO, resumes: int
) -> httpx.Response | None:
    """The response the caller reads, spliced across continuations; None when the stream is not one to splice."""
    if found is None or not _streamed(response):
        return None
    extensions = {**response.extensions, "graceful_resumes": 0}
    kind, payload = found
    splice = ResponsesSplice(payload, resumes) if kind == "responses" else Splice(kind, payload, resumes)
    continuation = _Continuation(io, request, response, splice, extensions)
    stream = _SyncStream(continuation) if isinstance(io, _SyncIO) else _AsyncStream(continuation)
    spliced = httpx.Response(200, headers=response.headers, stream=stream, extensions=extensions)
    continuation.extensions = spliced.extensions  # httpx copies the dict: count on the caller's copy
    return spliced


class ResumingTransport(httpx.BaseTransport):
    """An httpx transport that continues cut completion streams on another replica.

    ``httpx.Client(transport=ResumingTransport())``; pass ``transport=`` to wrap one
    other than ``httpx.HTTPTransport()``. The response's ``extensions["graceful_resumes"]``
    counts the continuations so far.
    """

    def __init__(self, transport: httpx.BaseTransport | None = None, *, max_resumes: int = 3) -> None:
        self.max_resumes = _check(max_resumes)
        self.transport = transport if transport is not None else httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        found = _prepare(request, request.read() if _candidate(request) else b"")
        response = self.transport.handle_request(request)
        spliced = _spliced(request, response, found, _SyncIO(self.transport), self.max_resumes)
        return response if spliced is None else spliced

    def close(self) -> None:
        self.transport.close()


class AsyncResumingTransport(httpx.AsyncBaseTransport):
    """The async twin of :class:`ResumingTransport`, wrapping ``httpx.AsyncHTTPTransport()`` by default."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None, *, max_resumes: int = 3) -> None:
        self.max_resumes = _check(max_resumes)
        self.transport = transport if transport is not None else httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        found = _prepare(request, await request.aread() if _candidate(request) else b"")
        response = await self.transport.handle_async_request(request)
        spliced = _spliced(request, response, found, _AsyncIO(self.transport), self.max_resumes)
        return response if spliced is None else spliced

    async def aclose(self) -> None:
        await self.transport.aclose()


# -- the I/O a continuation needs, of each kind ------------------------------------------------


class _IO(Protocol):
    def raw(self, response: httpx.Response) -> AsyncIterator[bytes]: ...

    async def close(self, response: httpx.Response) -> None: ...

    async def discard(self, response: httpx.Response) -> None: ...

    async def send(self, request: httpx.Request) -> httpx.Response: ...

    async def sleep(self, seconds: float) -> None: ...


class _SyncIO:
    """A sync transport's blocking I/O, as coroutines that never suspend."""

    def __init__(self, transport: httpx.BaseTransport) -> None:
        self.transport = transport

    async def raw(self, response: httpx.Response) -> AsyncIterator[bytes]:
        for data in response.iter_raw():
            yield data

    async def close(self, response: httpx.Response) -> None:
        response.close()

    async def discard(self, response: httpx.Response) -> None:
        response.read()
        response.close()

    async def send(self, request: httpx.Request) -> httpx.Response:
        return self.transport.handle_request(request)

    async def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class _AsyncIO:
    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self.transport = transport

    def raw(self, response: httpx.Response) -> AsyncIterator[bytes]:
        return response.aiter_raw()

    async def close(self, response: httpx.Response) -> None:
        await response.aclose()

    async def discard(self, response: httpx.Response) -> None:
        await response.aread()
        await response.aclose()

    async def send(self, request: httpx.Request) -> httpx.Response:
        return await self.transport.handle_async_request(request)

    async def sleep(self, seconds: float) -> None:
        import anyio

        await anyio.sleep(seconds)


# -- one spliced stream, written once --------------------------------------------------------


class _Continuation:
    """The stream the caller reads: the first response's events, then each continuation's, spliced."""

    def __init__(
        self, io: _IO, request: httpx.Request, response: httpx.Response, splice: Attempts, extensions: dict[str, Any]
    ) -> None:
        self.io, self.request, self.response = io, request, response
        self.splice, self.extensions = splice, extensions

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        splice = self.splice
        while True:
            error: Exception | None = None
            try:
                async for data in self.io.raw(self.response):
                    out = splice.feed(data)
                    if out:
                        yield out
            except httpx.TransportError as exc:
                error = exc
                if isinstance(exc, httpx.TimeoutException):
                    splice.blocked = "the client's own read timeout"
            finally:
                await self.io.close(self.response)
            reason = splice.resume_reason(error)
            if reason is not None:
                response = await self._resume(reason)
                if response is not None:
                    self.response = response
                    splice.resumed()
                    self.extensions["graceful_resumes"] = splice.resumes
                    continue
            held = splice.surfaced()
            if held:
                yield held
            if error is not None and not splice.done:
                raise error
            return

    async def _resume(self, reason: str) -> httpx.Response | None:
        """The continuation's response, sent again while the balancer refuses it (a dead endpoint)."""
        io = self.io
        body = self.splice.begin_resume(reason, self.request.url)
        await io.sleep(self.splice.pause())
        deadline = time.monotonic() + RETRY_WINDOW
        for attempt in range(RETRY_ATTEMPTS):
            try:
                response = await io.send(_next_request(self.request, body))
            except _RETRY_ERRORS as exc:
                failure = repr(exc)
            else:
                if _streamed(response):
                    return response
                await io.discard(response)
                failure = f"HTTP {response.status_code}"
                if not _refused(response):
                    break
            pause = min(0.05 * 2**attempt, 0.5)
            if time.monotonic() + pause > deadline:
                break
            await io.sleep(pause)
        logger.warning("could not resume stream %s: %s", (self.splice.first or {}).get("id", "?"), failure)
        return None


_T = TypeVar("_T")


def _run_sync(step: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine over ``_SyncIO`` to its end: it never suspends, so no loop is needed."""
    try:
        step.send(None)
    except StopIteration as done:
        value: _T = done.value
        return value
    step.close()
    raise RuntimeError("a sync transport's I/O suspended")  # pragma: no cover - _SyncIO never awaits a loop


class _SyncStream(httpx.SyncByteStream):
    def __init__(self, continuation: _Continuation) -> None:
        self.continuation = continuation

    def __iter__(self) -> Iterator[bytes]:
        chunks = self.continuation.chunks()
        try:
            while True:
                try:
                    yield _run_sync(chunks.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            _run_sync(chunks.aclose())  # the response in hand is closed if the caller stops early

    def close(self) -> None:
        _run_sync(self.continuation.io.close(self.continuation.response))


class _AsyncStream(httpx.AsyncByteStream):
    def __init__(self, continuation: _Continuation) -> None:
        self.continuation = continuation

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.continuation.chunks():
            yield chunk

    async def aclose(self) -> None:
        await self.continuation.io.close(self.continuation.response)
