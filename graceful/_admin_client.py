"""The admin client: finds every worker's socket and talks to all of them at once.

It speaks the little HTTP/1.1 the admin server answers (``_admin_server``) over the
Unix socket itself, so the preStop hook starts without loading an HTTP library.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import anyio
import anyio.abc

from ._paths import default_socket_dir

__all__ = ["NoServer", "WorkerDrain", "discover", "drain_all", "request_all"]

# Grace on top of the server's own deadline: its final line follows the deadline by
# the time it takes to expire what is left (unwind_timeout) plus the on_drained hook.
_CLIENT_SLACK = 15.0


class NoServer(Exception):
    """No socket found, or nothing listening on any of them (CLI exit code 3)."""


def discover(socket_dir: str | None = None, socket: str | None = None) -> list[str]:
    """The socket paths to talk to: ``socket`` alone, or every ``*.sock`` in the directory."""
    if socket is not None:
        return [socket]
    directory = socket_dir or default_socket_dir()
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        raise NoServer(f"no graceful server found: cannot read socket dir {directory!r} ({exc.strerror})") from None
    paths = []
    for name in names:
        path = os.path.join(directory, name)
        if name.endswith(".sock") and stat.S_ISSOCK(os.lstat(path).st_mode):
            paths.append(path)
    if not paths:
        raise NoServer(
            f"no graceful server found: no sockets in {directory!r}; "
            "is the server running with the same --socket-dir / GRACEFUL_SOCKET_DIR?"
        )
    return paths


# A status line and headers longer than this are not from our server.
_MAX_HEAD = 16 * 1024
_MAX_LINE = 1024 * 1024


class _Unreachable(Exception):
    """Nothing accepts connections on the socket."""


class _Broken(Exception):
    """The answer stopped or was not the HTTP/1.1 the admin server sends."""


class _Answer:
    """One response read off the socket: its status, then its body chunk by chunk or line by line."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.status = 0
        self._stream = stream
        self._chunked = False
        self._left: int | None = None
        self._buffer = b""

    async def _more(self) -> bytes:
        try:
            return await self._stream.receive(65536)
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            return b""

    async def _fill(self, size: int) -> None:
        while len(self._buffer) < size:
            data = await self._more()
            if not data:
                raise _Broken("the connection closed mid-answer")
            self._buffer += data

    async def _until(self, marker: bytes, cap: int) -> bytes:
        while (end := self._buffer.find(marker)) < 0:
            if len(self._buffer) > cap:
                raise _Broken("an answer line is too long")
            data = await self._more()
            if not data:
                raise _Broken("the connection closed mid-answer")
            self._buffer += data
        line, self._buffer = self._buffer[:end], self._buffer[end + len(marker) :]
        return line

    async def read_head(self) -> None:
        head = await self._until(b"\r\n\r\n", _MAX_HEAD)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise _Broken(f"not an HTTP answer: {status_line[:60]!r}")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = headers.get("content-length", "")
        self.status = int(parts[1])
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._left = int(length) if length.isdigit() else None

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._chunked:
            while True:
                size_line = await self._until(b"\r\n", 64)
                try:
                    size = int(size_line.split(b";", 1)[0], 16)
                except ValueError:
                    raise _Broken("a bad chunk size") from None
                if size == 0:
                    return
                await self._fill(size + 2)
                chunk, self._buffer = self._buffer[:size], self._buffer[size + 2 :]
                yield chunk
        left = self._left
        while left is None or left > 0:
            data, self._buffer = self._buffer or await self._more(), b""
            if not data:
                if left is None:
                    return
                raise _Broken("the connection closed mid-answer")
            if left is not None:
                data = data[:left]
                left -= len(data)
            yield data

    async def body(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def lines(self) -> AsyncIterator[bytes]:
        pending = b""
        async for chunk in self.chunks():
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line
            if len(pending) > _MAX_LINE:
                raise _Broken("an answer line is too long")
        if pending:
            yield pending


@asynccontextmanager
async def _exchange(path: str, method: str, target: str) -> AsyncIterator[_Answer]:
    """Send one request without a body and read the answer's head; the body is the caller's to read."""
    try:
        stream = await anyio.connect_unix(path)
    except OSError as exc:
        raise _Unreachable(str(exc)) from None
    async with stream:
        request = f"{method} {target} HTTP/1.1\r\nHost: graceful\r\nContent-Length: 0\r\n\r\n"
        try:
            await stream.send(request.encode("ascii"))
        except (anyio.BrokenResourceError, OSError):
            raise _Broken("the connection closed before the request was sent") from None
        answer = _Answer(stream)
        await answer.read_head()
        yield answer


async def request_all(paths: list[str], method: str, url: str) -> dict[str, dict[str, Any] | None]:
    """Send one small request to every socket; ``None`` for a socket nobody answers on."""
    answers: dict[str, dict[str, Any] | None] = {}

    async def one(path: str) -> None:
        try:
            with anyio.fail_after(5.0):
                async with _exchange(path, method, url) as answer:
                    answers[path] = json.loads(await answer.body())
        except (_Unreachable, _Broken, TimeoutError, ValueError):
            answers[path] = None

    async with anyio.create_task_group() as tg:
        for path in paths:
            tg.start_soon(one, path)
    return {path: answers[path] for path in paths}


@dataclass
class WorkerDrain:
    """What one worker said during a drain."""

    path: str
    pid: int | None = None
    in_flight: int = 0
    deadline: float | None = None
    since_last_request: float | None = None
    progressed: bool = False
    propagation_over: bool = False
    result: dict[str, Any] | None = None
    error: str | None = None
    reachable: bool = True
    lines: list[dict[str, Any]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None or not self.reachable

    def as_dict(self) -> dict[str, Any]:
        return {"socket": self.path, "pid": self.pid, "result": self.result, "error": self.error}


async def drain_all(
    paths: list[str],
    *,
    propagation_wait: float | None = None,
    timeout: float | None = None,
    reason: str = "cli",
    propagation_quiet: float | None = None,
    on_tick: Callable[[list[WorkerDrain]], None] | None = None,
) -> list[WorkerDrain]:
    """Drain every worker concurrently; ``on_tick`` is called about once a second while any runs."""
    params: dict[str, str] = {"reason": reason}
    if propagation_wait is not None:
        params["propagation_wait"] = f"{propagation_wait}s"
    if propagation_quiet is not None:
        params["propagation_quiet"] = f"{propagation_quiet}s"
    if timeout is not None:
        params["timeout"] = f"{timeout}s"
    workers = [WorkerDrain(path) for path in paths]
    limit = None if timeout is None else max(timeout, propagation_wait or 0.0) + _CLIENT_SLACK

    async def one(worker: WorkerDrain) -> None:
        try:
            async with _exchange(worker.path, "POST", "/drain?" + urlencode(params)) as answer:
                if answer.status != 200:
                    body = (await answer.body()).decode(errors="replace").strip()
                    worker.error = f"HTTP {answer.status}: {body}"
                    return
                async for line in answer.lines():
                    if line.strip():
                        _absorb(worker, json.loads(line))
        except _Unreachable:
            worker.reachable = False
            return
        except (_Broken, ValueError) as exc:
            worker.error = f"lost the connection before the drain ended ({exc})"
            return
        if worker.result is None:
            worker.error = "the server closed the connection before the drain ended"

    async def ticker() -> None:
        while on_tick is not None:
            await anyio.sleep(1.0)
            on_tick(workers)

    with anyio.move_on_after(limit if limit is not None else float("inf")):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            async with anyio.create_task_group() as drains:
                for worker in workers:
                    drains.start_soon(one, worker)
            tg.cancel_scope.cancel()
    for worker in workers:
        if not worker.done:
            worker.error = "no final answer in time"
    if not any(worker.reachable for worker in workers):
        raise NoServer("no graceful server found: nothing is listening on " + ", ".join(paths))
    return workers


def _absorb(worker: WorkerDrain, line: dict[str, Any]) -> None:
    event = line.get("event")
    if event == "status":
        worker.pid = line.get("pid")
        worker.deadline = line.get("deadline")
        worker.in_flight = int(line.get("in_flight") or 0)
    elif event == "progress":
        worker.in_flight = int(line.get("in_flight") or 0)
        worker.progressed = True
        worker.propagation_over = bool(line.get("propagation_over"))
        since = line.get("since_last_request")
        worker.since_last_request = float(since) if isinstance(since, (int, float)) else None
    elif event == "result":
        worker.pid = line.get("pid", worker.pid)
        worker.in_flight = int(line.get("in_flight") or 0)
        worker.deadline = line.get("deadline", worker.deadline)
        worker.result = line
