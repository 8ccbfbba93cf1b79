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
async def run_uvicorn(app: Any, **config: Any) -> AsyncIterator[uvicorn.Server]:
    """Run ``app`` under a real uvicorn server in this event loop; yields the server.

    The bound port is ``server.port`` (an attribute we add). Startup is awaited on the
    server's own ``started`` flag, and shutdown is forced if a test leaves work behind.
    """
    port = free_port()
    config.setdefault("log_level", "warning")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, **config))
    server.port = port  # type: ignore[attr-defined]
    # uvicorn.Server.capture_signals only acts in the main thread; keep the test runner's handlers.
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(10):
            while not server.started:
                await anyio.sleep(0.005)
        try:
            yield server
        finally:
            server.should_exit = True
            with anyio.move_on_after(10) as scope:
                while server.started and not getattr(server, "_exited", False):
                    await anyio.sleep(0.01)
                    if not tg.cancel_scope.cancel_called and scope.deadline - anyio.current_time() < 5:
                        server.force_exit = True
            tg.cancel_scope.cancel()
