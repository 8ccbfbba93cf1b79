"""Streams that continue on another replica: httpx transports that resume a cut completion stream.

``ResumingTransport`` (sync) and ``AsyncResumingTransport`` wrap another httpx transport.
They mark streaming ``POST .../chat/completions`` and ``POST .../completions`` requests
with ``x-graceful-resumable: 1``. When such a stream ends with graceful's final
``server_shutdown`` event, or is cut before ``[DONE]`` after at least one complete
event, they send a continuation request to the same URL and splice its events into
the one stream the caller reads. docs/resume.md describes the protocol.

The splicing is one sans-IO object (``Splice``); the two transports only move bytes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from ._splice import RESUMABLE_HEADER, RETRY_ATTEMPTS, Kind, Splice, plan

__all__ = ["RESUMABLE_HEADER", "AsyncResumingTransport", "ResumingTransport"]

logger = logging.getLogger("graceful")

# Continuations refused by the balancer are sent again within this many seconds at most.
RETRY_WINDOW = 5.0
_RETRY_STATUS = frozenset({502, 503, 504})
# Failures before a continuation's response: refused, reset or closed by the balancer (a dead endpoint).
_RETRY_ERRORS = (httpx.NetworkError, httpx.RemoteProtocolError, httpx.ConnectTimeout)


def _is_sse(response: httpx.Response) -> bool:
    media: str = response.headers.get("content-type", "")
    return media.split(";", 1)[0].strip().lower() == "text/event-stream"


def _candidate(request: httpx.Request) -> bool:
    """Whether the body is worth reading: other requests (uploads) are passed on unread."""
    return request.method == "POST" and request.url.path.rstrip("/").endswith("/completions")


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
        body = request.read() if _candidate(request) else b""
        found = _prepare(request, body)
        response = self.transport.handle_request(request)
        if found is None or response.status_code != 200 or not _is_sse(response):
            return response
        splice = Splice(*found, self.max_resumes)
        extensions = {**response.extensions, "graceful_resumes": 0}
        stream = _SyncStream(self.transport, request, response, splice, extensions)
        spliced = httpx.Response(200, headers=response.headers, stream=stream, extensions=extensions)
        stream.extensions = spliced.extensions  # httpx copies the dict: count on the caller's copy
        return spliced

    def close(self) -> None:
        self.transport.close()


class _SyncStream(httpx.SyncByteStream):
    def __init__(
        self,
        transport: httpx.BaseTransport,
        request: httpx.Request,
        response: httpx.Response,
        splice: Splice,
        extensions: dict[str, Any],
    ) -> None:
        self.transport = transport
        self.request = request
        self.response = response
        self.splice = splice
        self.extensions = extensions

    def __iter__(self) -> Iterator[bytes]:
        splice = self.splice
        while True:
            error: Exception | None = None
            try:
                for data in self.response.iter_raw():
                    out = splice.feed(data)
                    if out:
                        yield out
            except httpx.TransportError as exc:
                error = exc
                if isinstance(exc, httpx.TimeoutException):
                    splice.blocked = "the client's own read timeout"
            finally:
                self.response.close()
            reason = splice.resume_reason(error)
            if reason is not None:
                response = self._resume(reason)
                if response is not None:
                    self.response = response
                    self.extensions["graceful_resumes"] = splice.resumes
                    continue
            held = splice.surfaced()
            if held:
                yield held
            if error is not None and not splice.done:
                raise error
            return

    def _resume(self, reason: str) -> httpx.Response | None:
        body = self.splice.begin_resume(reason, self.request.url)
        time.sleep(self.splice.pause())
        deadline = time.monotonic() + RETRY_WINDOW
        for attempt in range(RETRY_ATTEMPTS):
            try:
                response = self.transport.handle_request(_next_request(self.request, body))
            except _RETRY_ERRORS as exc:
                failure = repr(exc)
            else:
                if response.status_code == 200 and _is_sse(response):
                    return response
                response.read()
                response.close()
                failure = f"HTTP {response.status_code}"
                if response.status_code not in _RETRY_STATUS:
                    break
            pause = min(0.05 * 2**attempt, 0.5)
            if time.monotonic() + pause > deadline:
                break
            time.sleep(pause)
        logger.warning("could not resume stream %s: %s", (self.splice.first or {}).get("id", "?"), failure)
        return None

    def close(self) -> None:
        self.response.close()


class AsyncResumingTransport(httpx.AsyncBaseTransport):
    """The async twin of :class:`ResumingTransport`, wrapping ``httpx.AsyncHTTPTransport()`` by default."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None, *, max_resumes: int = 3) -> None:
        self.max_resumes = _check(max_resumes)
        self.transport = transport if transport is not None else httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread() if _candidate(request) else b""
        found = _prepare(request, body)
        response = await self.transport.handle_async_request(request)
        if found is None or response.status_code != 200 or not _is_sse(response):
            return response
        splice = Splice(*found, self.max_resumes)
        extensions = {**response.extensions, "graceful_resumes": 0}
        stream = _AsyncStream(self.transport, request, response, splice, extensions)
        spliced = httpx.Response(200, headers=response.headers, stream=stream, extensions=extensions)
        stream.extensions = spliced.extensions  # httpx copies the dict: count on the caller's copy
        return spliced

    async def aclose(self) -> None:
        await self.transport.aclose()


class _AsyncStream(httpx.AsyncByteStream):
    def __init__(
        self,
        transport: httpx.AsyncBaseTransport,
        request: httpx.Request,
        response: httpx.Response,
        splice: Splice,
        extensions: dict[str, Any],
    ) -> None:
        self.transport = transport
        self.request = request
        self.response = response
        self.splice = splice
        self.extensions = extensions

    async def __aiter__(self) -> AsyncIterator[bytes]:
        splice = self.splice
        while True:
            error: Exception | None = None
            try:
                async for data in self.response.aiter_raw():
                    out = splice.feed(data)
                    if out:
                        yield out
            except httpx.TransportError as exc:
                error = exc
                if isinstance(exc, httpx.TimeoutException):
                    splice.blocked = "the client's own read timeout"
            finally:
                await self.response.aclose()
            reason = splice.resume_reason(error)
            if reason is not None:
                response = await self._resume(reason)
                if response is not None:
                    self.response = response
                    self.extensions["graceful_resumes"] = splice.resumes
                    continue
            held = splice.surfaced()
            if held:
                yield held
            if error is not None and not splice.done:
                raise error
            return

    async def _resume(self, reason: str) -> httpx.Response | None:
        import anyio

        body = self.splice.begin_resume(reason, self.request.url)
        await anyio.sleep(self.splice.pause())
        deadline = time.monotonic() + RETRY_WINDOW
        for attempt in range(RETRY_ATTEMPTS):
            try:
                response = await self.transport.handle_async_request(_next_request(self.request, body))
            except _RETRY_ERRORS as exc:
                failure = repr(exc)
            else:
                if response.status_code == 200 and _is_sse(response):
                    return response
                await response.aread()
                await response.aclose()
                failure = f"HTTP {response.status_code}"
                if response.status_code not in _RETRY_STATUS:
                    break
            pause = min(0.05 * 2**attempt, 0.5)
            if time.monotonic() + pause > deadline:
                break
            await anyio.sleep(pause)
        logger.warning("could not resume stream %s: %s", (self.splice.first or {}).get("id", "?"), failure)
        return None

    async def aclose(self) -> None:
        await self.response.aclose()
