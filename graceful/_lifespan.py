"""Lifespan: STARTING -> SERVING when the app's startup completes, STOPPED at shutdown.

The admin listener lives in the lifespan task, which every ASGI server keeps for
the life of the process, so it works under any server that runs lifespan.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup

from ._types import Message, Receive, Scope, Send

if TYPE_CHECKING:
    from ._middleware import GracefulMiddleware

logger = logging.getLogger("graceful")


async def lifespan(mw: GracefulMiddleware, scope: Scope, receive: Receive, send: Send) -> None:
    drain = mw.drain
    startup_seen = False

    async with anyio.create_task_group() as tg:

        async def wrapped_receive() -> Message:
            nonlocal startup_seen
            message = await receive()
            if message["type"] == "lifespan.startup":
                startup_seen = True
                await _start_admin(mw, tg)
                if mw.mirror is not None:
                    tg.start_soon(_mirror_loop, mw)
            return message

        async def wrapped_send(message: Message) -> None:
            kind = message["type"]
            if kind == "lifespan.startup.complete":
                if mw.ready_on_startup:
                    drain.mark_serving()
            elif kind == "lifespan.shutdown.complete":
                drain.mark_stopped()
            elif kind == "lifespan.startup.failed":
                drain.mark_stopped("startup failed")
            await send(message)

        try:
            try:
                await mw.app(scope, wrapped_receive, wrapped_send)
            except Exception:
                if startup_seen:
                    raise
                # The app does not speak lifespan (it raised before reading startup):
                # run the protocol ourselves so the state machine still moves.
                logger.info("the wrapped app does not support lifespan; graceful handles it")
                await _own_lifespan(wrapped_receive, wrapped_send)
        finally:
            tg.cancel_scope.cancel()


async def _own_lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _mirror_loop(mw: GracefulMiddleware) -> None:
    while True:
        await anyio.sleep(1.0)
        mw.mirror.sync()


async def _start_admin(mw: GracefulMiddleware, tg: TaskGroup) -> None:
    if not mw.admin:
        return
    from ._admin import AdminServer

    server = AdminServer(mw.drain, socket_dir=mw.socket_dir, socket_mode=mw.socket_mode)
    await tg.start(server.serve)
    mw.admin_server = server
