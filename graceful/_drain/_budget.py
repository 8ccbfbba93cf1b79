"""The termination budget: how long a drain may take, derived from the pod's grace period.

Kubernetes starts one clock when it deletes a pod: ``terminationGracePeriodSeconds``.
The preStop hook, the drain, SIGTERM handling and process exit all share it, and
SIGKILL arrives when it runs out. A drain therefore gets ``grace_period - reserve``
at most, where the reserve is left for sidecars, log flushing and exit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Never

from ._durations import (
    DEFAULT_GRACE_PERIOD,
    default_reserve,
    drain_limit,
    drain_timeout_seconds,
    grace_seconds,
    judge_budget,
    judge_drain,
    quiet_seconds,
    reserve_seconds,
)
from ._environ import UNSET, Given, Unset, declared, duration, option, parse_duration
from ._errors import ConfigError

__all__ = ["DEFAULT_GRACE_PERIOD", "Budget", "ConfigError", "parse_duration"]


@dataclass(frozen=True)
class Budget:
    """How long a drain may take, derived from the pod's grace period.

    ``limit`` is ``min(drain_timeout, grace_period - reserve)``: the time from drain
    start to the deadline. Its fields are the budget's options, each declared here once.
    """

    grace_period: float = option(
        default=DEFAULT_GRACE_PERIOD,
        kind=duration(grace_seconds),
        value="a duration (`120`, `2m`)",
        meaning="the pod's `terminationGracePeriodSeconds`",
    )
    reserve: float = option(
        default=None,
        kind=duration(reserve_seconds, after=("grace_period",)),
        value="a duration",
        meaning="left after the deadline for sidecars, log flush and exit",
        shown="30% of grace, ≥ 10 s",
    )
    drain_timeout: float | None = option(
        default=None,
        kind=duration(drain_timeout_seconds, optional=True),
        value="a duration, or `none`",
        meaning="an upper bound on the drain, below `grace_period − reserve`",
    )
    propagation_wait: float = option(
        default=0.0,
        kind=duration(),
        value="a duration",
        meaning="minimum drain time, for endpoint removal to reach every balancer "
        "(with `propagation_quiet`: the upper bound)",
    )
    propagation_quiet: float | None = option(
        default=None,
        kind=duration(quiet_seconds, optional=True),
        value="a duration, or `none`",
        meaning="end the propagation wait early once no new request has arrived for this long (see below)",
        noun="quiet period",
    )

    def __post_init__(self) -> None:
        if self.reserve is None:  # not given: the default rule
            object.__setattr__(self, "reserve", default_reserve(self.grace_period))

    @classmethod
    def resolve(
        cls,
        *,
        environ: Mapping[str, str] | None = None,
        grace_period: float | str | None | Unset = UNSET,
        reserve: float | str | None | Unset = UNSET,
        drain_timeout: float | str | None | Unset = UNSET,
        propagation_wait: float | str | None | Unset = UNSET,
        propagation_quiet: float | str | None | Unset = UNSET,
        **unknown: Never,
    ) -> Budget:
        """Build a budget from options (durations as numbers or strings; None or ``UNSET`` for not given),
        filling what is not given from the variables in ``environ`` (none unless passed), else from the
        declared defaults. Raises :class:`ConfigError` as :meth:`from_given` does (a budget option given as None
        is not given: its variable, else its default, fills it)."""
        if unknown:
            raise TypeError(f"unknown budget option(s) {sorted(unknown)}; the options are {sorted(BUDGET_DECLARED)}")
        given = not_none(
            {
                "grace_period": grace_period,
                "reserve": reserve,
                "drain_timeout": drain_timeout,
                "propagation_wait": propagation_wait,
                "propagation_quiet": propagation_quiet,
            }
        )
        options = Given(BUDGET_DECLARED, environ or {}, given)
        return cls(**options.settle(BUDGET_DECLARED, judge=judge_budget))

    @classmethod
    def from_given(cls, given: Given) -> Budget:
        """The budget of the options ``given``: each held to its own rule (``Given.settle``: a wrong one is named
        as the user gave it), then to the rules between them (``judge_budget``)."""
        return cls(**given.settle(BUDGET_DECLARED, judge=judge_budget))

    def judge(self, wait: float, *, timeout: float | None = None) -> float:
        """The budget rule (``judge_drain``) for a wait, against this budget's limit shortened by a drain's
        own ``timeout``: returns that limit, or raises :class:`ConfigError` that mentions the options, each
        as ``{option}``, for the caller to name as its user gave them."""
        return judge_drain(
            wait, grace=self.grace_period, reserve=self.reserve, drain_timeout=self.drain_timeout, timeout=timeout
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
        ``Core.admit_pinned``): two requests in a row, hence the admit-mode rule
        ``grace_period >= propagation_wait + 2 x longest request + reserve``.
        """
        if not admit:
            return self.limit
        return max(0.0, self.limit - self.propagation_wait) / 2

    def problems(self, *, admit: bool = False) -> list[str]:
        """Arithmetic that works but covers less than it seems, worded for a warning log line.

        A wait that does not fit at all is not a warning: ``resolve`` raises (``judge``).
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


BUDGET_DECLARED = declared(Budget)


def not_none(given: Mapping[str, object]) -> dict[str, object]:
    """A budget option given as None is not given: its variable, else its default, fills it."""
    return {name: UNSET if value is None else value for name, value in given.items()}
