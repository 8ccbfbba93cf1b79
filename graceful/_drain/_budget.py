"""Durations and the termination budget.

Kubernetes starts one clock when it deletes a pod: ``terminationGracePeriodSeconds``.
The preStop hook, the drain, SIGTERM handling and process exit all share it, and
SIGKILL arrives when it runs out. A drain therefore gets ``grace_period - reserve``
at most, where the reserve is left for sidecars, log flushing and exit.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

__all__ = ["Budget", "ConfigError", "check_quiet", "parse_duration"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h)")
_HELP = "use a number of seconds or a duration such as 10s, 1.5s, 500ms, 2m or 1m30s"


class ConfigError(ValueError):
    """A user-supplied setting is wrong; the message names the value and the fix."""


def parse_duration(value: str | float | int, *, name: str = "duration") -> float:
    """Parse ``10s``, ``1.5s``, ``500ms``, ``2m``, ``1m30s`` or a bare number of seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a duration, got {value!r}; {_HELP}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = value.strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            seconds = _parse_units(text, value, name)
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


@dataclass(frozen=True)
class Budget:
    """How long a drain may take, derived from the pod's grace period.

    ``limit`` is ``min(drain_timeout, grace_period - reserve)``: the time from drain
    start to the deadline.
    """

    grace_period: float
    reserve: float
    drain_timeout: float | None
    propagation_wait: float
    propagation_quiet: float | None = None

    @classmethod
    def resolve(
        cls,
        *,
        grace_period: float | str | None = None,
        reserve: float | str | None = None,
        drain_timeout: float | str | None = None,
        propagation_wait: float | str = 0.0,
        propagation_quiet: float | str | None = None,
    ) -> Budget:
        """Build a budget from options, falling back to ``GRACEFUL_GRACE_PERIOD`` and
        ``GRACEFUL_PROPAGATION_QUIET``.

        Raises :class:`ConfigError` for negative or malformed values, for a reserve
        larger than the grace period and for a ``propagation_quiet`` that is 0 or
        longer than a configured ``propagation_wait``. With no ``propagation_wait``
        here (0), the quiet rule waits for a drain request that brings one.
        """
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
        if reserve is None:
            # 30% and at least 10 s, but never more than half of a short grace period.
            res = max(0.3 * grace, min(10.0, 0.5 * grace))
        else:
            res = parse_duration(reserve, name="reserve")
            if res >= grace:
                raise ConfigError(
                    f"reserve: {reserve!r} is not smaller than grace_period {grace:g}s; "
                    "lower the reserve or raise the grace period"
                )
        timeout = None if drain_timeout is None else parse_duration(drain_timeout, name="drain_timeout")
        wait = parse_duration(propagation_wait, name="propagation_wait")
        source = ""
        if propagation_quiet is None:
            quiet = env_duration("GRACEFUL_PROPAGATION_QUIET")
            given: object = os.environ.get("GRACEFUL_PROPAGATION_QUIET")
            source = "environment variable GRACEFUL_PROPAGATION_QUIET"
        else:
            quiet = parse_duration(propagation_quiet, name="propagation_quiet")
            given = propagation_quiet
        if quiet is not None:
            check_quiet(quiet, wait if wait > 0 else math.inf, given=given, source=source)
        return cls(
            grace_period=grace, reserve=res, drain_timeout=timeout, propagation_wait=wait, propagation_quiet=quiet
        )

    @property
    def limit(self) -> float:
        """Seconds from drain start to the deadline."""
        room = self.grace_period - self.reserve
        return room if self.drain_timeout is None else min(self.drain_timeout, room)

    def longest_covered(self, *, admit: bool) -> float:
        """The longest request (queueing included) that this budget lets finish.

        Refusing during the propagation wait, only work admitted before the drain runs:
        it has the whole ``limit``. Admitting during the wait, a request admitted just
        before the wait ends has ``limit - propagation_wait``, and a connection that was
        busy at drain start may bring one more request after its current one (see
        ``Drain.admits``): two requests in a row, hence the admit-mode rule
        ``grace_period >= propagation_wait + 2 x longest request + reserve``.
        """
        if not admit:
            return self.limit
        return max(0.0, self.limit - self.propagation_wait) / 2

    def problems(self, *, admit: bool = False) -> list[str]:
        """Arithmetic that does not add up, worded for a warning log line."""
        room = self.grace_period - self.reserve
        if self.propagation_wait > room:
            return [
                f"propagation_wait {self.propagation_wait:g}s does not fit in grace_period "
                f"{self.grace_period:g}s - reserve {self.reserve:g}s = {room:g}s; "
                "raise terminationGracePeriodSeconds or shorten the propagation wait"
            ]
        if admit and self.propagation_wait > 0 and self.propagation_wait >= self.limit:
            return [
                f"admit mode: propagation_wait {self.propagation_wait:g}s leaves nothing of the drain limit "
                f"{self.limit:g}s for the requests admitted during it; "
                "size the budget as grace_period >= propagation_wait + 2 x longest request + reserve and "
                "drain_timeout >= propagation_wait + 2 x longest request, or refuse during the wait "
                "(admit_during_propagation=False)"
            ]
        return []

    def describe(self, *, admit: bool) -> str:
        """One log line: the deadline and the longest request it covers, with the rule behind it."""
        covered = self.longest_covered(admit=admit)
        if not admit:
            return (
                f"drain limit {self.limit:g}s (grace_period {self.grace_period:g}s - reserve {self.reserve:g}s"
                f"{'' if self.drain_timeout is None else f', drain_timeout {self.drain_timeout:g}s'}); "
                f"refusing during the propagation wait: requests of up to {covered:g}s are covered"
            )
        return (
            f"drain limit {self.limit:g}s, admitting during the {self.propagation_wait:g}s propagation wait: "
            f"requests of up to {covered:g}s are covered (limit - propagation_wait, halved for a second request "
            "on a connection busy at drain start); for longer ones raise terminationGracePeriodSeconds to "
            "propagation_wait + 2 x longest request + reserve"
        )
