"""``graceful drain`` against graceful servers: the drain, its progress lines and its report.

The preStop hook's start-up counts against the grace period, and importing click is most of
it. So this module does not import click: the ``drain`` command of the click CLI calls
:func:`run_drain` after click has read its options, and the console script reads the common
forms of the command line itself (:func:`read_args`) and calls it directly. Anything it does
not read (``--help``, engine mode, an unknown option, a value it cannot parse) goes to click,
which then reads the whole command line and says what is wrong as it always does.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping

from .._admin._client import NoServer, WorkerDrain, discover, drain_all
from .._admin._paths import search_dir_problem
from .._admin._wire import Field, Value
from .._drain._durations import FLAGS, check_option, check_quiet, default_reserve, judge_drain, resolve_grace
from .._drain._errors import ConfigError
from .._drain._names import variable

# typing's import costs the preStop hook milliseconds; mypy reads the annotations anyway.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "BOTH_SOCKETS",
    "EXIT_LEFTOVER",
    "EXIT_NO_SERVER",
    "EXIT_OK",
    "EXIT_USAGE",
    "UsageProblem",
    "read_args",
    "run_drain",
    "socket_dir_to_search",
]

EXIT_OK, EXIT_LEFTOVER, EXIT_USAGE, EXIT_NO_SERVER = 0, 1, 2, 3
BOTH_SOCKETS = "use --socket-dir or --socket, not both"

# The options read here, as the click command declares them: name -> takes a duration value
# (True), a path value (False) or no value (None, a flag). tests/cli/test_cli_drain.py checks this
# table against the click command, so the two readers cannot drift apart.
OPTIONS: dict[str, bool | None] = {
    "--socket-dir": False,
    "--socket": False,
    "--propagation-wait": True,
    "--propagation-quiet": True,
    "--timeout": True,
    "--grace-period": True,
    "--quiet": None,
    "-q": None,
    "--json": None,
}
_PARAMETER = {"-q": "quiet", "--json": "json_output"}


class UsageProblem(Exception):
    """The options make no drain (found before anything is sent to a server)."""


def read_args(argv: list[str], environ: Mapping[str, str] = os.environ) -> dict[str, Any] | None:
    """The keyword arguments of :func:`run_drain` for ``argv`` (after ``drain``), or None for click to read.

    None for anything but the options in ``OPTIONS`` written as ``--name value``, ``--name=value``
    or a flag, with values that parse; the caller then hands the command line to click.
    """
    args: dict[str, Any] = {
        "socket_dir": environ.get(variable("socket_dir")) or None,
        "socket": None,
        "propagation_wait": None,
        "propagation_quiet": None,
        "timeout": None,
        "grace_period": None,
        "quiet": False,
        "json_output": False,
    }
    position = 0
    while position < len(argv):
        word = argv[position]
        position += 1
        name, equals, value = word.partition("=")
        kind = OPTIONS.get(name, "unknown")
        if kind == "unknown":
            return None
        key = _PARAMETER.get(name) or name[2:].replace("-", "_")
        if kind is None:
            if equals:
                return None
            args[key] = True
            continue
        if not equals:
            if position == len(argv) or argv[position].startswith("-"):
                return None
            value = argv[position]
            position += 1
        if kind:
            try:
                args[key] = check_option(key, value, name=name)
            except ConfigError:
                return None
        elif value:
            args[key] = value
        else:
            return None
    return args


def socket_dir_to_search(socket_dir: str | None, socket: str | None, *, typed: bool) -> str | None:
    """The socket directory to search: None with ``--socket``, which wins over a directory that only the
    environment gave; both typed conflict (:class:`UsageProblem`). ``typed``: ``--socket-dir`` was on
    the command line."""
    if socket_dir and socket:
        if typed:
            raise UsageProblem(BOTH_SOCKETS)
        return None
    problem = search_dir_problem(socket_dir) if socket_dir else None
    if problem is not None:
        # A path that can never hold sockets is the user's to fix (exit 2), as with every command.
        given = "Invalid value for '--socket-dir':" if typed else f"environment variable {variable('socket_dir')}:"
        raise UsageProblem(f"{given} {socket_dir!r} {problem}")
    return socket_dir


def run_drain(
    *,
    socket_dir: str | None,
    socket: str | None,
    propagation_wait: float | None,
    propagation_quiet: float | None,
    timeout: float | None,
    grace_period: float | None,
    quiet: bool,
    json_output: bool,
) -> int:
    """Drain every worker and wait until nothing is in flight; returns the exit code.

    Raises :class:`UsageProblem` before it contacts any server when the options make no drain.
    """
    if socket_dir and socket:
        raise UsageProblem(BOTH_SOCKETS)
    given = (propagation_wait, propagation_quiet, timeout, grace_period)
    if propagation_quiet is not None:
        # Checked here when both are given; against the server's own wait, the server answers.
        try:
            wait = math.inf if propagation_wait is None else propagation_wait
            check_quiet(propagation_quiet, wait, name="--propagation-quiet", wait_name=FLAGS["wait"])
        except ConfigError as exc:
            raise UsageProblem(str(exc)) from None
    if grace_period is not None or timeout is not None:
        # The preStop hook shares terminationGracePeriodSeconds with everything after it: the drain
        # gets grace_period - reserve at most (sent to the servers as the drain's timeout), judged by the
        # server's own rule before any server is contacted (the deadline would come before the
        # balancers have stopped sending).
        try:
            grace = None if grace_period is None else resolve_grace(grace_period, name=FLAGS["grace"])
            timeout = judge_drain(
                propagation_wait,
                grace=grace,
                reserve=0.0 if grace is None else default_reserve(grace),
                drain_timeout=None,
                timeout=timeout,
                voice=FLAGS,
            )
        except ConfigError as exc:
            raise UsageProblem(str(exc)) from None
    started = time.monotonic()
    # This drain's own options, as a worker already draining does not apply them (it keeps its drain's).
    flags = ("--propagation-wait", "--propagation-quiet", "--timeout", FLAGS["grace"])
    asked = [f"{flag} {value:g}s" for flag, value in zip(flags, given, strict=True) if value is not None]

    def progress(workers: list[WorkerDrain]) -> None:
        if not quiet:
            _say(_progress_line(workers, time.monotonic() - started))

    def begun(worker: WorkerDrain) -> None:
        if worker.joined is not None and (asked or not quiet):
            _say(_joined_line(worker, asked))
        line, at_risk = _outlook_line(worker)
        if line and (at_risk or not quiet):
            _say(line)

    try:
        paths = discover(socket_dir, socket)
        workers = drain_all(
            paths,
            propagation_wait=propagation_wait,
            propagation_quiet=propagation_quiet,
            timeout=timeout,
            on_tick=progress,
            on_start=begun,
        )
    except NoServer as exc:
        _say(f"graceful drain: {exc}")
        return EXIT_NO_SERVER
    return _conclude(workers, started, quiet=quiet, json_output=json_output)


def _say(line: str, *, out: bool = False) -> None:
    stream = sys.stdout if out else sys.stderr
    stream.write(line + "\n")
    stream.flush()


def _conclude(workers: list[WorkerDrain], started: float, *, quiet: bool, json_output: bool) -> int:
    live = [w for w in workers if w.reachable]
    ok = all(w.result is not None and w.result.get(Field.RESULT) == Value.DRAINED for w in live)
    if json_output:
        outcome = {"result": "drained" if ok else "timeout", "workers": [w.as_dict() for w in live]}
        _say(json.dumps(outcome), out=True)
    for worker in workers:
        if not worker.reachable:
            _say(f"graceful drain: skipped {worker.path}: nothing listening (stale socket)")
    if not quiet or not ok:
        for line in _report(live, time.monotonic() - started):
            _say(line)
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
