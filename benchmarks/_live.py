"""A real ``graceful run`` server in a subprocess, and blocking clients for it (probes, admin, held streams)."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["HeldStream", "Server", "graceful_run", "root", "wait_for"]


def root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def listening_port(pid: int) -> int | None:
    """The TCP port process ``pid`` listens on at 127.0.0.1, read from /proc (it bound port 0)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return None
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes and fields[1].startswith("0100007F:"):
                return int(fields[1].split(":")[1], 16)
    return None


def wait_for(check: object, timeout: float = 20.0, what: str = "condition") -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.0005)


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    socket_dir: str

    @property
    def admin_path(self) -> str:
        return os.path.join(self.socket_dir, f"{self.proc.pid}.sock")

    def probe(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def admin(self, method: str, target: str) -> socket.socket:
        """Send one admin request and return the connected socket (the reply is still to be read)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.connect(self.admin_path)
        sock.sendall(f"{method} {target} HTTP/1.1\r\nhost: graceful\r\ncontent-length: 0\r\n\r\n".encode())
        return sock

    def admin_reply(self, method: str, target: str) -> bytes:
        with self.admin(method, target) as sock:
            return read_all(sock)

    def resume(self) -> None:
        self.admin_reply("POST", "/resume")
        conn = self.probe()
        try:
            wait_for(lambda: get(conn, "/ready") == 200, what="/ready 200 after resume")
        finally:
            conn.close()

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "graceful", *args, "--socket-dir", self.socket_dir]


def read_all(sock: socket.socket) -> bytes:
    chunks: list[bytes] = []
    while True:
        data = sock.recv(65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def get(conn: http.client.HTTPConnection, path: str) -> int:
    """One GET on a keep-alive connection; http.client reconnects by itself after Connection: close."""
    conn.request("GET", path)
    response = conn.getresponse()
    response.read()
    if response.will_close:
        conn.close()
    return response.status


@contextmanager
def graceful_run(app: str = "benchmarks.apps:holder", *options: str) -> Iterator[Server]:
    """``graceful run APP`` on 127.0.0.1 with its own short socket dir; waits until /ready answers 200."""
    with tempfile.TemporaryDirectory(prefix="gb-", dir="/tmp") as socket_dir:
        # Port 0: the kernel picks a free port as the server binds it (no window for another process).
        command = [sys.executable, "-m", "graceful", "run", app, "--port", "0", "--socket-dir", socket_dir]
        proc = subprocess.Popen(
            [*command, "--log-level", "warning", *options],
            cwd=root(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        found: list[int] = []

        def bound() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"graceful run exited with {proc.returncode}")
            port = listening_port(proc.pid)
            found.extend([port] if port else [])
            return bool(port)

        server = Server(proc, 0, socket_dir)
        try:
            wait_for(bound, what="graceful run to listen")
            server.port = found[0]
            conn = server.probe()

            def ready() -> bool:
                if proc.poll() is not None:
                    raise RuntimeError(f"graceful run exited with {proc.returncode}")
                try:
                    return get(conn, "/ready") == 200 and os.path.exists(server.admin_path)
                except OSError:
                    conn.close()
                    return False

            wait_for(ready, what="graceful run to serve")
            conn.close()
            yield server
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


class HeldStream:
    """A ``POST /v1/hold`` stream: open until :meth:`finish` sends the body, which makes the app send its last frame."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(b"POST /v1/hold HTTP/1.1\r\nhost: bench\r\ncontent-length: 1\r\n\r\n")
        self.buffer = b""
        while b"data:" not in self.buffer:  # the first frame: the app holds the stream now
            self.buffer += self._recv()

    def _recv(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise RuntimeError(f"held stream closed early: {self.buffer!r}")
        return data

    def finish(self) -> float:
        """Release the stream; return perf_counter() when its final (empty) chunk has arrived."""
        self.sock.sendall(b"x")
        while not self.buffer.endswith(b"0\r\n\r\n"):
            self.buffer += self._recv()
        at = time.perf_counter()
        self.sock.close()
        return at
