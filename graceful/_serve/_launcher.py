"""The launcher: uvicorn with SIGTERM wired to the drain (``graceful run``).

Plain uvicorn stops listening the moment SIGTERM arrives. Here SIGTERM starts the
same drain a preStop hook would start, the listener keeps serving through the
propagation wait (answering 503 after it, or during it when refusing), and uvicorn
is told to exit only once the drain has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import logging
import logging.config
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Generator, Sequence
from types import FrameType
from typing import Any

import anyio
import uvicorn
from uvicorn.config import LOGGING_CONFIG
from uvicorn.supervisors.multiprocess import Multiprocess

from .._admin._paths import LONGEST_PID, default_socket_dir, socket_path
from .._asgi._stop import FIRST, FORCE, HANDLED_SIGNALS, StopSignals
from .._asgi._types import ASGIApp
from .._drain._environ import variable
from .._drain._errors import ConfigError
from .._drain._state import Drain, core
from .._drain._status import State
from ._load import Flag, in_flag_words, load_app, refuse_contradictions

__all__ = ["CannotListen", "GracefulServer", "serve"]

logger = logging.getLogger("graceful")

_APP_ENV = "GRACEFUL_RUN_APP"
_FORCED_EXIT = 1


class GracefulServer(uvicorn.Server):
    """A ``uvicorn.Server`` whose first SIGTERM/SIGINT drains and whose second forces exit
    (a repeat within ``REPEAT_WINDOW`` of the first is the same stop: ``StopSignals``).

    ``forced_exits`` counts forced exits. It is the drain's launcher (``Core.set_launcher``):
    SIGTERM drains here, and at the start of any drain (signal, preStop or admin socket) the
    peers of its open connections are pinned, each served one more request.
    """

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        self.forced_exits = 0
        self.signals_received = 0
        self._stops = StopSignals()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._drain_task: asyncio.Task[None] | None = None
        core(drain).set_launcher("graceful run", self._open_peers)  # the middleware leaves SIGTERM alone

    async def serve(self, sockets: list[Any] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        await super().serve(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # Unlike uvicorn's, this one does not re-raise the signal afterwards: a drained
        # shutdown is a success and exits 0.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Signal handlers run between bytecodes of whatever the loop was doing: only hand over.
        if self._loop is None:
            self.should_exit = True
            return
        self._loop.call_soon_threadsafe(self._on_signal, sig, time.monotonic())

    def _on_signal(self, sig: int, at: float | None = None) -> None:
        name = signal.Signals(sig).name
        self.signals_received += 1
        meaning = self._stops.received(sig, at)
        if meaning is FORCE:
            self.forced_exits += 1
            logger.warning("second signal (%s): forcing exit with %d request(s) in flight", name, self.drain.in_flight)
            self.force_exit = True
            self.should_exit = True
            self._wake()
            return
        if meaning is not FIRST:
            return
        if self.drain.state in (State.STARTING, State.STOPPED):
            logger.info("%s received while %s: exiting", name, self.drain.state.value)
            self.should_exit = True
            self._wake()
            return
        logger.info(
            "%s received: draining (state %s, %d in flight)", name, self.drain.state.value, self.drain.in_flight
        )
        self._drain_task = asyncio.ensure_future(self._drain_then_exit(name))

    async def _drain_then_exit(self, reason: str) -> None:
        # Joins a preStop drain if one runs: same clock, same deadline.
        try:
            result = await self.drain.drain(reason=reason)
            logger.info("drain ended (%s): shutting down", result.result)
        finally:  # exit even if the drain itself failed
            self.should_exit = True
            self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    def _open_peers(self) -> set[Any]:
        """The peers of the open connections, idle ones included: kube-proxy keeps them pinned here after
        the endpoint is gone, and the middleware serves one more request on each (admit_during_propagation)."""
        connections: list[Any] = list(self.server_state.connections)
        return {conn.client for conn in connections if getattr(conn, "client", None)}

    async def main_loop(self) -> None:
        # uvicorn polls should_exit every 0.1 s; we wake on an event so exit follows the
        # drain at once, and still tick regularly for the date header.
        assert self._wakeup is not None
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            try:
                await asyncio.wait_for(self._wakeup.wait(), 0.1)
            except TimeoutError:
                counter = (counter + 1) % 864000
            self._wakeup.clear()
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        if not self.force_exit and (self.drain.in_flight or self.drain.state is not State.DRAINING):
            return await super().shutdown(sockets)
        if not self.force_exit:
            return await self._shutdown_idle(sockets)
        logger.warning("forced exit: cutting %d connection(s)", len(self.server_state.connections))
        for server in self.servers:
            server.close()
        for task in list(self.server_state.tasks):
            task.cancel("forced exit")
        for conn in list(self.server_state.connections):
            transport = getattr(conn, "transport", None)
            if transport is not None:
                transport.close()

    async def _shutdown_idle(self, sockets: list[Any] | None) -> None:
        """After a drain nothing is in flight: close at once instead of uvicorn's fixed 0.1 s pause.

        Idle keep-alive connections are closed only now, at exit (the keep-alive rule).
        """
        logger.info("shutting down after the drain: closing %d idle connection(s)", len(self.server_state.connections))
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        with anyio.move_on_after(5):
            # uvicorn offers no event for "connections closed"; they go within a loop turn or two.
            while self.server_state.connections or self.server_state.tasks:
                await asyncio.sleep(0.002)
        for server in self.servers:
            await server.wait_closed()
        await self.lifespan.shutdown()


class _Supervisor(Multiprocess):
    """uvicorn's multiprocess supervisor; SIGTERM drains every worker before stopping them.

    Workers run plain ``uvicorn.Server`` (uvicorn builds them itself), so the supervisor
    drains them through their admin sockets, then lets uvicorn send each one SIGTERM.
    """

    def __init__(self, config: uvicorn.Config, sockets: list[Any], socket_dir: str) -> None:
        super().__init__(config, sockets)
        self.socket_dir = socket_dir
        self.forced_exits = 0
        self._stops = StopSignals()
        self._drainer: threading.Thread | None = None
        # uvicorn's supervisor queues signals and handles them every 0.5 s: the repeat window is
        # judged by when each arrived, so a duplicate that straddles a check is still a repeat.
        self._arrivals: list[float] = []
        for sig in HANDLED_SIGNALS:
            signal.signal(sig, self._queue_signal)

    def _queue_signal(self, sig: int, frame: FrameType | None) -> None:
        self._arrivals.append(time.monotonic())
        self.signal_queue.append(sig)

    def handle_term(self) -> None:
        self._on_signal(signal.SIGTERM)

    def handle_int(self) -> None:
        self._on_signal(signal.SIGINT)

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        meaning = self._stops.received(sig, self._arrivals.pop(0) if self._arrivals else None)
        if meaning is FORCE:
            self.forced_exits += 1
            logger.warning("second signal (%s): killing %d worker(s) now", name, len(self.processes))
            for process in self.processes:
                process.kill()
            self.should_exit.set()
            return
        if meaning is not FIRST:
            return
        logger.info("%s received: draining %d worker(s)", name, len(self.processes))
        self._drainer = threading.Thread(target=self._drain_workers, args=(name,), daemon=True)
        self._drainer.start()

    def _drain_workers(self, reason: str) -> None:
        from .._admin._client import NoServer, drain_all

        paths = [socket_path(self.socket_dir, process.pid) for process in self.processes if process.pid]
        try:
            workers = drain_all(paths, reason=reason)
            for worker in workers:
                outcome = worker.result.get("result") if worker.result else worker.error
                logger.info("worker %s: %s", worker.pid or worker.path, outcome)
        except NoServer as exc:
            logger.warning("%s", exc)
        except Exception:  # the supervisor must still stop its workers
            logger.exception("draining the workers failed")
        self.should_exit.set()


def _worker_app() -> ASGIApp:
    """App factory for ``--workers N``: each spawned worker loads the app itself, its variables inherited."""
    app, middleware = load_app(os.environ[_APP_ENV])
    core(middleware.drain).set_launcher("graceful run --workers")  # the supervisor drains the workers
    return app


def _log_config(level: str) -> dict[str, Any]:
    # uvicorn configures only its own loggers (in every worker too): add ours beside them.
    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["graceful"] = {"handlers": ["default"], "level": level.upper(), "propagate": False}
    return config


@contextlib.contextmanager
def _set_for_the_app(flags: Sequence[Flag], app_dir: str | None) -> Generator[None, None, None]:
    """Each flag's variable (replacing one already set: a flag beats a variable, and the app's code beats
    both) and ``--app-dir`` first on the import path, as uvicorn's (``graceful run myapp:app`` finds
    ./myapp.py); both are undone if the app is refused, so that a command embedded in another process
    leaves it as it was."""
    saved = {variable(flag.option): os.environ.get(variable(flag.option)) for flag in flags}
    path = list(sys.path)
    for flag in flags:
        os.environ[variable(flag.option)] = flag.text
    if app_dir is not None:
        sys.path.insert(0, app_dir)
    try:
        yield
    except BaseException:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        sys.path[:] = path
        raise


class CannotListen(Exception):
    """The address to listen on cannot be bound (in use, or not this host's): the server cannot start."""


def check_address(host: str, port: int) -> None:
    """Refuse a port that cannot be bound before the app is imported (which may take minutes): one line
    (:class:`CannotListen`), not uvicorn's error after the app's startup, whose lifespan uvicorn's exit would
    cut. uvicorn binds the listener itself after the startup (port 0 is any free port: nothing to check)."""
    if not port:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn tells an IPv6 host
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a TIME_WAIT port is free
        try:
            probe.bind((host, port))
        except OSError as exc:
            fix = "stop what holds it or choose another --port" if exc.errno == errno.EADDRINUSE else "check --host"
            raise CannotListen(f"cannot listen on {host}:{port}: {exc.strerror or exc}; {fix}") from None


def serve(target: str, flags: Sequence[Flag] = (), *, app_dir: str | None = None, **config: Any) -> int:
    """Run ``target`` under uvicorn until drained; return the process exit code.

    Each flag sets its option's variable before the app is imported, so that every GracefulMiddleware
    and Drain the app builds, at import or at its first call, fills the options its code left unset from
    it (and ``--workers`` inherit it); a flag that contradicts a value set in code is refused."""
    workers = config.pop("workers", 1)
    if not config.get("uds"):
        check_address(config.get("host", "127.0.0.1"), config.get("port", 8000))
    config.setdefault("log_config", _log_config(config.get("log_level", "info")))
    with _set_for_the_app(flags, app_dir):
        try:
            app, middleware = load_app(target, folder=app_dir)
            refuse_contradictions(target, middleware, flags)
        except ConfigError as exc:
            raise ConfigError(in_flag_words(str(exc), flags)) from None
        socket_dir = middleware.options.socket_dir or default_socket_dir()
        socket_path(socket_dir, LONGEST_PID)  # refuse a long dir before starting
    drain = middleware.drain
    # Only once the options are known good: this replaces the process's logging setup.
    logging.config.dictConfig(config["log_config"])
    logger.info("budget: %s", drain.budget.describe(admit=drain.config.admit_during_propagation))
    if workers > 1:
        os.environ[_APP_ENV] = target
        uconfig = uvicorn.Config("graceful._serve._launcher:_worker_app", factory=True, workers=workers, **config)
        supervisor = _Supervisor(uconfig, [uconfig.bind_socket()], socket_dir)
        supervisor.run()
        return _FORCED_EXIT if supervisor.forced_exits else 0
    # uvicorn binds and listens after the app's startup, and only then says "running on": a client (or a
    # test) that waits for that line finds the port accepting. A port in use was refused above, before the
    # import (check_address).
    server = GracefulServer(uvicorn.Config(app, **config), drain)
    server.run()
    return _FORCED_EXIT if server.forced_exits else 0
