"""Lifespan: STARTING -> SERVING when the app's startup completes, STOPPED at shutdown.

The admin listener and the SIGTERM takeover live in the lifespan task, which every
ASGI server keeps for the life of the process, so they work under any server that
runs lifespan. A lifespan startup after a shutdown begins a new lifecycle of the same
``Drain`` (``Core.restart``).

The app decides when its lifespan ends. graceful only watches the messages as they
pass: it never answers for the app, and the call returns (or raises) the moment the
app's does, with what the app returned or raised. An app that returns without reading
startup (lifespan unsupported), or whose lifespan ends before the server's shutdown,
leaves graceful as if no lifespan ran: requests are served (``_lifecycle``) and the
log says once what the process then lacks.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from .._drain._errors import ConfigError
from .._drain._observed import SWEEP
from ._admission import Sampler
from ._log import show_in_server_log
from ._shared import Shared
from ._types import Message, Receive, Scope, Send

if TYPE_CHECKING:
    from .._drain._ledger import Ledger
    from ._metrics import MultiprocessMirror

logger = logging.getLogger("graceful")

_STOP_REASONS = {
    "lifespan.shutdown.complete": "shutdown",
    "lifespan.shutdown.failed": "shutdown failed",
    "lifespan.startup.failed": "startup failed",
}


async def lifespan(shared: Shared, scope: Scope, receive: Receive, send: Send) -> None:
    """Watch the app's lifespan, moving the machine; what the app sends, returns or raises reaches the server."""
    drain = shared.drain
    lifecycle = shared.lifecycle
    services = _Services(shared)
    stopped = False  # the app said its lifespan ended (shutdown complete, or a failure)
    failed = False  # graceful failed the startup: the server has heard the end of this lifespan
    error: BaseException | None = None
    lifecycle.running += 1
    try:
        async with anyio.create_task_group() as tg:

            async def wrapped_receive() -> Message:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    shared.core.restart()  # STOPPED -> STARTING: the same app started again
                return message

            async def wrapped_send(message: Message) -> None:
                nonlocal stopped, failed
                if failed:
                    # The server has exited on the startup failure graceful sent: what the app says
                    # after it (Starlette's shutdown.failed, with the traceback of its cancelled
                    # receive) is not news to it, and would be printed whole (issue 51).
                    return
                kind = message["type"]
                # Several lifespans at once (one app object run by two servers together): the first
                # one started the admin listener and the SIGTERM takeover, the last one stops.
                alone = lifecycle.running == 1
                if kind == "lifespan.startup.complete":
                    show_in_server_log(logger)  # after the app's own startup, which may configure logging
                    if alone and not services.started:  # an app may send it twice: the server judges that
                        try:
                            await tg.start(services.run)
                        except Exception as exc:
                            # Fail the server's startup loudly (it exits) rather than serve without
                            # the admin socket that the preStop hook needs.
                            drain.mark_stopped("startup failed")
                            stopped = failed = True
                            failure = f"graceful: {_cause(exc, shared)}"
                            await send({"type": "lifespan.startup.failed", "message": failure})
                            return
                    if shared.options.ready_on_startup:
                        drain.mark_serving()
                elif kind in _STOP_REASONS:
                    stopped = True
                    if alone:
                        drain.mark_stopped(_STOP_REASONS[kind])
                        # Close the admin socket before the server hears we are done: servers stop
                        # their loop right after this message and would cancel us mid-cleanup.
                        await services.stop()
                await send(message)

            try:
                await shared.app(scope, wrapped_receive, wrapped_send)
                if services.started and not stopped:
                    logger.warning(
                        "the app's lifespan returned before the server's shutdown: graceful's admin socket and "
                        "SIGTERM drain end with it; keep the lifespan running until lifespan.shutdown"
                    )
            except anyio.get_cancelled_exc_class():
                raise  # the server cancelling the lifespan: the task group's to handle
            except BaseException as exc:
                # Raised again below, outside the task group, which would wrap it in an
                # ExceptionGroup: the server must see the app's own exception (SystemExit and
                # KeyboardInterrupt too), as unwrapped.
                error = exc
            finally:
                await services.stop()
    finally:
        lifecycle.running -= 1
    if error is not None:
        try:
            raise error
        finally:
            error = None  # no reference cycle through this frame


def _cause(exc: BaseException, shared: Shared) -> str:
    """What failed at startup, in one line: the errors inside the task groups' ExceptionGroups (whose
    own message only counts them), each as the user can act on it."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(dict.fromkeys(_cause(inner, shared) for inner in exc.exceptions))
    if isinstance(exc, ConfigError):
        return str(exc)
    if isinstance(exc, OSError) and shared.options.admin:
        from .._admin._paths import DEFAULT_DIR, default_socket_dir

        options = shared.options
        where = options.socket_dir or default_socket_dir()
        return (
            f"{options.socket_dir_name or DEFAULT_DIR}: cannot create the admin socket in {where!r} "
            f"({exc.strerror or exc}); choose a directory of this user's, or turn the admin socket off "
            "(admin=False, GRACEFUL_ADMIN=0) and drain through SIGTERM"
        )
    logger.error("startup failed", exc_info=exc)  # not a setting: a bug, whose traceback is the lead
    return f"{type(exc).__name__}: {exc}"


class _Services:
    """What lives for the lifespan of the process: the admin listener, the metrics mirror and the
    ledger's count of the request durations."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.scope = anyio.CancelScope()
        self.stopped = anyio.Event()
        self.started = False

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        shared = self.shared
        self.started = True
        try:
            with self.scope:
                async with anyio.create_task_group() as tg:
                    options = shared.options
                    if options.admin:
                        from .._admin._server import AdminServer

                        server = AdminServer(
                            shared.drain,
                            socket_dir=options.socket_dir,
                            socket_mode=options.socket_mode,
                            socket_dir_name=options.socket_dir_name or None,
                        )
                        await tg.start(server.serve)
                    if shared.mirror is not None:
                        tg.start_soon(_mirror_loop, shared.mirror)
                    tg.start_soon(_count_loop, shared.ledger, Sampler(shared.ledger, shared.core.tally.pace))
                    if shared.core.middleware_drains_on_sigterm:
                        from ._signals import SignalDrain

                        await tg.start(SignalDrain(shared.drain).run)
                    task_status.started()
        finally:
            self.stopped.set()

    async def stop(self) -> None:
        if self.started:
            self.scope.cancel()
            await self.stopped.wait()


async def _count_loop(ledger: Ledger, sampler: Sampler) -> None:
    while True:
        await anyio.sleep(SWEEP)
        ledger.count_durations()
        sampler.sweep()  # the pace admission="fits" judges by (``_admission``)


async def _mirror_loop(mirror: MultiprocessMirror) -> None:
    while True:
        await anyio.sleep(1.0)
        mirror.sync()
