"""Lifespan: STARTING -> SERVING when the app's startup completes, STOPPED at shutdown.

The admin listener and the SIGTERM takeover live in the lifespan task, which every
ASGI server keeps for the life of the process, so they work under any server that
runs lifespan.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from ._config import Config
from ._types import Message, Receive, Scope, Send

if TYPE_CHECKING:
    from ._metrics import MultiprocessMirror

logger = logging.getLogger("graceful")


async def lifespan(config: Config, scope: Scope, receive: Receive, send: Send) -> None:
    drain = config.drain
    startup_seen = False
    services = _Services(config)

    async with anyio.create_task_group() as tg:

        async def wrapped_receive() -> Message:
            nonlocal startup_seen
            message = await receive()
            if message["type"] == "lifespan.startup":
                startup_seen = True
            return message

        async def wrapped_send(message: Message) -> None:
            kind = message["type"]
            if kind == "lifespan.startup.complete":
                try:
                    await tg.start(services.run)
                except Exception as exc:
                    # Fail the server's startup loudly (it exits) rather than serve without
                    # the admin socket that the preStop hook needs.
                    drain.mark_stopped("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": f"graceful: {exc}"})
                    return
                if config.ready_on_startup:
                    drain.mark_serving()
            elif kind in ("lifespan.shutdown.complete", "lifespan.startup.failed"):
                drain.mark_stopped("shutdown" if kind == "lifespan.shutdown.complete" else "startup failed")
                # Close the admin socket before the server hears we are done: servers stop
                # their loop right after this message and would cancel us mid-cleanup.
                await services.stop()
            await send(message)

        try:
            try:
                await config.app(scope, wrapped_receive, wrapped_send)
            except Exception:
                if startup_seen:
                    raise
            if not startup_seen:
                # The app does not speak lifespan (it raised or returned before reading
                # startup): run the protocol ourselves so the state machine still moves.
                logger.info("the wrapped app does not support lifespan; graceful handles it")
                await _own_lifespan(wrapped_receive, wrapped_send)
        finally:
            await services.stop()


class _Services:
    """What lives for the lifespan of the process: the admin listener and the metrics mirror."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.scope = anyio.CancelScope()
        self.stopped = anyio.Event()
        self.running = False

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        config = self.config
        self.running = True
        try:
            with self.scope:
                async with anyio.create_task_group() as tg:
                    if config.admin:
                        from ._admin_server import AdminServer

                        server = AdminServer(config.drain, socket_dir=config.socket_dir, socket_mode=config.socket_mode)
                        await tg.start(server.serve)
                    if config.mirror is not None:
                        tg.start_soon(_mirror_loop, config.mirror)
                    drain = config.drain
                    if drain.config.drain_on_sigterm and drain.signals_owner is None:
                        from ._signals import SignalDrain

                        await tg.start(SignalDrain(drain).run)
                    task_status.started()
        finally:
            self.stopped.set()

    async def stop(self) -> None:
        if self.running:
            self.scope.cancel()
            await self.stopped.wait()


async def _own_lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _mirror_loop(mirror: MultiprocessMirror) -> None:
    while True:
        await anyio.sleep(1.0)
        mirror.sync()
