"""What the admin server answers, from the drain's own snapshots, and how it reads a drain's query.

Every key written here is one of ``_wire``'s names: each answer takes from a snapshot exactly the
fields ``_wire`` declares for it (``STATUS_FIELDS``, ``RESULT_FIELDS``...), so the protocol's shape
has one home whatever the snapshots hold.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qsl

from .._drain._advice import Outlook
from .._drain._durations import seconds
from .._drain._errors import ConfigError
from .._drain._state import Drain, core
from .._drain._status import DrainResult, Failure
from ._wire import FAILURE_FIELDS, OUTLOOK_FIELDS, RESULT_FIELDS, STATUS_FIELDS, Event, Field, Param

__all__ = [
    "drain_options",
    "failure_answer",
    "outlook_answer",
    "progress_answer",
    "result_answer",
    "status_answer",
]


def progress_answer(drain: Drain) -> dict[str, object]:
    """A drain's progress event: sent at once, each second and at each new request of the propagation phase."""
    status = drain.status()
    now = time.time()
    started = status.drain_started or now
    deadline = status.deadline or now
    last = status.last_request
    return {
        Field.EVENT: Event.PROGRESS,
        Field.STATE: status.state.value,
        Field.IN_FLIGHT: status.in_flight,
        Field.HANDED_OFF: core(drain).handed_off(),
        Field.ELAPSED: round(now - started, 3),
        Field.DEADLINE_IN: round(deadline - now, 3),
        Field.SINCE_LAST_REQUEST: None if last is None else round(max(0.0, now - last), 3),
        Field.PROPAGATION_OVER: status.propagation_until is not None and now >= status.propagation_until,
    }


def _fields(names: tuple[str, ...], snapshot: dict[str, Any]) -> dict[str, Any]:
    """The fields ``names`` of one of the drain's snapshots (its ``as_dict()``): what an answer declares."""
    return {name: snapshot[name] for name in names}


def failure_answer(failure: Failure | None) -> dict[str, Any] | None:
    """Why the worker is FAILED, or None."""
    return None if failure is None else _fields(FAILURE_FIELDS, failure.as_dict())


def status_answer(drain: Drain) -> dict[str, Any]:
    """The worker's status, as ``GET /status`` and a drain's status event send it."""
    status = drain.status()
    return {**_fields(STATUS_FIELDS, status.as_dict()), Field.FAILURE: failure_answer(status.failure)}


def outlook_answer(outlook: Outlook) -> dict[str, Any]:
    """The work in flight as a drain finds it, judged by the durations seen (the status event's)."""
    return _fields(OUTLOOK_FIELDS, outlook.as_dict())


def result_answer(result: DrainResult) -> dict[str, Any]:
    """A drain's outcome (the result event's, with the event's name and the worker's pid)."""
    return _fields(RESULT_FIELDS, result.as_dict())


_DURATIONS = (Param.PROPAGATION_WAIT, Param.PROPAGATION_QUIET, Param.TIMEOUT)


def drain_options(query: str) -> dict[str, Any]:
    """The options of ``POST /drain``'s query, by :class:`Param`: durations parsed, the others None, the reason
    ``admin`` unless given; raises :class:`ConfigError` naming a bad parameter."""
    options: dict[str, Any] = {**dict.fromkeys(_DURATIONS), Param.REASON: "admin"}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query), max_num_fields=8)
    except ValueError:
        raise ConfigError(
            f"query {query!r} is malformed; use ?{Param.PROPAGATION_WAIT}=10s&{Param.TIMEOUT}=80s"
        ) from None
    for key, value in pairs:
        if key in _DURATIONS:
            try:
                options[key] = seconds(value)
            except ConfigError as exc:
                raise exc.named(key) from None
        elif key == Param.REASON and value.isprintable() and 0 < len(value) <= 64:
            options[key] = value
        else:
            raise ConfigError(
                f"unknown or bad parameter {key}={value!r}; use {', '.join(_DURATIONS)} or {Param.REASON}"
            )
    return options
