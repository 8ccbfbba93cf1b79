"""Helpers for tests that need a real server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import uvicorn

ROOT = str(Path(__file__).resolve().parent.parent)


def listening_socket() -> socket.socket:
    """A TCP socket bound to a port the kernel picks on 127.0.0.1, already listening: hand it to the
    server (``sockets=[...]``), so no other process can take the port in between."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A port nothing can listen on while the block runs: held bound here, never listening, so
    every connection to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def run_uvicorn(
    app: Any, server_class: type[uvicorn.Server] = uvicorn.Server, **config: Any
) -> AsyncIterator[Any]:
    """Run ``app`` under a real uvicorn server in this event loop on 127.0.0.1.

    Yields the server; its port is ``server.port`` (a socket bound here and passed in). On exit
    the server is asked to stop, and forced if it has not stopped within 5 s.
    """
    sock = listening_socket()
    config.setdefault("log_level", "warning")
    server = server_class(uvicorn.Config(app, host="127.0.0.1", port=0, **config))
    server.port = sock.getsockname()[1]  # type: ignore[attr-defined]
    # Signals belong to the test runner, not to an in-process server.
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    done = anyio.Event()

    async def serve() -> None:
        try:
            await server.serve(sockets=[sock])
        finally:
            done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        with anyio.fail_after(10):
            while not server.started:  # uvicorn offers a flag, not an event
                if done.is_set():
                    raise RuntimeError("uvicorn failed to start")
                await anyio.sleep(0.005)
        try:
            yield server
        finally:
            server.should_exit = True
            with anyio.move_on_after(5):
                await done.wait()
            if not done.is_set():
                server.force_exit = True
                with anyio.move_on_after(5):
                    await done.wait()
            tg.cancel_scope.cancel()
            sock.close()
