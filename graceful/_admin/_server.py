"""The server end of the admin protocol; ``_client`` is its client end.

HTTP/1.1 over a private Unix socket, one per worker process.

It is started by the middleware's lifespan and so runs under any ASGI server that
runs lifespan. There is deliberately no TCP variant: draining a pod is a local,
privileged act (the preStop hook runs inside the container).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import stat
import time
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
import h11

from .._drain._errors import ConfigError
from .._drain._options import Overrides
from .._drain._state import Drain, State, core
from ._answers import (
    drain_options,
    failure_answer,
    outlook_answer,
    progress_answer,
    result_answer,
    status_answer,
)
from ._paths import DEFAULT_DIR, SOCKET_MODE, default_socket_dir, prepare_socket_dir, socket_path
from ._wire import METHODS, Event, Field, Param, Route, Value

__all__ = ["AdminServer", "is_listening", "remove_stale"]

logger = logging.getLogger("graceful")

MAX_REQUEST = 64 * 1024
_ARRIVAL_GAP = 0.1  # seconds: a drain's progress lines sent on new requests come at most this often
_NDJSON = [(b"content-type", b"application/x-ndjson"), (b"cache-control", b"no-store")]
_ROUTES = {route: method.encode() for route, method in METHODS.items()}


def is_listening(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            return False
        return True


def _pid_alive(name: str) -> bool:
    """Whether the process a ``<pid>.sock`` is named after still runs (and is not us)."""
    try:
        pid = int(name[: -len(".sock")])
    except ValueError:
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def remove_stale(socket_dir: str) -> list[str]:
    """Delete ``*.sock`` files left by a process that is gone; return them.

    Nothing listening is not enough: a sibling worker that has bound its socket but not
    yet called listen() refuses connections too, so the named process must be gone.
    """
    removed = []
    for name in os.listdir(socket_dir):
        path = os.path.join(socket_dir, name)
        if (
            name.endswith(".sock")
            and stat.S_ISSOCK(os.lstat(path).st_mode)
            and not _pid_alive(name)
            and not is_listening(path)
        ):
            try:
                os.unlink(path)
            except FileNotFoundError:  # another worker removed it first
                continue
            removed.append(path)
    return removed


class AdminServer:
    """Serves ``GET /status``, ``POST /drain`` and ``POST /resume`` for one :class:`Drain`.

    Each connection carries one request and is closed after the answer. A misbehaving
    client only ever costs its own connection: every error is contained here.
    """

    def __init__(
        self,
        drain: Drain,
        *,
        socket_dir: str | None = None,
        socket_mode: int | None = None,
        socket_dir_name: str | None = None,
        max_connections: int = 64,
        request_timeout: float = 5.0,
        write_timeout: float = 5.0,
    ) -> None:
        socket_mode = SOCKET_MODE if socket_mode is None else socket_mode
        if socket_mode not in (0o600, 0o660):
            raise ConfigError(f"socket_mode {socket_mode:#o} is not allowed; use 0o600 (default) or 0o660 (group)")
        self.drain = drain
        self.socket_dir = socket_dir or default_socket_dir()
        # How the user gave the directory (the middleware knows: the option in code, or its variable), for the
        # startup's messages; the default's words when none was given.
        self.socket_dir_name = socket_dir_name or ("socket_dir" if socket_dir else DEFAULT_DIR)
        self.socket_mode = socket_mode
        self.path = ""
        self._identity = 0
        self.request_timeout = request_timeout
        self.write_timeout = write_timeout
        self._slots = anyio.Semaphore(max_connections)

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        # The file-system calls run in a worker thread: an app's own tests may check that
        # nothing blocks its event loop (Starlette's suite runs under blockbuster).
        # A ConfigError goes up unlogged: the lifespan fails the server's startup with it, and the server
        # prints it, once (issue 51).
        path = await anyio.to_thread.run_sync(self._prepare)
        listener = await anyio.create_unix_listener(path, mode=self.socket_mode)
        self.path = path
        self._identity = await anyio.to_thread.run_sync(lambda: os.stat(path).st_ino)
        logger.debug("admin listener on %s", path)
        try:
            async with listener, anyio.create_task_group() as tg:
                task_status.started()
                while True:
                    try:
                        stream = await listener.accept()
                    except (OSError, anyio.BrokenResourceError) as exc:  # EMFILE and friends (anyio wraps them)
                        logger.warning("admin listener accept failed: %s", exc.__cause__ or exc)
                        await anyio.sleep(0.1)
                        continue
                    tg.start_soon(self._connection, stream, tg)
        finally:
            # Lifespan shutdown stops us before it tells the server (see _lifespan), so the name is
            # gone before a server that re-raises SIGTERM (plain uvicorn) ends the process.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._unlink)

    def _prepare(self) -> str:
        name = self.socket_dir_name
        prepare_socket_dir(self.socket_dir, group=self.socket_mode == 0o660, name=name)
        path = socket_path(self.socket_dir, os.getpid())
        for stale in remove_stale(self.socket_dir):
            logger.debug("removed stale admin socket %s", stale)
        if os.path.exists(path) and is_listening(path):
            raise ConfigError(
                f"{name}: {self.socket_dir!r}: another process listens on {path!r}, this process's admin socket; "
                "give each server a directory of its own"
            )
        return path

    def _unlink(self) -> None:
        # Only remove the file if it is still ours (a successor may have replaced it).
        if not self.path:
            return
        try:
            if os.stat(self.path).st_ino == self._identity:
                os.unlink(self.path)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                logger.warning("could not remove admin socket %s: %s", self.path, exc)

    async def _connection(self, stream: anyio.abc.ByteStream, tg: anyio.abc.TaskGroup) -> None:
        async with stream:
            if self._slots.value == 0:
                logger.warning("admin listener: too many connections; closing a new one")
                return
            async with self._slots:
                try:
                    await _Responder(self, stream, tg).run()
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, h11.ProtocolError, OSError, TimeoutError):
                    pass
                except Exception:  # the inference server must never feel an admin client
                    logger.exception("admin request failed")


class _Responder:
    """One request and its answer on one connection."""

    def __init__(self, server: AdminServer, stream: anyio.abc.ByteStream, tg: anyio.abc.TaskGroup) -> None:
        self.server = server
        self.drain = server.drain
        self.core = core(server.drain)
        self.stream = stream
        self.tg = tg
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST)

    async def run(self) -> None:
        try:
            with anyio.fail_after(self.server.request_timeout):
                request = await self._read_request()
        except h11.RemoteProtocolError as exc:
            status = 413 if exc.error_status_hint in (413, 431) else 400
            await self._answer_error(status, f"bad request: {exc}")
            return
        except TimeoutError:
            return  # idle or half-sent: just close
        if request is None:
            return
        target = urlsplit(request.target.decode("ascii", "replace"))
        method = _ROUTES.get(target.path)
        if method is None:
            return await self._answer(
                404, {Field.ERROR: f"no such path {target.path!r}; use {Route.STATUS}, {Route.DRAIN} or {Route.RESUME}"}
            )
        if request.method != method:
            return await self._answer(
                405, {Field.ERROR: f"{target.path} takes {method.decode()}"}, ((b"allow", method),)
            )
        if target.path == Route.STATUS:
            self.core.ledger.count_durations()  # durations up to this instant, not the last periodic count's
            return await self._answer(200, status_answer(self.drain))
        if target.path == Route.RESUME:
            resumed = self.drain.resume()
            failure = self.drain.failure
            answer = {Field.RESUMED: resumed, Field.STATE: self.drain.state.value, Field.PID: os.getpid()}
            return await self._answer(200, {**answer, Field.FAILURE: failure_answer(failure)})
        try:
            options = drain_options(target.query)
            # Values the parser cannot judge alone (propagation_quiet against the wait)
            # get their 400 here, before the stream begins.
            overrides = self.core.overrides(
                options[Param.PROPAGATION_WAIT], options[Param.PROPAGATION_QUIET], options[Param.TIMEOUT]
            )
        except ConfigError as exc:
            return await self._answer(400, {Field.ERROR: str(exc)})
        # The work in flight as the drain finds it, judged by the durations seen (the hook prints it).
        ahead = outlook_answer(self.core.outlook(overrides.limit))
        await self._stream_drain(ahead, overrides, reason=options[Param.REASON])

    async def _read_request(self) -> h11.Request | None:
        request: h11.Request | None = None
        size = 0
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                try:
                    data = await self.stream.receive(8192)
                except anyio.EndOfStream:  # the peer closed (a liveness probe, a half-sent request)
                    data = b""
                self.conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                request = event
                head = len(event.target) + sum(len(name) + len(value) for name, value in event.headers)
                length = dict(event.headers).get(b"content-length")
                if head > MAX_REQUEST:
                    raise h11.RemoteProtocolError("request headers too long", error_status_hint=413)
                if length is not None and int(length) > MAX_REQUEST:
                    raise h11.RemoteProtocolError("request body too long", error_status_hint=413)
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > MAX_REQUEST:
                    raise h11.RemoteProtocolError("request body too long", error_status_hint=413)
            elif isinstance(event, h11.EndOfMessage):
                return request
            elif isinstance(event, h11.ConnectionClosed):
                return None

    async def _send(self, *events: h11.Event) -> None:
        with anyio.fail_after(self.server.write_timeout):
            for event in events:
                data = self.conn.send(event)
                if data:
                    await self.stream.send(data)

    async def _answer(self, status: int, body: dict[str, Any], extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        payload = json.dumps(body).encode() + b"\n"
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"connection", b"close"),
            *extra,
        ]
        await self._send(h11.Response(status_code=status, headers=headers), h11.Data(data=payload), h11.EndOfMessage())

    async def _answer_error(self, status: int, message: str) -> None:
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            await self._answer(status, {Field.ERROR: message})

    async def _stream_drain(self, ahead: dict[str, object], overrides: Overrides, *, reason: str) -> None:
        drain = self.drain
        inner = self.core
        done = anyio.Event()
        result: dict[str, object] = {}

        # Begun here, at once (judged before the answer began): the status event says whether this request
        # began the drain or joined one already under way, whose clock and deadline it keeps.
        run = inner.run
        failure: Exception | None = None
        try:
            began = inner.begin(reason, overrides)
        except Exception as exc:  # a state listener raised: the drain's result says so, below
            began, failure = True, exc
        joined = None if began or run is None or drain.state is State.STOPPED else run.reason

        async def run_drain() -> None:
            # In the listener's task group, not this connection's: a preStop hook that is
            # killed mid-way must not stop the drain it started.
            try:
                if failure is not None:
                    raise failure
                outcome = await inner.join()
                result.update(result_answer(outcome))
            except Exception as exc:  # never let it reach the lifespan task group
                logger.exception("drain failed")
                result.update({Field.RESULT: Value.ERROR, Field.ERROR: repr(exc)})
            finally:
                done.set()

        self.tg.start_soon(run_drain)
        headers = [*_NDJSON, (b"connection", b"close")]
        await self._send(h11.Response(status_code=200, headers=headers))
        status = {Field.EVENT: Event.STATUS, **status_answer(drain), Field.OUTLOOK: ahead, Field.JOINED: joined}
        await self._line(status)
        # A progress line at once, then each second and at each new request of the propagation phase
        # (_ARRIVAL_GAP apart at most): the hook's lines on the last new request are true when printed.
        await self._line(progress_answer(drain))
        tick = time.monotonic() + 1.0
        while not done.is_set():
            with anyio.move_on_after(tick - time.monotonic()):
                await inner.until_arrival(done)
            if done.is_set():
                break
            await self._line(progress_answer(drain))
            if time.monotonic() < tick:  # sent on an arrival: the next one waits a little
                with anyio.move_on_after(_ARRIVAL_GAP):
                    await done.wait()
            else:
                tick = time.monotonic() + 1.0
        await self._line({Field.EVENT: Event.RESULT, Field.PID: os.getpid(), **result})
        await self._send(h11.EndOfMessage())

    async def _line(self, body: dict[str, object]) -> None:
        await self._send(h11.Data(data=json.dumps(body).encode() + b"\n"))
