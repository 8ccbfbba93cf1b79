"""Durations and the grace period's arithmetic, without ``dataclasses``.

The preStop hook checks its budget before it looks for a server; it reads this module and
never ``Budget``'s (``dataclasses`` and the ``inspect`` it imports cost the hook about 7 ms).
``Budget`` (``_budget``) resolves its options through the same functions.
"""

from __future__ import annotations

import math
import os
import re

from ._errors import ConfigError

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "check_quiet",
    "check_wait",
    "default_reserve",
    "drain_limit",
    "env_duration",
    "parse_duration",
    "resolve_grace",
    "resolve_reserve",
]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h)")
_HELP = "use a number of seconds or a duration such as 10s, 1.5s, 500ms, 2m or 1m30s"


def parse_duration(value: str | float | int, *, name: str = "duration") -> float:
    """Parse ``10s``, ``1.5s``, ``500ms``, ``2m``, ``1m30s`` or a bare number of seconds."""
    if isinstance(value, bool):
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
        seconds = _parse_units(text, value, name) if number is None else number
    if not math.isfinite(seconds):
        raise ConfigError(f"{name}: {value!r} is not a finite duration; {_HELP}")
    if seconds < 0:
        raise ConfigError(f"{name}: {value!r} is negative; durations must be 0 or more")
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


def env_duration(var: str) -> float | None:
    """Read a duration from the environment, naming the variable when it is wrong."""
    raw = os.environ.get(var)
    if raw is None or raw.strip() == "":
        return None
    return parse_duration(raw, name=f"environment variable {var}")


DEFAULT_GRACE_PERIOD = 30.0  # Kubernetes' default terminationGracePeriodSeconds


def check_quiet(quiet: float, wait: float, *, given: object = None, source: str = "") -> None:
    """``propagation_quiet`` must be above 0 and no longer than ``propagation_wait``, its upper bound.

    ``given`` is the value as the user wrote it; ``source`` names where it came from
    when that is not the option itself (an environment variable).
    """
    shown = quiet if given is None else given
    origin = f" ({source}={shown!r})" if source else ""
    if quiet <= 0:
        raise ConfigError(
            f"propagation_quiet: {shown!r}{origin} must be above 0; use the time without a new request after "
            "which the balancers are taken to have stopped sending, e.g. 2s"
        )
    if quiet > wait:
        raise ConfigError(
            f"propagation_quiet {quiet:g}s{origin} is longer than propagation_wait {wait:g}s, its upper bound; "
            f"raise propagation_wait to at least {quiet:g}s (e.g. --propagation-wait 30s) or shorten propagation_quiet"
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


def resolve_grace(grace_period: float | str | None) -> float:
    """The grace period given, else ``GRACEFUL_GRACE_PERIOD``, else Kubernetes' default 30 s."""
    if grace_period is None:
        grace = env_duration("GRACEFUL_GRACE_PERIOD")
        grace = DEFAULT_GRACE_PERIOD if grace is None else grace
    else:
        grace = parse_duration(grace_period, name="grace_period")
    if grace <= 0:
        raise ConfigError(
            f"grace_period: {grace_period!r} leaves no time to drain; "
            "set it to the pod's terminationGracePeriodSeconds (e.g. 30)"
        )
    return grace


def default_reserve(grace: float) -> float:
    """30% of the grace period and at least 10 s, but never more than half of a short grace period."""
    return max(0.3 * grace, min(10.0, 0.5 * grace))


def resolve_reserve(grace: float, reserve: float | str | None) -> float:
    if reserve is None:
        return default_reserve(grace)
    res = parse_duration(reserve, name="reserve")
    if res >= grace:
        raise ConfigError(
            f"reserve: {reserve!r} is not smaller than grace_period {grace:g}s; "
            "lower the reserve or raise the grace period"
        )
    return res


def drain_limit(grace: float, reserve: float, drain_timeout: float | None) -> float:
    """Seconds from drain start to the deadline: ``min(drain_timeout, grace - reserve)``."""
    room = grace - reserve
    return room if drain_timeout is None else min(drain_timeout, room)
