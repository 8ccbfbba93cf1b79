"""The admin client: finds every worker's socket and talks to all of them at once.

It speaks the little HTTP/1.1 the admin server answers (``_server``) over the
Unix socket itself, with blocking sockets and one thread per worker: the preStop hook's
start-up counts against the grace period, and this keeps it free of asyncio and any
HTTP library.
"""

from __future__ import annotations

import json
import os
import socket as _socket
import stat
import threading
import time
from collections.abc import Callable, Iterator

from ._paths import default_socket_dir

# typing's import costs the preStop hook milliseconds; mypy reads the annotations anyway.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["NoServer", "WorkerDrain", "discover", "drain_all", "request_all"]

# Grace on top of the server's own deadline: its final line follows the deadline by
# the time it takes to expire what is left (unwind_timeout) plus the on_drained hook.
_CLIENT_SLACK = 15.0


# Left as they are in a query string (urllib.parse's always-safe set); every other byte is %XX.
_QUERY_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def _query(params: dict[str, str]) -> str:
    """``urllib.parse.urlencode(params)``, without importing urllib.parse (and ipaddress) on the hook's path."""

    def quote(text: str) -> str:
        return "".join(
            chr(byte) if byte in _QUERY_SAFE else "+" if byte == 0x20 else f"%{byte:02X}" for byte in text.encode()
        )

    return "&".join(f"{quote(key)}={quote(value)}" for key, value in params.items())


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
# A small request (status, resume) gets this long, connect to last byte.
_REQUEST_TIMEOUT = 5.0
# A drain's answer has a line every second (progress); this long without a byte means the
# server stopped answering, whatever the drain's own limit. It bounds a hook run without
# --timeout too.
_DRAIN_SILENCE = 30.0


class _Unreachable(Exception):
    """Nothing accepts connections on the socket."""


class _Broken(Exception):
    """The answer stopped, ran out of time, or was not the HTTP/1.1 the admin server sends."""


class _Answer:
    """One response read off a blocking socket: its status, then its body chunk by chunk or line by line.

    Every read ends by ``deadline`` (``time.monotonic()``), and after ``silence`` seconds
    without a byte; ``None`` leaves that bound out.
    """

    def __init__(self, sock: _socket.socket, deadline: float | None, silence: float | None = None) -> None:
        self.status = 0
        self._sock = sock
        self._deadline = deadline
        self._silence = silence
        self._chunked = False
        self._left: int | None = None
        self._buffer = b""

    def _more(self) -> bytes:
        wait = self._silence
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise _Broken("no answer in time")
            wait = left if wait is None else min(wait, left)
        self._sock.settimeout(wait)
        try:
            return self._sock.recv(65536)
        except TimeoutError:
            if self._silence is not None and wait == self._silence:
                raise _Broken(f"the server sent nothing for {self._silence:g} s") from None
            raise _Broken("no answer in time") from None
        except OSError:
            return b""

    def _fill(self, size: int) -> None:
        while len(self._buffer) < size:
            data = self._more()
            if not data:
                raise _Broken("the connection closed mid-answer")
            self._buffer += data

    def _until(self, marker: bytes, cap: int) -> bytes:
        while (end := self._buffer.find(marker)) < 0:
            if len(self._buffer) > cap:
                raise _Broken("an answer line is too long")
            data = self._more()
            if not data:
                raise _Broken("the connection closed mid-answer")
            self._buffer += data
        line, self._buffer = self._buffer[:end], self._buffer[end + len(marker) :]
        return line

    def read_head(self) -> None:
        head = self._until(b"\r\n\r\n", _MAX_HEAD)
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

    def chunks(self) -> Iterator[bytes]:
        if self._chunked:
            while True:
                size_line = self._until(b"\r\n", 64)
                try:
                    size = int(size_line.split(b";", 1)[0], 16)
                except ValueError:
                    raise _Broken("a bad chunk size") from None
                if size == 0:
                    return
                self._fill(size + 2)
                chunk, self._buffer = self._buffer[:size], self._buffer[size + 2 :]
                yield chunk
        left = self._left
        while left is None or left > 0:
            data, self._buffer = self._buffer or self._more(), b""
            if not data:
                if left is None:
                    return
                raise _Broken("the connection closed mid-answer")
            if left is not None:
                data = data[:left]
                left -= len(data)
            yield data

    def body(self) -> bytes:
        return b"".join(self.chunks())

    def lines(self) -> Iterator[bytes]:
        pending = b""
        for chunk in self.chunks():
            pending += chunk
            *complete, pending = pending.split(b"\n")
            yield from complete
            if len(pending) > _MAX_LINE:
                raise _Broken("an answer line is too long")
        if pending:
            yield pending


def _exchange(
    path: str,
    method: str,
    target: str,
    deadline: float | None,
    opened: list[_socket.socket],
    silence: float | None = None,
) -> _Answer:
    """Send one request without a body and read the answer's head; the body is the caller's to read.

    The socket goes into ``opened``: the caller closes it, which also stops a read in another thread.
    """
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    opened.append(sock)
    sock.settimeout(silence if deadline is None else max(0.001, deadline - time.monotonic()))
    try:
        sock.connect(path)
    except TimeoutError:
        raise _Broken("no answer in time") from None
    except OSError as exc:
        raise _Unreachable(str(exc)) from None
    request = f"{method} {target} HTTP/1.1\r\nHost: graceful\r\nContent-Length: 0\r\n\r\n"
    try:
        sock.sendall(request.encode("ascii"))
    except OSError:
        raise _Broken("the connection closed before the request was sent") from None
    answer = _Answer(sock, deadline, silence)
    answer.read_head()
    return answer


def _close(sockets: list[_socket.socket]) -> None:
    for sock in sockets:
        try:
            sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


def _in_threads(work: Callable[[str], None], paths: list[str], limit: float | None, tick: Callable[[], None]) -> None:
    """Run ``work(path)`` for every path at once; call ``tick`` about once a second until all end or ``limit``."""
    threads = [threading.Thread(target=work, args=(path,), daemon=True) for path in paths]
    for thread in threads:
        thread.start()
    end = None if limit is None else time.monotonic() + limit
    for thread in threads:
        while thread.is_alive():
            wait = 1.0 if end is None else min(1.0, end - time.monotonic())
            if wait <= 0:
                return
            thread.join(wait)
            if thread.is_alive():
                tick()


def request_all(paths: list[str], method: str, url: str) -> dict[str, dict[str, Any] | None]:
    """Send one small request to every socket; ``None`` for a socket nobody answers on in time."""
    answers: dict[str, dict[str, Any] | None] = dict.fromkeys(paths)
    opened: list[_socket.socket] = []

    def one(path: str) -> None:
        try:
            answer = _exchange(path, method, url, time.monotonic() + _REQUEST_TIMEOUT, opened)
            answers[path] = json.loads(answer.body())
        except (_Unreachable, _Broken, ValueError):
            answers[path] = None

    try:
        _in_threads(one, paths, _REQUEST_TIMEOUT + 1.0, lambda: None)
    finally:
        _close(opened)
    return dict(answers)


class WorkerDrain:
    """What one worker said during a drain.

    A plain class, not a dataclass: this module is on the preStop hook's path, and
    ``dataclasses`` (with the ``inspect`` it imports) would cost the hook about 7 ms.
    """

    def __init__(
        self,
        path: str,
        *,
        pid: int | None = None,
        in_flight: int = 0,
        handed_off: int = 0,
        deadline: float | None = None,
        since_last_request: float | None = None,
        progressed: bool = False,
        propagation_over: bool = False,
        result: dict[str, Any] | None = None,
        error: str | None = None,
        reachable: bool = True,
    ) -> None:
        self.path = path
        self.pid = pid
        self.in_flight = in_flight
        self.handed_off = handed_off
        self.deadline = deadline
        self.since_last_request = since_last_request
        self.progressed = progressed
        self.propagation_over = propagation_over
        self.result = result
        self.error = error
        self.reachable = reachable
        self.refused = False  # the server answered 400: it judged the drain's options wrong

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None or not self.reachable

    def as_dict(self) -> dict[str, Any]:
        return {"socket": self.path, "pid": self.pid, "result": self.result, "error": self.error}


def drain_all(
    paths: list[str],
    *,
    propagation_wait: float | None = None,
    timeout: float | None = None,
    reason: str = "cli",
    propagation_quiet: float | None = None,
    on_tick: Callable[[list[WorkerDrain]], None] | None = None,
) -> list[WorkerDrain]:
    """Drain every worker concurrently; ``on_tick`` is called about once a second while any runs.

    Blocks until every worker has sent its final line, until the drain's own limit plus a
    margin has passed, or until a worker has sent nothing for ``_DRAIN_SILENCE`` seconds.
    """
    given = {"propagation_wait": propagation_wait, "propagation_quiet": propagation_quiet, "timeout": timeout}
    params = {"reason": reason, **{name: f"{value}s" for name, value in given.items() if value is not None}}
    workers = {path: WorkerDrain(path) for path in paths}
    limit = None if timeout is None else max(timeout, propagation_wait or 0.0) + _CLIENT_SLACK
    opened: list[_socket.socket] = []

    def one(path: str) -> None:
        worker = workers[path]
        try:
            answer = _exchange(path, "POST", "/drain?" + _query(params), None, opened, _DRAIN_SILENCE)
            if answer.status != 200:
                body = answer.body().decode(errors="replace").strip()
                worker.refused = answer.status == 400  # the server judged the options wrong: no drain began
                worker.error = _error_text(body) if worker.refused else f"HTTP {answer.status}: {body}"
                return
            for line in answer.lines():
                if line.strip():
                    _absorb(worker, json.loads(line))
        except _Unreachable:
            worker.reachable = False
            return
        except (_Broken, ValueError) as exc:
            if not given_up.is_set():  # else the socket was closed under it: the limit passed
                worker.error = f"lost the connection before the drain ended ({exc})"
            return
        if worker.result is None and not given_up.is_set():
            worker.error = "the server closed the connection before the drain ended"

    given_up = threading.Event()
    try:
        _in_threads(one, paths, limit, lambda: on_tick(list(workers.values())) if on_tick is not None else None)
    finally:
        given_up.set()
        for worker in workers.values():
            if not worker.done:
                worker.error = "no final answer in time"
        _close(opened)
    if not any(worker.reachable for worker in workers.values()):
        raise NoServer("no graceful server found: nothing is listening on " + ", ".join(paths))
    return list(workers.values())


def _absorb(worker: WorkerDrain, line: dict[str, Any]) -> None:
    event = line.get("event")
    if event == "status":
        worker.pid = line.get("pid")
        worker.deadline = line.get("deadline")
        worker.in_flight = int(line.get("in_flight") or 0)
    elif event == "progress":
        worker.in_flight = int(line.get("in_flight") or 0)
        worker.handed_off = int(line.get("handed_off") or 0)
        worker.progressed = True
        worker.propagation_over = bool(line.get("propagation_over"))
        since = line.get("since_last_request")
        worker.since_last_request = float(since) if isinstance(since, (int, float)) else None
    elif event == "result":
        worker.pid = line.get("pid", worker.pid)
        worker.in_flight = int(line.get("in_flight") or 0)
        worker.handed_off = int(line.get("handed_off") or 0)
        worker.deadline = line.get("deadline", worker.deadline)
        worker.result = line


def _error_text(body: str) -> str:
    """The message of a JSON answer ``{"error": "..."}`` (a 400's), else the body as it came."""
    try:
        return str(json.loads(body)["error"])
    except (ValueError, LookupError, TypeError):
        return body
