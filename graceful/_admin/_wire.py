"""One HTTP/1.1 exchange with an admin server over its Unix socket, on a blocking socket.

The admin client (``_client``) runs one per worker, each in its own thread. Standard library
only, and no HTTP library: the preStop hook's start-up counts against the grace period.
"""

from __future__ import annotations

import socket as _socket
import time
from collections.abc import Iterator

__all__ = ["Answer", "Broken", "Unreachable", "close", "exchange"]

# A status line and headers longer than this are not from our server.
_MAX_HEAD = 16 * 1024
_MAX_LINE = 1024 * 1024


class Unreachable(Exception):
    """Nothing accepts connections on the socket."""


class Broken(Exception):
    """The answer stopped, ran out of time, or was not the HTTP/1.1 the admin server sends."""


class Answer:
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
                raise Broken("no answer in time")
            wait = left if wait is None else min(wait, left)
        self._sock.settimeout(wait)
        try:
            return self._sock.recv(65536)
        except TimeoutError:
            if self._silence is not None and wait == self._silence:
                raise Broken(f"the server sent nothing for {self._silence:g} s") from None
            raise Broken("no answer in time") from None
        except OSError:
            return b""

    def _fill(self, size: int) -> None:
        while len(self._buffer) < size:
            data = self._more()
            if not data:
                raise Broken("the connection closed mid-answer")
            self._buffer += data

    def _until(self, marker: bytes, cap: int) -> bytes:
        while (end := self._buffer.find(marker)) < 0:
            if len(self._buffer) > cap:
                raise Broken("an answer line is too long")
            data = self._more()
            if not data:
                raise Broken("the connection closed mid-answer")
            self._buffer += data
        line, self._buffer = self._buffer[:end], self._buffer[end + len(marker) :]
        return line

    def read_head(self) -> None:
        head = self._until(b"\r\n\r\n", _MAX_HEAD)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise Broken(f"not an HTTP answer: {status_line[:60]!r}")
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
                    raise Broken("a bad chunk size") from None
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
                raise Broken("the connection closed mid-answer")
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
                raise Broken("an answer line is too long")
        if pending:
            yield pending


def exchange(
    path: str,
    method: str,
    target: str,
    deadline: float | None,
    opened: list[_socket.socket],
    silence: float | None = None,
) -> Answer:
    """Send one request without a body and read the answer's head; the body is the caller's to read.

    The socket goes into ``opened``: the caller closes it, which also stops a read in another thread.
    """
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    opened.append(sock)
    sock.settimeout(silence if deadline is None else max(0.001, deadline - time.monotonic()))
    try:
        sock.connect(path)
    except TimeoutError:
        raise Broken("no answer in time") from None
    except OSError as exc:
        raise Unreachable(str(exc)) from None
    request = f"{method} {target} HTTP/1.1\r\nHost: graceful\r\nContent-Length: 0\r\n\r\n"
    try:
        sock.sendall(request.encode("ascii"))
    except OSError:
        raise Broken("the connection closed before the request was sent") from None
    answer = Answer(sock, deadline, silence)
    answer.read_head()
    return answer


def close(sockets: list[_socket.socket]) -> None:
    for sock in sockets:
        try:
            sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
