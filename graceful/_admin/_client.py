"""The admin client: talks to every worker's admin server at once.

It speaks the little HTTP/1.1 the admin server answers (``_server``) over the Unix socket itself
(``_wire``), with blocking sockets and one thread per worker: no asyncio and no HTTP library. The
sockets are found in ``_paths`` (``discover``).
"""

from __future__ import annotations

import json
import socket as _socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ._paths import NoServer, discover
from ._wire import (
    DRAIN_SILENCE,
    METHODS,
    Answer,
    Broken,
    Event,
    Field,
    Route,
    Unreachable,
    close,
    drain_params,
    exchange,
    send,
)

__all__ = ["NoServer", "WorkerDrain", "discover", "drain_all", "follow_drains", "request_all"]

# Grace on top of the server's own deadline: its final line follows the deadline by
# the time it takes to expire what is left (unwind_timeout) plus the on_drained hook.
_CLIENT_SLACK = 15.0


# A small request (status, resume) gets this long, connect to last byte.
_REQUEST_TIMEOUT = 5.0


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

    A plain class: ``graceful drain`` reads its answers in a short-lived process, and ``dataclasses`` (with
    the ``inspect`` it imports) would cost that process about 7 ms.
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
    silence: float = DRAIN_SILENCE,
) -> list[WorkerDrain]:
    """Drain every worker: send each the drain, then :func:`follow_drains`."""
    from urllib.parse import urlencode  # here: ``graceful drain`` sends its own request (``_cli._prestop``)

    target = Route.DRAIN + "?" + urlencode(drain_params(reason, propagation_wait, propagation_quiet, timeout))
    opened: list[_socket.socket] = []
    sent: dict[str, _socket.socket | Exception] = {}
    for path in paths:
        try:
            sent[path] = send(path, METHODS[Route.DRAIN], target, silence, opened)
        except (Unreachable, Broken) as exc:
            sent[path] = exc
    return follow_drains(
        sent,
        opened,
        propagation_wait=propagation_wait,
        timeout=timeout,
        on_tick=on_tick,
        on_start=on_start,
        silence=silence,
    )


def follow_drains(
    sent: dict[str, _socket.socket | Exception],
    opened: list[_socket.socket],
    *,
    propagation_wait: float | None,
    timeout: float | None,
    on_tick: Callable[[list[WorkerDrain]], None] | None = None,
    on_start: Callable[[WorkerDrain], None] | None = None,
    silence: float = DRAIN_SILENCE,
) -> list[WorkerDrain]:
    """Read every worker's answer to the drain ``sent`` to it (by path: the socket the request went out on,
    or the :class:`Unreachable` or :class:`Broken` that kept it from going), each in its own thread;
    ``on_tick`` is called about once a second while any runs, ``on_start`` once per worker when its drain
    has begun (from that worker's thread). ``opened`` (every socket) is closed at the end.

    Blocks until every worker has sent its final line, until the drain's own limit (``timeout``, or
    ``propagation_wait`` when longer) plus a margin has passed, or until a worker has sent nothing for
    ``silence`` seconds. Raises :class:`NoServer` when no socket had anyone listening.
    """
    paths = list(sent)
    workers = {path: WorkerDrain(path) for path in paths}
    limit = None if timeout is None else max(timeout, propagation_wait or 0.0) + _CLIENT_SLACK

    def one(path: str) -> None:
        worker = workers[path]
        try:
            sock = sent[path]
            if isinstance(sock, Exception):
                raise sock
            answer = Answer(sock, None, silence)
            answer.read_head()
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
