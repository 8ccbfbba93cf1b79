"""Durations and the grace period's arithmetic, without ``dataclasses``.

The preStop hook checks its budget before it looks for a server; it reads this module and
never ``Budget``'s (``dataclasses`` and the ``inspect`` it imports cost the hook about 7 ms).
``Budget`` (``_budget``) resolves its options through the same functions.
"""

from __future__ import annotations

import math
import re

from ._errors import ConfigError

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "MAX_GRACE_PERIOD",
    "check_option",
    "check_quiet",
    "check_wait",
    "default_reserve",
    "FLAGS",
    "drain_limit",
    "judge_drain",
    "parse_duration",
    "resolve_drain_timeout",
    "resolve_grace",
    "resolve_reserve",
]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h)")
_HELP = "use a number of seconds or a duration such as 10s, 1.5s, 500ms, 2m or 1m30s"


def parse_duration(value: str | float | int, *, name: str = "duration") -> float:
    """Parse ``10s``, ``1.5s``, ``500ms``, ``2m``, ``1m30s`` or a bare number of seconds.

    ``name`` is how the caller's user gave the value (an option, a flag, a variable); every
    message names it and the value as given. ``-1`` and ``-1s`` are refused alike, as negative.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f"{name}: expected a duration, got {value!r}; {_HELP}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = value.strip().lower()
        try:
            number: float | None = float(text)
        except ValueError:
            number = None
        # Parsed outside the except block, so that a wrong value's ConfigError comes alone,
        # without float()'s ValueError chained above it (a server's log shows both otherwise).
        if number is not None:
            seconds = number
        elif text.startswith("-"):  # "-1s": negative, as "-1" is, not "not a duration"
            seconds = -_parse_units(text[1:], value, name)
        else:
            seconds = _parse_units(text, value, name)
    if not math.isfinite(seconds):
        raise ConfigError(f"{name}: {value!r} is not a finite duration; {_HELP}")
    if seconds < 0:
        raise ConfigError(f"{name}: {value!r} is negative; use 0 or more, e.g. 10s")
    return seconds


def _parse_units(text: str, original: str, name: str) -> float:
    pos = 0
    total = 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos == 0 or pos != len(text):
        raise ConfigError(f"{name}: {original!r} is not a duration; {_HELP}")
    return total


DEFAULT_GRACE_PERIOD = 30.0  # Kubernetes' default terminationGracePeriodSeconds: the default of Budget.grace_period
# The longest grace period accepted: a year. Kubernetes sets no bound, but no pod is given that long to stop:
# a longer one is a typing slip (99999999999999999999 made a "drain limit 7e+19s", issue 51).
MAX_GRACE_PERIOD = 365 * 24 * 3600.0
_GRACE_FIX = "set it to the pod's terminationGracePeriodSeconds (e.g. 30)"


def check_quiet(
    quiet: float,
    wait: float,
    *,
    given: object = None,
    source: str = "",
    name: str = "propagation_quiet",
    wait_name: str = "propagation_wait",
) -> None:
    """``propagation_quiet`` must be above 0 and no longer than ``propagation_wait``, its upper bound.

    ``given`` is the value as the user wrote it; ``source`` names where it came from when that
    is not the option itself (an environment variable); ``name`` and ``wait_name`` are how the
    caller's user writes the two (``--propagation-quiet``).
    """
    shown = quiet if given is None else given
    origin = f" ({source}={shown!r})" if source else ""
    if quiet <= 0:
        raise ConfigError(
            f"{name}: {shown!r}{origin} must be above 0; use the time without a new request after "
            "which the balancers are taken to have stopped sending, e.g. 2s"
        )
    if quiet > wait:
        raise ConfigError(
            f"{name} {quiet:g}s{origin} is longer than {wait_name} {wait:g}s, its upper bound; "
            f"raise {wait_name} to at least {quiet:g}s or shorten {name}"
        )


def check_wait(wait: float, limit: float, *, wait_name: str, bound: str, fix: str) -> None:
    """The budget rule: a propagation wait longer than the drain's limit cannot work.

    The deadline would end every request in flight while the balancers may still be
    sending. One verdict wherever a wait meets a limit: the server's options (at
    start-up), a drain's overrides (before it begins, state untouched) and the
    preStop hook's flags (exit 2) all raise :class:`ConfigError` here. ``wait_name``
    is how the caller's user wrote the wait (``propagation_wait``, ``--propagation-wait``),
    ``bound`` where the limit comes from and ``fix`` the other way out.
    """
    if wait > limit:
        raise ConfigError(
            f"{wait_name} {wait:g}s is longer than the whole drain: {bound}; shorten {wait_name} or {fix}"
        )


# How a caller's user wrote the values the budget rule names, for its messages: the server's options
# (``Budget.voice``, with the variables they came from) or the preStop hook's flags (``FLAGS``).
#   wait, grace: the names of the propagation wait and the grace period;
#   timeout / raise_timeout: a drain's own timeout and its fix; drain_timeout: the configured cap;
#   reserve: whether the reserve's value is shown; grace_fix: said after "raise <grace>".
FLAGS = {
    "wait": "--propagation-wait",
    "grace": "--grace-period",
    "timeout": "--timeout",
    "raise_timeout": "raise --timeout",
    "drain_timeout": "--timeout",
    "reserve": "",
    "grace_fix": "",
}


def judge_drain(
    wait: float | None,
    *,
    grace: float | None,
    reserve: float,
    drain_timeout: float | None,
    timeout: float | None,
    voice: dict[str, str],
) -> float:
    """The budget rule for one drain, the one verdict that ``Budget`` (at start-up), a drain's overrides
    (``Drain.begin_drain`` and the admin server) and the preStop hook's flags share: returns the drain's
    limit, ``min(timeout, drain_timeout, grace - reserve)`` (of those known), and raises
    :class:`ConfigError` when ``wait`` is longer (``check_wait``), naming the bound that binds in the
    words of ``voice`` (``FLAGS`` or the server's options)."""
    room = math.inf if grace is None else grace - reserve
    cap = room if drain_timeout is None else min(drain_timeout, room)
    limit = cap if timeout is None else min(cap, timeout)
    if wait is None or wait <= limit:
        return limit
    if timeout is not None and timeout <= cap:
        bound, fix = f"{voice['timeout']} is {timeout:g}s", voice["raise_timeout"]
    elif drain_timeout is not None and drain_timeout <= room:
        bound, fix = f"{voice['drain_timeout']} is {drain_timeout:g}s", f"raise {voice['drain_timeout']}"
    else:
        after = f"the reserve {reserve:g}s" if voice["reserve"] else "the reserve"
        bound = f"{voice['grace']} {grace:g}s leaves the drain {room:g}s after {after}"
        fix = f"raise {voice['grace']}{voice['grace_fix']}"
    check_wait(wait, limit, wait_name=voice["wait"], bound=bound, fix=fix)
    return limit


def resolve_grace(grace_period: float | str, *, name: str = "grace_period") -> float:
    """The grace period given, parsed; refused when it leaves no time to drain or is longer than a year
    (``MAX_GRACE_PERIOD``). ``name`` is how the user gave it (the option, the flag, or ``environment
    variable GRACEFUL_GRACE_PERIOD``); the messages show the value as given."""
    grace = parse_duration(grace_period, name=name)
    if grace <= 0:
        raise ConfigError(f"{name}: {grace_period!r} leaves no time to drain; {_GRACE_FIX}")
    if grace > MAX_GRACE_PERIOD:
        raise ConfigError(f"{name}: {grace_period!r} is longer than a year, the longest accepted; {_GRACE_FIX}")
    return grace


def resolve_drain_timeout(drain_timeout: float | str, *, name: str = "drain_timeout") -> float:
    """The drain timeout given, parsed; refused at 0, which would end every request at the drain's start.
    ``name`` is how the user gave it; not giving one leaves the drain ``grace_period - reserve``."""
    timeout = parse_duration(drain_timeout, name=name)
    if timeout <= 0:
        raise ConfigError(
            f"{name}: {drain_timeout!r} leaves no time to drain; give the longest the drain may take (e.g. 60s), "
            "or leave it unset for grace_period - reserve"
        )
    return timeout


# The rule each duration option holds alone, beyond parsing: ``check_option`` applies it wherever a value
# arrives with its name (the options and variables in ``Budget.resolve``, the CLI's flags as they are read).
_ALONE = {
    "grace_period": resolve_grace,
    "drain_timeout": resolve_drain_timeout,
}


def check_option(option: str, value: float | str, *, name: str) -> float:
    """``value`` for the duration ``option`` (``grace_period``, ``propagation_quiet``...), parsed and held to
    the rule of that option alone; ``name`` is how the user gave it (``--grace-period``). Rules between
    options (the quiet period against the wait, the wait against the drain) come later, once all are known."""
    rule = _ALONE.get(option)
    if rule is not None:
        return rule(value, name=name)
    seconds = parse_duration(value, name=name)
    if option == "propagation_quiet":
        check_quiet(seconds, math.inf, given=value, name=name)
    return seconds


def default_reserve(grace: float) -> float:
    """30% of the grace period and at least 10 s, but never more than half of a short grace period."""
    return max(0.3 * grace, min(10.0, 0.5 * grace))


def resolve_reserve(
    grace: float, reserve: float | str | None, *, name: str = "reserve", grace_name: str = "grace_period"
) -> float:
    """The reserve given (the default rule for None), parsed; refused unless smaller than the grace
    period. ``name`` and ``grace_name`` are how the user gave the two."""
    if reserve is None:
        return default_reserve(grace)
    res = parse_duration(reserve, name=name)
    if res >= grace:
        raise ConfigError(
            f"{name}: {reserve!r} is not smaller than {grace_name} {grace:g}s; "
            "lower the reserve or raise the grace period"
        )
    return res


def drain_limit(grace: float, reserve: float, drain_timeout: float | None) -> float:
    """Seconds from drain start to the deadline: ``min(drain_timeout, grace - reserve)``."""
    room = grace - reserve
    return room if drain_timeout is None else min(drain_timeout, room)
