"""Helpers for the extra admin/CLI/launcher tests.

``FakeWorker`` is a real HTTP/1.1 peer on a real Unix socket that answers the CLI with a
scripted, misbehaving reply (an HTTP error, a cut stream, a stall): the ways a worker of
another version, or a dying one, can answer that a real ``AdminServer`` never does.
The apps are loaded by import string by ``graceful run``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.applications import Starlette

from graceful import GracefulMiddleware
from tests.apps.streaming import app as streaming_app


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def ndjson(*lines: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def status_line(pid: int) -> dict[str, Any]:
    return {"event": "status", "pid": pid, "state": "DRAINING", "in_flight": 2, "deadline": None}


class FakeWorker:
    """Listens on ``path``; answers each request with ``reply`` then closes, or holds the
    connection open until :meth:`close` when ``hold`` is set."""

    def __init__(self, path: str, reply: bytes, *, hold: bool = False) -> None:
        self.path = path
        self.reply = reply
        self.hold = hold
        self.requests: list[bytes] = []
        self.got_request = threading.Event()
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        self._sock.listen()
        self._sock.settimeout(0.05)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                head = b""
                while b"\r\n\r\n" not in head:
                    data = conn.recv(4096)
                    if not data:
                        break
                    head += data
                self.requests.append(head)
                self.got_request.set()
                conn.sendall(self.reply)
                if self.hold:
                    self._stop.wait(30)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def http_error(status: int, body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    head = f"HTTP/1.1 {status} Error\r\ncontent-type: application/json\r\ncontent-length: {len(payload)}\r\n"
    return head.encode() + b"connection: close\r\n\r\n" + payload


def ndjson_head() -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n"


# --- apps for `graceful run` -------------------------------------------------------------

# Workers that cannot be reached through an admin socket: the supervisor's drain finds nobody.
no_admin = GracefulMiddleware(streaming_app, admin=False, grace_period=6, reserve=1)


@contextlib.asynccontextmanager
async def _slow_lifespan(app: Starlette) -> AsyncIterator[None]:
    # Startup lasts until the test creates the file SLOW_START_RELEASE names, so that its SIGTERM
    # surely arrives while the drain is still STARTING (bounded at 30 s).
    print("slow startup begins", file=sys.stderr, flush=True)
    release = os.environ["SLOW_START_RELEASE"]
    with anyio.move_on_after(30):
        while not os.path.exists(release):
            await anyio.sleep(0.01)
    yield


slow_start = Starlette(routes=streaming_app.routes, lifespan=_slow_lifespan)


def main() -> None:
    """Run an AdminServer whose process may only open a few more files (``-m`` entry point).

    Prints ``ready <path>`` once listening; stops when stdin closes.
    """
    import logging
    import resource

    from graceful import Drain
    from graceful._admin._server import AdminServer

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
    headroom = int(sys.argv[1])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    async def run() -> None:
        drain = Drain(grace_period=6, reserve=1)
        drain.mark_serving()
        admin = AdminServer(drain, socket_dir=sys.argv[2], request_timeout=30, max_connections=64)
        async with anyio.create_task_group() as tg:
            await tg.start(admin.serve)
            stdin = anyio.wrap_file(sys.stdin)
            opened = len(os.listdir("/proc/self/fd"))
            resource.setrlimit(resource.RLIMIT_NOFILE, (opened + headroom, hard))
            print(f"ready {admin.path}", flush=True)
            try:
                await stdin.read()
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            tg.cancel_scope.cancel()

    anyio.run(run)


if __name__ == "__main__":
    main()
