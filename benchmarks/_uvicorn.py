"""uvicorn servers for the end-to-end benchmarks, pinned to a CPU, and a keep-alive client for them.

``benchmarks.e2e`` loads them with wrk, ``benchmarks.e2e_profile`` counts what they execute,
``benchmarks.engine`` serves a metrics page from one.
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from benchmarks._live import root

__all__ = ["Server", "cpu_ns", "cpus", "drive", "launched", "pin", "uvicorn_server"]


def pin(cpu: int) -> Callable[[], None]:
    """For ``preexec_fn``: the child runs on ``cpu`` only, from before its first instruction (threads included)."""
    return functools.partial(os.sched_setaffinity, 0, {cpu})


def cpus(what: str) -> tuple[int, int]:
    """The server's CPU and its client's: the first two this process may run on; exits when there is only one."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        sys.exit(
            f"{what} needs 2 CPUs (the server on one, its client on another) but may use only {allowed}: "
            f"run it on a machine with 2 or more cores, or widen the affinity (taskset -c 0,1 python -m {what})"
        )
    return allowed[0], allowed[1]


def cpu_ns(pid: int) -> int:
    """CPU time process ``pid``'s main thread has run, in ns (uvicorn serves from that one thread)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def _answers(port: int) -> bool:
    """Whether the server behind ``port`` answers an HTTP request (any status)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
            return bool(sock.recv(1))
    except OSError:
        return False


# uvicorn on a listening socket it inherits. Not uvicorn's own --fd: that wraps the descriptor as
# AF_UNIX whatever it is, so asyncio leaves TCP_NODELAY off on the TCP connections, and Nagle's
# algorithm against delayed ACKs then holds each small response about 40 ms (both variants stall
# near 370 req/s at 16 connections). socket(fileno=...) reads the real family from the descriptor.
_LAUNCH = """\
import socket, sys, uvicorn
sock = socket.socket(fileno=int(sys.argv[2]))
uvicorn.Server(uvicorn.Config(sys.argv[1], log_level="warning", access_log=False)).run(sockets=[sock])
"""


@dataclass(frozen=True)
class Server:
    port: int
    pid: int


@contextmanager
def uvicorn_server(target: str, cpu: int | None = None, *, env: dict[str, str] | None = None) -> Iterator[Server]:
    """uvicorn serving ``target`` (``module:attribute``), 1 worker, no access log."""
    with launched(lambda fd: [sys.executable, "-c", _LAUNCH, target, str(fd)], target, cpu, env=env) as server:
        yield server


@contextmanager
def launched(
    command: Callable[[int], list[str]],
    name: str,
    cpu: int | None = None,
    *,
    env: dict[str, str] | None = None,
    start_limit: float = 20.0,
    stop_limit: float = 10.0,
) -> Iterator[Server]:
    """The server ``command(fd)`` starts on a listening socket it inherits as ``fd``: bound and
    listening here, so no other process can take its port in between. Stopped on exit."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    port = int(listener.getsockname()[1])
    # wrk cuts its connections mid-stream when it stops, and asyncio logs each cut write on stderr:
    # into a file, read only to say why a server did not start.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            command(listener.fileno()),
            cwd=root(),
            stdout=subprocess.DEVNULL,
            stderr=log,
            pass_fds=(listener.fileno(),),
            env=env,
            preexec_fn=None if cpu is None else pin(cpu),
        )
        listener.close()
        try:
            deadline = time.monotonic() + start_limit
            while not _answers(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    said = log.read()[-2000:].decode(errors="replace").strip()
                    raise RuntimeError(f"uvicorn {name} did not start (exit code {proc.poll()}): {said}")
                time.sleep(0.02)
            yield Server(port, proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(stop_limit)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _read_response(sock: socket.socket, buf: bytes) -> bytes:
    """Read one response (Content-Length or chunked) from ``buf`` + ``sock``; return what follows it."""
    while b"\r\n\r\n" not in buf:
        buf += _recv(sock)
    head, _, rest = buf.partition(b"\r\n\r\n")
    lower = head.lower()
    if b"transfer-encoding: chunked" in lower:
        end = b"\r\n0\r\n\r\n"
        while end not in b"\r\n" + rest:
            rest += _recv(sock)
        return rest[(b"\r\n" + rest).index(end) + len(end) - 2 :]
    length = int(lower.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    while len(rest) < length:
        rest += _recv(sock)
    return rest[length:]


def _recv(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise ConnectionError("the server closed a connection mid-response")
    return chunk


def drive(port: int, path: str, n: int, connections: int) -> None:
    """Exactly ``n`` GET requests over ``connections`` keep-alive connections, that many in flight at a time
    (as ``wrk -c``): each turn sends one request on every connection, then reads every answer."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=120) for _ in range(connections)]
    try:
        for sock in socks:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
        bufs = [b""] * connections
        done = 0
        while done < n:
            turn = min(connections, n - done)
            for sock in socks[:turn]:
                sock.sendall(request)
            for i in range(turn):
                bufs[i] = _read_response(socks[i], bufs[i])
            done += turn
    finally:
        for sock in socks:
            sock.close()
