"""The admin protocol's one home: its routes, query parameters and names, and one HTTP/1.1 exchange.

The server (``_server``) serves the routes in :class:`Route` with the methods of ``METHODS``, reads
a drain's query by :class:`Param`, and writes every answer through the names declared here
(:class:`Event`, :class:`Field`, :class:`Value`): from the drain's own snapshots it takes exactly the
fields each answer declares (``STATUS_FIELDS``, ``RESULT_FIELDS``...). The client (``_client``) and
the CLI ask and read through the same names. The exchange runs on a blocking socket, one per worker,
each in its own thread. Standard library only, and no HTTP library: ``graceful drain`` sends its
request from here (``send``), and the preStop hook's start-up counts against the grace period.
"""

from __future__ import annotations

import socket as _socket
import time
from collections.abc import Iterator

__all__ = [
    "DRAIN_SILENCE",
    "FAILURE_FIELDS",
    "METHODS",
    "OUTLOOK_FIELDS",
    "RESULT_FIELDS",
    "STATUS_FIELDS",
    "Answer",
    "Broken",
    "Event",
    "Field",
    "Param",
    "Route",
    "Unreachable",
    "Value",
    "close",
    "drain_params",
    "exchange",
    "send",
]

# A status line and headers longer than this are not from our server.
_MAX_HEAD = 16 * 1024
_MAX_LINE = 1024 * 1024


# -- The protocol's names -------------------------------------------------------------------------
# Every answer is one JSON object: GET /status answers the worker's status, POST /resume what it
# did, a refusal (4xx) {"error": ...}. POST /drain answers NDJSON, one event a line: a status event
# at once, a progress event at once, each second and at each new request of the propagation phase,
# and a result event when the drain ends. What both ends name is declared here once;
# tests/admin/test_wire.py holds the server and the readers to it. Plain classes of strings: each
# name is the string that goes on the wire, ready for JSON and a query.


class Route:
    """The admin server's paths; each takes the one method ``METHODS`` gives it."""

    STATUS = "/status"  # the worker's status
    DRAIN = "/drain"  # begin (or join) a drain, with the options of its query (Param); answered in NDJSON
    RESUME = "/resume"  # end a drain: serving again


METHODS = {Route.STATUS: "GET", Route.DRAIN: "POST", Route.RESUME: "POST"}


class Param:
    """The query parameters of ``POST /drain``: the drain's own options (durations such as ``10s``) and
    why it began."""

    PROPAGATION_WAIT = "propagation_wait"
    PROPAGATION_QUIET = "propagation_quiet"
    TIMEOUT = "timeout"
    REASON = "reason"


class Event:
    """The ``event`` of each line of a drain's answer, in their order."""

    STATUS = "status"  # the worker's status as the drain begins, with the outlook of its work in flight
    PROGRESS = "progress"
    RESULT = "result"  # the last line: the drain's outcome, or the error it raised


class Field:
    """The fields of the admin server's answers; a name shared by several answers means the same in each."""

    EVENT = "event"
    ERROR = "error"  # what was wrong: a refusal's, or a result's whose drain raised
    # The worker's status (GET /status, the status event).
    STATE = "state"
    FAILURE = "failure"  # why the worker is FAILED ({REASON, DETAIL, AT}), else null
    IN_FLIGHT = "in_flight"
    PID = "pid"
    SINCE = "since"
    DRAIN_STARTED = "drain_started"
    DEADLINE = "deadline"
    PROPAGATION_UNTIL = "propagation_until"
    LAST_REQUEST = "last_request"
    COUNTERS = "counters"
    BUDGET = "budget"  # the budget in force, by its options' names
    DURATIONS = "durations"  # {SINCE, UNTIL, BOUNDS, then per kind of request its counts and sum}
    PACE = "pace"  # the streams' pace admission="fits" judges by: {streams, time_per_token, first_token}
    PROPAGATION = "propagation"  # each drain's propagation phase; a result's: its own drain's
    OUTLOOK = "outlook"  # the status event's: {IN_FLIGHT, LEFT, AT_RISK, EXPECTED, SEEN, OLDER}
    JOINED = "joined"  # the status event's: why the drain this request joined began (its REASON), else null
    # A failure, the durations and an outlook.
    REASON = "reason"  # also a result's: why the drain began
    DETAIL = "detail"
    AT = "at"
    UNTIL = "until"
    BOUNDS = "bounds"
    LEFT = "left"
    AT_RISK = "at_risk"
    EXPECTED = "expected"
    SEEN = "seen"
    OLDER = "older"  # in flight longer than every request seen of its kind: not judged
    # A progress event (with STATE and IN_FLIGHT).
    HANDED_OFF = "handed_off"
    ELAPSED = "elapsed"
    DEADLINE_IN = "deadline_in"
    SINCE_LAST_REQUEST = "since_last_request"
    PROPAGATION_OVER = "propagation_over"
    # A result event (with PID, IN_FLIGHT, REASON, DEADLINE, HANDED_OFF, PROPAGATION and LAST_REQUEST).
    RESULT = "result"
    DRAINED = "drained"
    DURATION = "duration"
    STARTED_AT = "started_at"
    TRUNCATED = "truncated"
    LEFTOVER = "leftover"
    PROPAGATION_ENDED_BY = "propagation_ended_by"
    ANNOUNCED = "announced"
    # POST /resume's answer (with STATE, PID and FAILURE).
    RESUMED = "resumed"


class Value:
    """The values of a field that the readers test for, or that the server itself writes."""

    DRAINED = "drained"  # RESULT: nothing was left in flight
    TIMEOUT = "timeout"  # RESULT: the deadline passed with work in flight
    RESUMED = "resumed"  # RESULT: graceful resume (DRAINING -> SERVING) ended the drain
    ERROR = "error"  # RESULT: the drain raised; ERROR says what
    QUIET = "quiet"  # PROPAGATION_ENDED_BY: the quiet rule ended the propagation phase
    FAILED = "FAILED"  # STATE: the worker failed, and is never resumed


# The fields each answer takes from a drain's snapshot (``DrainStatus``, ``DrainResult``, ``Failure``,
# the outlook), in this order: the server sends these and no other (the durations' inner keys are the
# histograms' own format, read back by the drain's own code).
FAILURE_FIELDS = (Field.REASON, Field.DETAIL, Field.AT)
STATUS_FIELDS = (
    Field.STATE,
    Field.FAILURE,
    Field.IN_FLIGHT,
    Field.PID,
    Field.SINCE,
    Field.DRAIN_STARTED,
    Field.DEADLINE,
    Field.PROPAGATION_UNTIL,
    Field.LAST_REQUEST,
    Field.COUNTERS,
    Field.BUDGET,
    Field.DURATIONS,
    Field.PACE,
    Field.PROPAGATION,
)
OUTLOOK_FIELDS = (Field.IN_FLIGHT, Field.LEFT, Field.AT_RISK, Field.EXPECTED, Field.SEEN, Field.OLDER)
RESULT_FIELDS = (
    Field.RESULT,
    Field.DRAINED,
    Field.IN_FLIGHT,
    Field.DURATION,
    Field.REASON,
    Field.STARTED_AT,
    Field.DEADLINE,
    Field.TRUNCATED,
    Field.HANDED_OFF,
    Field.LEFTOVER,
    Field.PROPAGATION,
    Field.LAST_REQUEST,
    Field.PROPAGATION_ENDED_BY,
    Field.ANNOUNCED,
)

# A drain's answer has a line every second (progress); this long without a byte means the server
# stopped answering, whatever the drain's own limit. It bounds a drain run without a timeout too.
DRAIN_SILENCE = 30.0


def drain_params(
    reason: str,
    propagation_wait: float | None = None,
    propagation_quiet: float | None = None,
    timeout: float | None = None,
) -> dict[str, str]:
    """The query of ``POST /drain``, before encoding: ``reason``, then each option given, in seconds."""
    given = {
        Param.PROPAGATION_WAIT: propagation_wait,
        Param.PROPAGATION_QUIET: propagation_quiet,
        Param.TIMEOUT: timeout,
    }
    return {Param.REASON: reason, **{name: f"{value}s" for name, value in given.items() if value is not None}}


class Unreachable(Exception):
    """Nothing accepts connections on the socket."""


class Broken(Exception):
    """The answer stopped, ran out of time, or was not the HTTP/1.1 the admin server sends."""


class Answer:
    """One response read off a blocking socket: its status, then its body chunk by chunk or line by line.

    Every read ends by ``deadline`` (``time.monotonic()``), and after ``silence`` seconds
    without a byte; ``None`` leaves that bound out.
    """

    def __init__(self, sock: _socket.socket, deadline: float | None, silence: float | None = None) -> None:
        self.status = 0
        self._sock = sock
        self._deadline = deadline
        self._silence = silence
        self._chunked = False
        self._left: int | None = None
        self._buffer = b""

    def _more(self) -> bytes:
        wait = self._silence
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise Broken("no answer in time")
            wait = left if wait is None else min(wait, left)
        self._sock.settimeout(wait)
        try:
            return self._sock.recv(65536)
        except TimeoutError:
            if self._silence is not None and wait == self._silence:
                raise Broken(f"the server sent nothing for {self._silence:g} s") from None
            raise Broken("no answer in time") from None
        except OSError:
            return b""

    def _fill(self, size: int) -> None:
        while len(self._buffer) < size:
            data = self._more()
            if not data:
                raise Broken("the connection closed mid-answer")
            self._buffer += data

    def _until(self, marker: bytes, cap: int) -> bytes:
        while (end := self._buffer.find(marker)) < 0:
            if len(self._buffer) > cap:
                raise Broken("an answer line is too long")
            data = self._more()
            if not data:
                raise Broken("the connection closed mid-answer")
            self._buffer += data
        line, self._buffer = self._buffer[:end], self._buffer[end + len(marker) :]
        return line

    def read_head(self) -> None:
        head = self._until(b"\r\n\r\n", _MAX_HEAD)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise Broken(f"not an HTTP answer: {status_line[:60]!r}")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = headers.get("content-length", "")
        self.status = int(parts[1])
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._left = int(length) if length.isdigit() else None

    def chunks(self) -> Iterator[bytes]:
        if self._chunked:
            while True:
                size_line = self._until(b"\r\n", 64)
                try:
                    size = int(size_line.split(b";", 1)[0], 16)
                except ValueError:
                    raise Broken("a bad chunk size") from None
                if size == 0:
                    return
                self._fill(size + 2)
                chunk, self._buffer = self._buffer[:size], self._buffer[size + 2 :]
                yield chunk
        left = self._left
        while left is None or left > 0:
            data, self._buffer = self._buffer or self._more(), b""
            if not data:
                if left is None:
                    return
                raise Broken("the connection closed mid-answer")
            if left is not None:
                data = data[:left]
                left -= len(data)
            yield data

    def body(self) -> bytes:
        return b"".join(self.chunks())

    def lines(self) -> Iterator[bytes]:
        pending = b""
        for chunk in self.chunks():
            pending += chunk
            *complete, pending = pending.split(b"\n")
            yield from complete
            if len(pending) > _MAX_LINE:
                raise Broken("an answer line is too long")
        if pending:
            yield pending


def send(path: str, method: str, target: str, wait: float | None, opened: list[_socket.socket]) -> _socket.socket:
    """Connect to ``path`` and send one request without a body, each step bounded by ``wait`` seconds (None: none);
    the answer is the caller's to read (:class:`Answer`).

    The socket goes into ``opened``: the caller closes it, which also stops a read in another thread.
    """
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    opened.append(sock)
    sock.settimeout(wait)
    try:
        sock.connect(path)
    except TimeoutError:
        raise Broken("no answer in time") from None
    except OSError as exc:
        raise Unreachable(str(exc)) from None
    request = f"{method} {target} HTTP/1.1\r\nHost: graceful\r\nContent-Length: 0\r\n\r\n"
    try:
        sock.sendall(request.encode("ascii"))
    except OSError:
        raise Broken("the connection closed before the request was sent") from None
    return sock


def exchange(
    path: str,
    method: str,
    target: str,
    deadline: float | None,
    opened: list[_socket.socket],
    silence: float | None = None,
) -> Answer:
    """Send one request without a body and read the answer's head; the body is the caller's to read."""
    wait = silence if deadline is None else max(0.001, deadline - time.monotonic())
    answer = Answer(send(path, method, target, wait, opened), deadline, silence)
    answer.read_head()
    return answer


def close(sockets: list[_socket.socket]) -> None:
    for sock in sockets:
        try:
            sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
