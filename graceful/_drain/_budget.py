"""The termination budget: how long a drain may take, derived from the pod's grace period.

Kubernetes starts one clock when it deletes a pod: ``terminationGracePeriodSeconds``.
The preStop hook, the drain, SIGTERM handling and process exit all share it, and
SIGKILL arrives when it runs out. A drain therefore gets ``grace_period - reserve``
at most, where the reserve is left for sidecars, log flushing and exit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._durations import (
    DEFAULT_GRACE_PERIOD,
    check_quiet,
    default_reserve,
    drain_limit,
    judge_drain,
    parse_duration,
    resolve_drain_timeout,
    resolve_grace,
    resolve_reserve,
)
from ._environ import UNSET, declared, duration, from_environ, option, optional_duration, variable
from ._errors import ConfigError

__all__ = ["DEFAULT_GRACE_PERIOD", "Budget", "ConfigError", "check_quiet", "parse_duration"]


@dataclass(frozen=True)
class Budget:
    """How long a drain may take, derived from the pod's grace period.

    ``limit`` is ``min(drain_timeout, grace_period - reserve)``: the time from drain
    start to the deadline. Its fields are the budget's options, each declared here once.
    """

    grace_period: float = option(
        DEFAULT_GRACE_PERIOD, duration, "a duration (`120`, `2m`)", "the pod's `terminationGracePeriodSeconds`"
    )
    reserve: float = option(
        None,
        duration,
        "a duration",
        "left after the deadline for sidecars, log flush and exit",
        shown="30% of grace, ≥ 10 s",
    )
    drain_timeout: float | None = option(
        None, optional_duration, "a duration, or `none`", "an upper bound on the drain, below `grace_period − reserve`"
    )
    propagation_wait: float = option(
        0.0,
        duration,
        "a duration",
        "minimum drain time, for endpoint removal to reach every balancer (with `propagation_quiet`: the upper bound)",
    )
    propagation_quiet: float | None = option(
        None,
        optional_duration,
        "a duration, or `none`",
        "end the propagation wait early once no new request has arrived for this long (see below)",
    )

    def __post_init__(self) -> None:
        if self.reserve is None:  # not given: the default rule
            object.__setattr__(self, "reserve", default_reserve(self.grace_period))

    @classmethod
    def resolve(cls, *, environ: Mapping[str, str] | None = None, **given: Any) -> Budget:
        """Build a budget from options (durations as numbers or strings; None or ``UNSET`` for not
        given), filling what is not given from the variables in ``environ`` (none unless passed),
        else from the declared defaults.

        Raises :class:`ConfigError` for negative or malformed values, for a reserve
        larger than the grace period, for a ``propagation_wait`` longer than the limit
        (``check_wait``) and for a ``propagation_quiet`` that is 0 or longer than a
        configured ``propagation_wait``. With no ``propagation_wait``
        here (0), the quiet rule waits for a drain request that brings one. Errors about
        a value read from a variable name the variable.
        """
        table = declared(cls)
        unknown = set(given) - set(table)
        if unknown:
            raise TypeError(f"unknown budget option(s) {sorted(unknown)}; the options are {sorted(table)}")
        passed = {name: value for name, value in given.items() if value is not None and value is not UNSET}
        found, sources = from_environ(table, (name for name in table if name not in passed), environ or {})
        values = {name: default for name, (default, _) in table.items()} | found | passed
        # A value read from a variable is checked as the text that was set, under the variable's name
        # (``none`` stays None); an option given in code, under the option's.
        for name, raw in sources.items():
            if found[name] is not None:
                values[name] = raw
        label = {name: f"environment variable {variable(name)}" if name in sources else name for name in table}
        grace = resolve_grace(values["grace_period"], name=label["grace_period"])
        res = resolve_reserve(
            grace, values["reserve"], name=label["reserve"], grace_name=_named("grace_period", sources)
        )
        timeout = values["drain_timeout"]
        timeout = None if timeout is None else resolve_drain_timeout(timeout, name=label["drain_timeout"])
        wait = parse_duration(values["propagation_wait"], name=label["propagation_wait"])
        given_quiet = values["propagation_quiet"]
        quiet = None
        if given_quiet is not None:
            quiet = parse_duration(given_quiet, name=label["propagation_quiet"])
            check_quiet(
                quiet,
                wait if wait > 0 else math.inf,
                given=given_quiet,
                source=label["propagation_quiet"] if "propagation_quiet" in sources else "",
                wait_name=_named("propagation_wait", sources),
            )
        budget = cls(
            grace_period=grace, reserve=res, drain_timeout=timeout, propagation_wait=wait, propagation_quiet=quiet
        )
        budget.check_wait(wait, from_variables=sources)
        return budget

    def check_wait(
        self, wait: float, *, timeout: float | None = None, from_variables: Mapping[str, str] | None = None
    ) -> float:
        """The budget rule (``judge_drain``) for a wait, against this budget's limit shortened by a
        drain's own ``timeout``; returns that limit. Raises :class:`ConfigError` naming the option
        (and its variable, for those in ``from_variables``) that sets the bound."""
        sources = {} if from_variables is None else from_variables
        voice = {
            "wait": _named("propagation_wait", sources),
            "grace": _named("grace_period", sources),
            "timeout": "this drain's timeout",
            "raise_timeout": "raise the timeout",
            "drain_timeout": _named("drain_timeout", sources),
            "reserve": "shown",
            "grace_fix": ", the pod's terminationGracePeriodSeconds",
        }
        return judge_drain(
            wait,
            grace=self.grace_period,
            reserve=self.reserve,
            drain_timeout=self.drain_timeout,
            timeout=timeout,
            voice=voice,
        )

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


def _named(option: str, sources: Mapping[str, str]) -> str:
    """An option as a message that mentions it names it: with its variable when it came from one."""
    return f"{option} ({variable(option)})" if option in sources else option
