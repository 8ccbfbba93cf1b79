"""``graceful drain`` once its request is sent: the workers' answers, the lines printed and the exit code.

The preStop hook's fast path (``_prestop``) judges the options, finds the sockets and sends every
worker the drain, then hands the sockets here: each worker's answer is read in its own thread
(``_admin._client``), its progress printed about once a second, and the report and the exit code
follow when every worker has answered.
"""

from __future__ import annotations

import json
import sys
import time
from socket import socket
from typing import Any

from .._admin._client import WorkerDrain, follow_drains
from .._admin._paths import NoServer
from .._admin._wire import Field, Value

__all__ = ["EXIT_LEFTOVER", "EXIT_NO_SERVER", "EXIT_OK", "EXIT_USAGE", "follow", "say"]

# The command line's exit codes (docs/cli.md): done, work left at the deadline (or a worker failed),
# usage or configuration error, no server found.
EXIT_OK, EXIT_LEFTOVER, EXIT_USAGE, EXIT_NO_SERVER = 0, 1, 2, 3


def follow(
    sent: dict[str, socket | Exception],
    opened: list[socket],
    window: tuple[float | None, float | None],
    started: float,
    asked: list[str],
    *,
    quiet: bool,
    json_output: bool,
    missing: NoServer | None = None,
) -> int:
    """Read every worker's answer to the drain ``sent`` (by path: the socket, or why none was sent) until
    each has ended; returns the exit code. ``window``: the drain's propagation wait and timeout, which
    bound the wait; ``started``: when the command began (``time.monotonic()``); ``asked``: this drain's
    options as typed, which a worker already draining does not apply; ``missing``: why no socket was found."""

    def progress(workers: list[WorkerDrain]) -> None:
        if not quiet:
            say(_progress_line(workers, time.monotonic() - started))

    def begun(worker: WorkerDrain) -> None:
        if worker.joined is not None and (asked or not quiet):
            say(_joined_line(worker, asked))
        line, at_risk = _outlook_line(worker)
        if line and (at_risk or not quiet):
            say(line)

    wait, timeout = window
    if missing is not None:
        say(f"graceful drain: {missing}")
        return EXIT_NO_SERVER
    try:
        workers = follow_drains(sent, opened, propagation_wait=wait, timeout=timeout, on_tick=progress, on_start=begun)
    except NoServer as exc:
        say(f"graceful drain: {exc}")
        return EXIT_NO_SERVER
    return _conclude(workers, started, quiet=quiet, json_output=json_output)


def say(line: str, *, out: bool = False) -> None:
    stream = sys.stdout if out else sys.stderr
    stream.write(line + "\n")
    stream.flush()


def _conclude(workers: list[WorkerDrain], started: float, *, quiet: bool, json_output: bool) -> int:
    live = [w for w in workers if w.reachable]
    ok = all(w.result is not None and w.result.get(Field.RESULT) == Value.DRAINED for w in live)
    if json_output:
        outcome = {"result": "drained" if ok else "timeout", "workers": [w.as_dict() for w in live]}
        say(json.dumps(outcome), out=True)
    for worker in workers:
        if not worker.reachable:
            say(f"graceful drain: skipped {worker.path}: nothing listening (stale socket)")
    if not quiet or not ok:
        for line in _report(live, time.monotonic() - started):
            say(line)
    if any(w.refused for w in live):
        return EXIT_USAGE  # a server judged the options as this command does: no drain began there
    return EXIT_OK if ok else EXIT_LEFTOVER


def _progress_line(workers: list[WorkerDrain], elapsed: float) -> str:
    live = [w for w in workers if w.reachable]
    running = [w for w in live if w.result is None]
    in_flight = sum(w.in_flight for w in running)
    deadlines = [w.deadline for w in running if w.deadline]
    line = f"draining {len(live)} worker{'s' if len(live) != 1 else ''}: {in_flight} in flight, {elapsed:.1f} s elapsed"
    handed = sum(w.handed_off for w in live)
    if handed:
        line += f", {handed} stream{'s' if handed != 1 else ''} handed off"
    if deadlines:
        line += f", deadline in {max(0.0, max(deadlines) - time.time()):.0f} s"
    # During the propagation phase: how long since traffic last arrived (the quiet rule's clock), as of
    # now: the server measured it when it sent its last progress event, up to a second ago.
    propagating = [w for w in running if w.progressed and not w.propagation_over]
    now = time.monotonic()
    quiet = [
        w.since_last_request + (0.0 if w.heard is None else max(0.0, now - w.heard))
        for w in propagating
        if w.since_last_request is not None
    ]
    if quiet:
        line += f", last new request {min(quiet):.1f} s ago"
    elif propagating:
        line += ", no new request since the drain began"
    elif any(w.progressed for w in running):
        line += ", propagation over"
    return line


def _joined_line(worker: WorkerDrain, asked: list[str]) -> str:
    """A worker was already draining: this drain joined that one, which keeps its clock and deadline
    (``Drain.begin_drain``), and says which of this drain's options were not applied."""
    name = f"worker {worker.pid}" if worker.pid else worker.path
    deadline = f" (deadline in {max(0.0, worker.deadline - time.time()):.0f} s)" if worker.deadline else ""
    line = (
        f"graceful drain: {name} was already draining (begun by {worker.joined}): joined that drain, "
        f"which keeps its own clock and deadline{deadline}"
    )
    return f"{line}; not applied: {', '.join(asked)}" if asked else line


def _outlook_line(worker: WorkerDrain) -> tuple[str, int]:
    """What the worker's drain starts with: its work in flight judged by the durations it has seen,
    and how many may outlast the deadline ("" when the server sent no outlook)."""
    ahead = worker.outlook
    if not ahead:
        return "", 0
    name = f"worker {worker.pid}" if worker.pid else worker.path
    try:
        in_flight, left, seen = int(ahead[Field.IN_FLIGHT]), float(ahead[Field.LEFT]), int(ahead[Field.SEEN])
        at_risk, expected = int(ahead[Field.AT_RISK]), float(ahead[Field.EXPECTED])
        older = int(ahead.get(Field.OLDER) or 0)  # a server before issue 51 sends none
    except (KeyError, TypeError, ValueError):
        return "", 0  # a server's outlook this hook cannot read: the drain goes on without the line
    start = f"{name}: {in_flight} in flight at the drain's start, {left:.0f} s to the deadline"
    if not in_flight:
        return start, 0
    if not seen:
        return f"{start}; no finished request seen yet to judge them by", 0
    # Work that has run longer than every request seen has nothing to judge it by: said as such, no forecast.
    older_is, them = ("1 is", "it") if older == 1 else (f"{older} are", "them")
    if older == in_flight:
        return f"{start}; {older_is} older than every one of the {seen} requests seen (nothing to judge {them} by)", 0
    tail = f"; {older_is} older than every request seen (nothing to judge {them} by)" if older else ""
    if not at_risk:
        return f"{start}; by the {seen} requests seen, none should outlast it{tail}", 0
    return (
        f"{start}; by the {seen} requests seen, {at_risk} may outlast it "
        f"(about {expected:.1f} expected to be cut; graceful advise says which grace period holds them){tail}",
        at_risk,
    )


def _propagation_note(result: dict[str, Any]) -> str:
    propagation, last = result.get(Field.PROPAGATION), result.get(Field.LAST_REQUEST)
    if not isinstance(propagation, (int, float)):
        return ""
    notes = [f"propagation phase {propagation:.1f} s"]
    if result.get(Field.PROPAGATION_ENDED_BY) == Value.QUIET:
        notes.append("ended by the quiet rule")
    announced = result.get(Field.ANNOUNCED)
    if isinstance(announced, (int, float)):
        notes.append(f"announced at {announced:.1f} s")
    notes.append(f"last new request at {last:.1f} s" if isinstance(last, (int, float)) else "no new request")
    return f" ({', '.join(notes)})"


def _report(workers: list[WorkerDrain], elapsed: float) -> list[str]:
    lines = []
    for worker in workers:
        name = f"worker {worker.pid}" if worker.pid else worker.path
        result = worker.result
        if result is None:
            lines.append(f"{name}: {worker.error}")
        elif result.get(Field.RESULT) == Value.DRAINED:
            handed = result.get(Field.HANDED_OFF) or 0
            note = f"; {handed} stream{'s' if handed != 1 else ''} handed off" if handed else ""
            lines.append(f"{name}: drained in {result.get(Field.DURATION, 0):.1f} s{_propagation_note(result)}{note}")
        elif result.get(Field.RESULT) == Value.RESUMED:
            # Ended by graceful resume, not by a deadline: what was in flight goes on being served.
            lines.append(
                f"{name}: resumed after {result.get(Field.DURATION, 0):.1f} s (graceful resume): serving again, "
                f"with {result.get(Field.IN_FLIGHT, 0)} in flight"
            )
        elif result.get(Field.RESULT) == Value.TIMEOUT:
            ended = result.get(Field.TRUNCATED, 0)
            lines.append(
                f"{name}: {result.get(Field.RESULT)} with {result.get(Field.IN_FLIGHT, 0)} in flight; "
                f"{ended} ended at the deadline (streams got a final retryable error event)"
            )
            lines.extend(f"  left: {item}" for item in result.get(Field.LEFTOVER) or [])
        else:  # stopped (the server shut down mid-drain), or the drain raised
            error = f": {result[Field.ERROR]}" if result.get(Field.ERROR) else ""
            lines.append(f"{name}: {result.get(Field.RESULT)} with {result.get(Field.IN_FLIGHT, 0)} in flight{error}")
    drained = sum(1 for w in workers if w.result is not None and w.result.get(Field.RESULT) == Value.DRAINED)
    lines.append(f"drained {drained} of {len(workers)} worker{'s' if len(workers) != 1 else ''} in {elapsed:.1f} s")
    return lines
