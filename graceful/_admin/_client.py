"""The admin client: finds every worker's socket and talks to all of them at once.

It speaks the little HTTP/1.1 the admin server answers (``_server``) over the
Unix socket itself, with blocking sockets and one thread per worker: the preStop hook's
start-up counts against the grace period, and this keeps it free of asyncio and any
HTTP library.
"""

from __future__ import annotations

import json
import os
import socket as _socket
import stat
import threading
import time
from collections.abc import Callable

from ._paths import default_socket_dir
from ._wire import Broken, Event, Field, Unreachable, close, exchange

# typing's import costs the preStop hook milliseconds; mypy reads the annotations anyway.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["NoServer", "WorkerDrain", "discover", "drain_all", "request_all"]

# Grace on top of the server's own deadline: its final line follows the deadline by
# the time it takes to expire what is left (unwind_timeout) plus the on_drained hook.
_CLIENT_SLACK = 15.0


# Left as they are in a query string (urllib.parse's always-safe set); every other byte is %XX.
_QUERY_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def _query(params: dict[str, str]) -> str:
    """``urllib.parse.urlencode(params)``, without importing urllib.parse (and ipaddress) on the hook's path."""

    def quote(text: str) -> str:
        return "".join(
            chr(byte) if byte in _QUERY_SAFE else "+" if byte == 0x20 else f"%{byte:02X}" for byte in text.encode()
        )

    return "&".join(f"{quote(key)}={quote(value)}" for key, value in params.items())


class NoServer(Exception):
    """No socket found, or nothing listening on any of them (CLI exit code 3)."""


def discover(socket_dir: str | None = None, socket: str | None = None) -> list[str]:
    """The socket paths to talk to: ``socket`` alone, or every ``*.sock`` in the directory."""
    if socket is not None:
        return [socket]
    directory = socket_dir or default_socket_dir()
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        raise NoServer(f"no graceful server found: cannot read socket dir {directory!r} ({exc.strerror})") from None
    paths = []
    for name in names:
        path = os.path.join(directory, name)
        if name.endswith(".sock") and stat.S_ISSOCK(os.lstat(path).st_mode):
            paths.append(path)
    if not paths:
        raise NoServer(
            f"no graceful server found: no sockets in {directory!r}; "
            "is the server running with the same --socket-dir / GRACEFUL_SOCKET_DIR?"
        )
    return paths


# A small request (status, resume) gets this long, connect to last byte.
_REQUEST_TIMEOUT = 5.0
# A drain's answer has a line every second (progress); this long without a byte means the
# server stopped answering, whatever the drain's own limit. It bounds a hook run without
# --timeout too.
_DRAIN_SILENCE = 30.0


def _in_threads(work: Callable[[str], None], paths: list[str], limit: float | None, tick: Callable[[], None]) -> None:
    """Run ``work(path)`` for every path at once; call ``tick`` about once a second until all end or ``limit``."""
    threads = [threading.Thread(target=work, args=(path,), daemon=True) for path in paths]
    for thread in threads:
        thread.start()
    end = None if limit is None else time.monotonic() + limit
    for thread in threads:
        while thread.is_alive():
            wait = 1.0 if end is None else min(1.0, end - time.monotonic())
            if wait <= 0:
                return
            thread.join(wait)
            if thread.is_alive():
                tick()


def request_all(paths: list[str], method: str, url: str) -> dict[str, dict[str, Any] | None]:
    """Send one small request to every socket; ``None`` for a socket nobody answers on in time."""
    answers: dict[str, dict[str, Any] | None] = dict.fromkeys(paths)
    opened: list[_socket.socket] = []

    def one(path: str) -> None:
        try:
            answer = exchange(path, method, url, time.monotonic() + _REQUEST_TIMEOUT, opened)
            answers[path] = json.loads(answer.body())
        except (Unreachable, Broken, ValueError):
            answers[path] = None

    try:
        _in_threads(one, paths, _REQUEST_TIMEOUT + 1.0, lambda: None)
    finally:
        close(opened)
    return dict(answers)


class WorkerDrain:
    """What one worker said during a drain.

    A plain class, not a dataclass: this module is on the preStop hook's path, and
    ``dataclasses`` (with the ``inspect`` it imports) would cost the hook about 7 ms.
    """

    def __init__(
        self,
        path: str,
        *,
        pid: int | None = None,
        in_flight: int = 0,
        handed_off: int = 0,
        deadline: float | None = None,
        since_last_request: float | None = None,
        progressed: bool = False,
        propagation_over: bool = False,
        result: dict[str, Any] | None = None,
        error: str | None = None,
        reachable: bool = True,
    ) -> None:
        self.path = path
        self.pid = pid
        self.in_flight = in_flight
        self.handed_off = handed_off
        self.deadline = deadline
        self.since_last_request = since_last_request
        # When the last progress event came (time.monotonic()): its figures are that much older when read.
        self.heard: float | None = None
        self.progressed = progressed
        self.propagation_over = propagation_over
        self.result = result
        self.error = error
        self.reachable = reachable
        self.refused = False  # the server answered 400: it judged the drain's options wrong
        # The work in flight at the drain's start, judged by the durations the server saw
        # (``Drain.outlook``): in_flight, left, at_risk, expected, seen, older.
        self.outlook: dict[str, Any] | None = None
        # Why the drain under way began, when this request joined it rather than beginning one: its clock,
        # deadline and options stay, and this request's own were not applied.
        self.joined: str | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None or not self.reachable

    def as_dict(self) -> dict[str, Any]:
        return {"socket": self.path, "pid": self.pid, "result": self.result, "error": self.error}


def drain_all(
    paths: list[str],
    *,
    propagation_wait: float | None = None,
    timeout: float | None = None,
    reason: str = "cli",
    propagation_quiet: float | None = None,
    on_tick: Callable[[list[WorkerDrain]], None] | None = None,
    on_start: Callable[[WorkerDrain], None] | None = None,
) -> list[WorkerDrain]:
    """Drain every worker concurrently; ``on_tick`` is called about once a second while any runs,
    ``on_start`` once per worker when its drain has begun (from that worker's thread).

    Blocks until every worker has sent its final line, until the drain's own limit plus a
    margin has passed, or until a worker has sent nothing for ``_DRAIN_SILENCE`` seconds.
    """
    given = {"propagation_wait": propagation_wait, "propagation_quiet": propagation_quiet, "timeout": timeout}
    params = {"reason": reason, **{name: f"{value}s" for name, value in given.items() if value is not None}}
    workers = {path: WorkerDrain(path) for path in paths}
    limit = None if timeout is None else max(timeout, propagation_wait or 0.0) + _CLIENT_SLACK
    opened: list[_socket.socket] = []

    def one(path: str) -> None:
        worker = workers[path]
        try:
            answer = exchange(path, "POST", "/drain?" + _query(params), None, opened, _DRAIN_SILENCE)
            if answer.status != 200:
                body = answer.body().decode(errors="replace").strip()
                worker.refused = answer.status == 400  # the server judged the options wrong: no drain began
                worker.error = _error_text(body) if worker.refused else f"HTTP {answer.status}: {body}"
                return
            for line in answer.lines():
                if line.strip():
                    event = json.loads(line)
                    _absorb(worker, event)
                    if on_start is not None and event.get(Field.EVENT) == Event.STATUS:
                        on_start(worker)
        except Unreachable:
            worker.reachable = False
            return
        except (Broken, ValueError) as exc:
            if not given_up.is_set():  # else the socket was closed under it: the limit passed
                worker.error = f"lost the connection before the drain ended ({exc})"
            return
        if worker.result is None and not given_up.is_set():
            worker.error = "the server closed the connection before the drain ended"

    given_up = threading.Event()
    try:
        _in_threads(one, paths, limit, lambda: on_tick(list(workers.values())) if on_tick is not None else None)
    finally:
        given_up.set()
        for worker in workers.values():
            if not worker.done:
                worker.error = "no final answer in time"
        close(opened)
    if not any(worker.reachable for worker in workers.values()):
        raise NoServer("no graceful server found: nothing is listening on " + ", ".join(paths))
    return list(workers.values())


def _absorb(worker: WorkerDrain, line: dict[str, Any]) -> None:
    event = line.get(Field.EVENT)
    if event == Event.STATUS:
        worker.pid = line.get(Field.PID)
        worker.deadline = line.get(Field.DEADLINE)
        worker.in_flight = int(line.get(Field.IN_FLIGHT) or 0)
        ahead = line.get(Field.OUTLOOK)
        worker.outlook = ahead if isinstance(ahead, dict) else None
        joined = line.get(Field.JOINED)
        worker.joined = str(joined) if joined is not None else None
    elif event == Event.PROGRESS:
        worker.in_flight = int(line.get(Field.IN_FLIGHT) or 0)
        worker.handed_off = int(line.get(Field.HANDED_OFF) or 0)
        worker.progressed = True
        worker.propagation_over = bool(line.get(Field.PROPAGATION_OVER))
        since = line.get(Field.SINCE_LAST_REQUEST)
        worker.since_last_request = float(since) if isinstance(since, (int, float)) else None
        worker.heard = time.monotonic()
    elif event == Event.RESULT:
        worker.pid = line.get(Field.PID, worker.pid)
        worker.in_flight = int(line.get(Field.IN_FLIGHT) or 0)
        worker.handed_off = int(line.get(Field.HANDED_OFF) or 0)
        worker.deadline = line.get(Field.DEADLINE, worker.deadline)
        worker.result = line


def _error_text(body: str) -> str:
    """The message of a JSON answer ``{"error": "..."}`` (a 400's), else the body as it came."""
    try:
        return str(json.loads(body)[Field.ERROR])
    except (ValueError, LookupError, TypeError):
        return body
