"""Durations and the grace period's arithmetic: values in, seconds out, without ``dataclasses``.

The preStop hook checks its budget before it looks for a server; it reads this module and never
``Budget``'s (``dataclasses`` and the ``inspect`` it imports cost the hook about 7 ms). ``Budget``
(``_budget``) declares its options with the same rules.

Nothing here knows how its user wrote an option. A wrong value raises :class:`ConfigError` with the
value and the fix; a rule that mentions options writes each as ``{option}`` (``ConfigError.between``).
The edge that took the value (``_environ.Given.settle`` for keyword arguments and variables, click's
``DURATION`` for flags, the preStop hook's reader) re-raises it with the option, the flag or the
variable (``ConfigError.named``).
"""

from __future__ import annotations

import math
import re

from ._errors import ConfigError

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "MAX_GRACE_PERIOD",
    "RULES",
    "check_option",
    "check_quiet",
    "check_wait",
    "default_reserve",
    "drain_limit",
    "drain_timeout_seconds",
    "grace_seconds",
    "judge_budget",
    "judge_drain",
    "quiet_seconds",
    "reserve_seconds",
    "seconds",
]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h)")
_HELP = "use a number of seconds or a duration such as 10s, 1.5s, 500ms, 2m or 1m30s"


def seconds(value: str | float) -> float:
    """``10s``, ``1.5s``, ``500ms``, ``2m``, ``1m30s`` or a bare number of seconds, in seconds.

    ``-1`` and ``-1s`` are refused alike, as negative; every message shows the value as given.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f"expected a duration, got {value!r}; {_HELP}")
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        text = value.strip().lower()
        try:
            parsed: float | None = float(text)
        except ValueError:
            parsed = None
        # Parsed outside the except block, so that a wrong value's ConfigError comes alone,
        # without float()'s ValueError chained above it (a server's log shows both otherwise).
        if parsed is not None:
            number = parsed
        elif text.startswith("-"):  # "-1s": negative, as "-1" is, not "not a duration"
            number = -_units(text[1:], value)
        else:
            number = _units(text, value)
    if not math.isfinite(number):
        raise ConfigError(f"{value!r} is not a finite duration; {_HELP}")
    if number < 0:
        raise ConfigError(f"{value!r} is negative; use 0 or more, e.g. 10s")
    return number


def _units(text: str, value: str) -> float:
    pos = 0
    total = 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos == 0 or pos != len(text):
        raise ConfigError(f"{value!r} is not a duration; {_HELP}")
    return total


DEFAULT_GRACE_PERIOD = 30.0  # Kubernetes' default terminationGracePeriodSeconds: the default of Budget.grace_period
# The longest grace period accepted: a year. Kubernetes sets no bound, but no pod is given that long to stop:
# a longer one is a typing slip (99999999999999999999 made a "drain limit 7e+19s", issue 51).
MAX_GRACE_PERIOD = 365 * 24 * 3600.0
_GRACE_FIX = "set it to the pod's terminationGracePeriodSeconds (e.g. 30)"


# -- the rule each duration option holds alone -------------------------------------------------


def grace_seconds(value: str | float) -> float:
    """A grace period: refused when it leaves no time to drain or is longer than a year (``MAX_GRACE_PERIOD``)."""
    grace = seconds(value)
    if grace <= 0:
        raise ConfigError(f"{value!r} leaves no time to drain; {_GRACE_FIX}")
    if grace > MAX_GRACE_PERIOD:
        raise ConfigError(f"{value!r} is longer than a year, the longest accepted; {_GRACE_FIX}")
    return grace


def drain_timeout_seconds(value: str | float) -> float:
    """A drain timeout, the server's (``drain_timeout``) or one drain's own (``timeout``): refused at 0,
    which would end every request at the drain's start, where many tools read 0 as no limit (leaving it
    unset leaves the drain ``grace_period - reserve``)."""
    timeout = seconds(value)
    if timeout <= 0:
        raise ConfigError(
            f"{value!r} leaves no time to drain; give the longest the drain may take (e.g. 60s), "
            "or leave it unset for grace_period - reserve"
        )
    return timeout


def quiet_seconds(value: str | float) -> float:
    """A quiet period: above 0 (its upper bound, the propagation wait, is ``check_quiet``'s)."""
    quiet = seconds(value)
    if quiet <= 0:
        raise ConfigError(
            f"{value!r} must be above 0; use the time without a new request after which the balancers are taken "
            "to have stopped sending, e.g. 2s"
        )
    return quiet


def reserve_seconds(value: str | float, grace: float) -> float:
    """A reserve, which must be smaller than the grace period ``grace``."""
    reserve = seconds(value)
    if reserve >= grace:
        raise ConfigError.between(
            f"{value!r} is not smaller than {{grace_period}} {grace:g}s; lower the reserve or raise the grace period"
        )
    return reserve


# The rule of each duration option that has one beyond parsing, by option: the budget's fields declare
# the same functions (a test holds them equal); the preStop hook and click's DURATION read flags by it.
RULES = {
    "grace_period": grace_seconds,
    "drain_timeout": drain_timeout_seconds,
    "timeout": drain_timeout_seconds,
    "propagation_quiet": quiet_seconds,
}


def check_option(option: str, value: str | float) -> float:
    """``value`` in seconds, held to the rule of ``option`` alone (``RULES``; a plain duration for the others).
    Rules between options (the quiet period against the wait, the wait against the drain) come later,
    once all are known."""
    return RULES.get(option, seconds)(value)


# -- the arithmetic ----------------------------------------------------------------------------


def default_reserve(grace: float) -> float:
    """30% of the grace period and at least 10 s, but never more than half of a short grace period."""
    return max(0.3 * grace, min(10.0, 0.5 * grace))


def drain_limit(
    grace: float | None, reserve: float, drain_timeout: float | None, timeout: float | None = None
) -> float:
    """Seconds from drain start to the deadline: ``min(timeout, drain_timeout, grace - reserve)``, of those known."""
    limit = math.inf if grace is None else grace - reserve
    for cap in (drain_timeout, timeout):
        if cap is not None:
            limit = min(limit, cap)
    return limit


def check_quiet(quiet: float, wait: float) -> None:
    """The quiet period's upper bound: the propagation wait."""
    if quiet > wait:
        raise ConfigError.between(
            f"{{propagation_quiet}} {quiet:g}s is longer than {{propagation_wait}} {wait:g}s, its upper bound; "
            f"raise {{propagation_wait}} to at least {quiet:g}s or shorten {{propagation_quiet}}"
        )


def check_wait(wait: float, limit: float, *, bound: str, fix: str) -> None:
    """The budget rule: a propagation wait longer than the drain's limit cannot work, for the deadline
    would end every request in flight while the balancers may still be sending. ``bound`` says where
    the limit comes from, ``fix`` the other way out (either may mention options as ``{option}``)."""
    if wait > limit:
        raise ConfigError.between(
            f"{{propagation_wait}} {wait:g}s is longer than the whole drain: {bound}; shorten {{propagation_wait}} "
            f"or {fix}"
        )


def judge_drain(
    wait: float | None, *, grace: float | None, reserve: float, drain_timeout: float | None, timeout: float | None
) -> float:
    """The budget rule for one drain, the one verdict that ``Budget`` (at start-up), a drain's overrides
    (``Drain.begin_drain`` and the admin server) and the preStop hook's flags share: returns the drain's
    limit (``drain_limit``) and raises :class:`ConfigError` when ``wait`` is longer (``check_wait``),
    naming the bound that binds, the first of ``timeout``, ``drain_timeout`` and the grace period's room."""
    limit = drain_limit(grace, reserve, drain_timeout, timeout)
    if wait is None or wait <= limit:
        return limit
    if timeout is not None and timeout <= limit:
        bound, fix = f"{{timeout}} is {timeout:g}s", "raise {timeout}"
    elif drain_timeout is not None and drain_timeout <= limit:
        bound, fix = f"{{drain_timeout}} is {drain_timeout:g}s", "raise {drain_timeout}"
    else:  # neither cap binds, so the grace period is set and the limit is its room after the reserve
        bound = f"{{grace_period}} {grace:g}s leaves the drain {limit:g}s after the reserve {reserve:g}s"
        fix = "raise {grace_period}, the pod's terminationGracePeriodSeconds"
    check_wait(wait, limit, bound=bound, fix=fix)
    return limit


def judge_budget(
    *,
    grace_period: float,
    reserve: float | None,
    drain_timeout: float | None,
    propagation_wait: float,
    propagation_quiet: float | None,
) -> None:
    """The rules between the budget's options, once each holds its own: a ``propagation_quiet`` no longer than
    a configured ``propagation_wait`` (with none, 0, the quiet rule waits for a drain request that brings one),
    and a ``propagation_wait`` that fits the drain (``judge_drain``; a reserve of None takes the default rule)."""
    if propagation_quiet is not None and propagation_wait > 0:
        check_quiet(propagation_quiet, propagation_wait)
    room = default_reserve(grace_period) if reserve is None else reserve
    judge_drain(propagation_wait, grace=grace_period, reserve=room, drain_timeout=drain_timeout, timeout=None)
