"""The drain options, defined once.

``DrainConfig`` is what ``Drain`` is built from. Its fields are the options that
``Drain(...)`` and ``GracefulMiddleware(..., **options)`` take, that ``graceful run``
compares against an app wrapped elsewhere, and that the documentation's option table
lists. Each is declared once, in ``_DECLARED``: its row of that table (a test holds the page
to it) and how its ``GRACEFUL_*`` variable is read.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ._budget import Budget, check_quiet, parse_duration
from ._environ import Env, duration, flag, from_environ, named_object, optional_duration, variable
from ._errors import ConfigError

__all__ = ["DRAIN_ENVIRON", "DRAIN_OPTIONS", "DrainConfig", "Hook"]

logger = logging.getLogger("graceful")

Hook = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class DrainConfig:
    """Drain options with durations parsed and the budget's defaults filled in (declared in ``_DECLARED``)."""

    grace_period: float
    reserve: float
    drain_timeout: float | None = None
    propagation_wait: float = 0.0
    propagation_quiet: float | None = None
    admit_during_propagation: bool = True
    handoff_streams: bool = False
    on_drain_start: Hook | None = None
    on_drained: Hook | None = None
    hook_timeout: float = 5.0
    unwind_timeout: float = 2.0
    drain_on_sigterm: bool = True

    @classmethod
    def resolve(cls, **options: Any) -> DrainConfig:
        """Parse user options (durations as numbers or strings); raises ConfigError or TypeError."""
        unknown = set(options) - DRAIN_OPTIONS
        if unknown:
            raise TypeError(f"unknown drain option(s) {sorted(unknown)}; the options are {sorted(DRAIN_OPTIONS)}")
        # Options not given come from their GRACEFUL_* variables (docs/middleware.md, "From the
        # environment"); the budget's cross-checks name the variable a value came from.
        from_env = from_environ(DRAIN_ENVIRON, (name for name in DRAIN_ENVIRON if name not in options))
        options = {**from_env, **options}
        budget = Budget.resolve(
            grace_period=options.get("grace_period"),
            reserve=options.get("reserve"),
            drain_timeout=options.get("drain_timeout"),
            propagation_wait=options.get("propagation_wait", 0.0),
            propagation_quiet=options.get("propagation_quiet"),
            from_variables={name: os.environ[variable(name)].strip() for name in from_env},
        )
        admit = options.get("admit_during_propagation", True)
        if not isinstance(admit, bool):
            raise ConfigError(f"admit_during_propagation: expected True or False, got {admit!r}")
        handoff = options.get("handoff_streams", False)
        if not isinstance(handoff, bool):
            raise ConfigError(f"handoff_streams: expected True or False, got {handoff!r}")
        sigterm = options.get("drain_on_sigterm", True)
        if not isinstance(sigterm, bool):
            raise ConfigError(f"drain_on_sigterm: expected True or False, got {sigterm!r}")
        config = cls(
            grace_period=budget.grace_period,
            reserve=budget.reserve,
            drain_timeout=budget.drain_timeout,
            propagation_wait=budget.propagation_wait,
            propagation_quiet=budget.propagation_quiet,
            admit_during_propagation=admit,
            handoff_streams=handoff,
            on_drain_start=options.get("on_drain_start"),
            on_drained=options.get("on_drained"),
            hook_timeout=parse_duration(options.get("hook_timeout", 5.0), name="hook_timeout"),
            unwind_timeout=parse_duration(options.get("unwind_timeout", 2.0), name="unwind_timeout"),
            drain_on_sigterm=sigterm,
        )
        for problem in budget.problems(admit=admit):
            logger.warning("budget: %s", problem)
        logger.debug("budget: %s", budget.describe(admit=admit))
        return config

    @property
    def budget(self) -> Budget:
        return Budget(
            grace_period=self.grace_period,
            reserve=self.reserve,
            drain_timeout=self.drain_timeout,
            propagation_wait=self.propagation_wait,
            propagation_quiet=self.propagation_quiet,
        )

    def in_force(self) -> dict[str, object]:
        """The budget's options as the admin status shows them (``graceful advise`` reads them)."""
        return {
            "grace_period": self.grace_period,
            "reserve": self.reserve,
            "drain_timeout": self.drain_timeout,
            "propagation_wait": self.propagation_wait,
            "propagation_quiet": self.propagation_quiet,
            "admit_during_propagation": self.admit_during_propagation,
        }

    def overridden(
        self, propagation_wait: float | str | None, propagation_quiet: float | str | None, timeout: float | str | None
    ) -> tuple[float, float | None, float]:
        """The (wait, quiet, limit) of one drain with these overrides of the configured values."""
        wait = self.propagation_wait
        if propagation_wait is not None:
            wait = parse_duration(propagation_wait, name="propagation_wait")
        quiet = self.propagation_quiet
        if propagation_quiet is not None:
            quiet = parse_duration(propagation_quiet, name="propagation_quiet")
            check_quiet(quiet, wait, given=propagation_quiet)
        limit = self.budget.check_wait(
            wait, timeout=None if timeout is None else parse_duration(timeout, name="timeout")
        )
        return wait, quiet, limit


# Each drain option, declared once: its row of the option table in docs/middleware.md (default,
# meaning; a test holds the page to it) and how its GRACEFUL_* variable is read. DrainConfig's
# fields are the same names, in the same order.
_DECLARED: dict[str, tuple[str, str, Env]] = {
    "grace_period": (
        "env `GRACEFUL_GRACE_PERIOD`, else 30",
        "the pod's `terminationGracePeriodSeconds`",
        Env(duration, "a duration (`120`, `2m`)"),
    ),
    "reserve": (
        "30% of grace, ≥ 10 s",
        "left after the deadline for sidecars, log flush and exit",
        Env(duration, "a duration"),
    ),
    "drain_timeout": (
        "none",
        "an upper bound on the drain, below `grace_period − reserve`",
        Env(optional_duration, "a duration, or `none`"),
    ),
    "propagation_wait": (
        "0",
        "minimum drain time, for endpoint removal to reach every balancer (with `propagation_quiet`: the upper bound)",
        Env(duration, "a duration"),
    ),
    "propagation_quiet": (
        "env `GRACEFUL_PROPAGATION_QUIET`, else none",
        "end the propagation wait early once no new request has arrived for this long (see below)",
        Env(optional_duration, "a duration, or `none`"),
    ),
    "admit_during_propagation": (
        "True",
        "keep admitting until the propagation wait ends; False refuses from the drain's first instant (see below)",
        Env(flag, "`1`/`0` (also `true`/`false`, `yes`/`no`, `on`/`off`)"),
    ),
    "handoff_streams": (
        "env `GRACEFUL_HANDOFF_STREAMS`, else False",
        "once the propagation wait has passed, end resumable SSE streams at once with the final event, "
        "for the client to continue elsewhere (see [Resumable streams](resume.md))",
        Env(flag, "`1`/`0`"),
    ),
    "on_drain_start": (
        "none",
        "async hooks (deregister, flush audit data); cut off when they overrun",
        Env(named_object, "`module:function`, imported"),
    ),
    "on_drained": (
        "none",
        "async hooks (deregister, flush audit data); cut off when they overrun",
        Env(named_object, "`module:function`, imported"),
    ),
    "hook_timeout": (
        "5 s",
        "how long `on_drained` may take (never past deadline + reserve/2)",
        Env(duration, "a duration"),
    ),
    "unwind_timeout": (
        "2 s",
        "after the deadline, how long to wait for cancelled work to unwind",
        Env(duration, "a duration"),
    ),
    "drain_on_sigterm": (
        "env `GRACEFUL_DRAIN_ON_SIGTERM`, else True",
        "SIGTERM/SIGINT start the drain and reach the server's own handler once it has ended "
        "(see [outside Kubernetes](outside-kubernetes.md)); False leaves them to the server",
        Env(flag, "`1`/`0`"),
    ),
}
OPTION_DOCS: dict[str, tuple[str, str]] = {
    name: (default, meaning) for name, (default, meaning, _) in _DECLARED.items()
}
DRAIN_OPTIONS = frozenset(OPTION_DOCS)
# How each option's GRACEFUL_* variable is read, in the same order.
DRAIN_ENVIRON: dict[str, Env] = {name: env for name, (_, _, env) in _DECLARED.items()}
