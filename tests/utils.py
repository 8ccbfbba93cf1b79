"""Helpers for tests that need a real server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import anyio
import uvicorn


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def run_uvicorn(
    app: Any, server_class: type[uvicorn.Server] = uvicorn.Server, **config: Any
) -> AsyncIterator[Any]:
    """Run ``app`` under a real uvicorn server in this event loop on 127.0.0.1.

    Yields the server; its port is ``server.port``. On exit the server is asked to
    stop, and forced if it has not stopped within 5 s.
    """
    port = free_port()
    config.setdefault("log_level", "warning")
    server = server_class(uvicorn.Config(app, host="127.0.0.1", port=port, **config))
    server.port = port  # type: ignore[attr-defined]
    # Signals belong to the test runner, not to an in-process server.
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    done = anyio.Event()

    async def serve() -> None:
        try:
            await server.serve()
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
