"""The termination budget: how long a drain may take, derived from the pod's grace period.

Kubernetes starts one clock when it deletes a pod: ``terminationGracePeriodSeconds``.
The preStop hook, the drain, SIGTERM handling and process exit all share it, and
SIGKILL arrives when it runs out. A drain therefore gets ``grace_period - reserve``
at most, where the reserve is left for sidecars, log flushing and exit.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from ._durations import (
    DEFAULT_GRACE_PERIOD,
    check_quiet,
    check_wait,
    drain_limit,
    env_duration,
    parse_duration,
    resolve_grace,
    resolve_reserve,
)
from ._environ import optional_duration, variable
from ._errors import ConfigError

__all__ = ["DEFAULT_GRACE_PERIOD", "Budget", "ConfigError", "check_quiet", "env_duration", "parse_duration"]


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
        from_variables: Mapping[str, str] | None = None,
    ) -> Budget:
        """Build a budget from options, falling back to ``GRACEFUL_GRACE_PERIOD`` and
        ``GRACEFUL_PROPAGATION_QUIET``.

        Raises :class:`ConfigError` for negative or malformed values, for a reserve
        larger than the grace period, for a ``propagation_wait`` longer than the limit
        (``check_wait``) and for a ``propagation_quiet`` that is 0 or longer than a
        configured ``propagation_wait``. With no ``propagation_wait``
        here (0), the quiet rule waits for a drain request that brings one.
        ``from_variables`` maps the options that a caller read from their variables
        to the text they held, so that the quiet rule's errors name the variable (the
        readers of the variables name it in their own errors).
        """
        sources = {} if from_variables is None else from_variables
        grace = resolve_grace(grace_period)
        res = resolve_reserve(grace, reserve)
        timeout = None if drain_timeout is None else parse_duration(drain_timeout, name="drain_timeout")
        wait = parse_duration(propagation_wait, name="propagation_wait")
        quiet_variable = variable("propagation_quiet")
        if propagation_quiet is None:
            raw = os.environ.get(quiet_variable, "").strip()
            quiet = optional_duration(quiet_variable, raw) if raw else None
            sources = {**sources, "propagation_quiet": raw}
        else:
            quiet = parse_duration(propagation_quiet, name="propagation_quiet")
        if quiet is not None:
            if "propagation_quiet" in sources:
                given: object = sources["propagation_quiet"]
                source = f"environment variable {quiet_variable}"
            else:
                given, source = propagation_quiet, ""
            check_quiet(quiet, wait if wait > 0 else math.inf, given=given, source=source)
        budget = cls(
            grace_period=grace, reserve=res, drain_timeout=timeout, propagation_wait=wait, propagation_quiet=quiet
        )
        budget.check_wait(wait, from_variables=sources)
        return budget

    def check_wait(
        self, wait: float, *, timeout: float | None = None, from_variables: Mapping[str, str] | None = None
    ) -> float:
        """The budget rule (``check_wait``) for a wait, against this budget's limit shortened by a
        drain's own ``timeout``; returns that limit. Raises :class:`ConfigError` naming the option
        (and its variable, for those in ``from_variables``) that sets the bound."""
        sources = {} if from_variables is None else from_variables

        def name(option: str) -> str:
            return f"{option} ({variable(option)})" if option in sources else option

        limit = self.limit if timeout is None else min(self.limit, timeout)
        if timeout is not None and timeout <= self.limit:
            bound, fix = f"this drain's timeout is {timeout:g}s", "raise the timeout"
        elif self.drain_timeout is not None and self.drain_timeout <= self.grace_period - self.reserve:
            bound, fix = f"{name('drain_timeout')} is {self.drain_timeout:g}s", f"raise {name('drain_timeout')}"
        else:
            bound = (
                f"{name('grace_period')} {self.grace_period:g}s leaves the drain {self.grace_period - self.reserve:g}s "
                f"after the reserve {self.reserve:g}s"
            )
            fix = f"raise {name('grace_period')}, the pod's terminationGracePeriodSeconds"
        check_wait(wait, limit, wait_name=name("propagation_wait"), bound=bound, fix=fix)
        return limit

    @property
    def limit(self) -> float:
        """Seconds from drain start to the deadline."""
        return drain_limit(self.grace_period, self.reserve, self.drain_timeout)

    def longest_covered(self, *, admit: bool) -> float:
        """The longest request (queueing included) that this budget lets finish.

        Refusing during the propagation wait, only work admitted before the drain runs:
        it has the whole ``limit``. Admitting during the wait, a request admitted just
        before the wait ends has ``limit - propagation_wait``, and a connection that was
        busy at drain start may bring one more request after its current one (see
        ``Drain.admit_arrival``): two requests in a row, hence the admit-mode rule
        ``grace_period >= propagation_wait + 2 x longest request + reserve``.
        """
        if not admit:
            return self.limit
        return max(0.0, self.limit - self.propagation_wait) / 2

    def problems(self, *, admit: bool = False) -> list[str]:
        """Arithmetic that works but covers less than it seems, worded for a warning log line.

        A wait that does not fit at all is not a warning: ``resolve`` raises (``check_wait``).
        """
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
