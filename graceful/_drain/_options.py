"""The drain options, each declared once.

``DrainConfig`` is what ``Drain`` is built from: the ``Budget`` (whose fields are the budget's
options, declared in ``_budget``) and the options declared here. Together they are the keyword
arguments of ``Drain(...)`` and the drain options of ``GracefulMiddleware(...)``, the options
``graceful run`` compares against an app wrapped elsewhere, and the rows of the documentation's
option table (a test holds the page to them). Each field says its default and how its
``GRACEFUL_*`` variable is read (``_environ.option``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._admission import Admission, check_mode, read_mode
from ._budget import Budget, check_quiet, parse_duration
from ._environ import UNSET, Env, callable_kind, declared, duration, flag, from_environ, option
from ._errors import ConfigError, reported

__all__ = ["DRAIN_DECLARED", "DRAIN_OPTIONS", "DrainConfig", "Hook", "Overrides", "check_given"]

logger = logging.getLogger("graceful")

Hook = Callable[[], Awaitable[None]]
_HOOK_MEANING = "async hooks (deregister, flush audit data); cut off when they overrun"
# A hook is awaited mid-drain: one that is not callable, not async or wants arguments is refused
# when the options are resolved, not found out by the drain that calls it.
_HOOK_READ, _HOOK_CHECK = callable_kind("an async function of no arguments (async def hook(): ...)", awaited=True)


@dataclass(frozen=True)
class DrainConfig:
    """Drain options with durations parsed and the budget's defaults filled in."""

    budget: Budget
    admit_during_propagation: bool = option(
        True,
        flag,
        "`1`/`0` (also `true`/`false`, `yes`/`no`, `on`/`off`)",
        "keep admitting until the propagation wait ends; False refuses from the drain's first instant (see below)",
    )
    handoff_streams: bool = option(
        False,
        flag,
        "`1`/`0`",
        "once the propagation wait has passed, end resumable SSE streams at once with the final event, "
        "for the client to continue elsewhere (see [Resumable streams](resume.md))",
    )
    admission: Admission = option(
        "all",
        read_mode,
        "`all` or `fits`",
        "during a drain, `all` admits every request the drain would; `fits` only those expected to finish "
        "before this replica ends them, refusing the others with the not-started 503 "
        "(see [Admission during a drain](budget.md#admission-during-a-drain))",
        check=check_mode,
    )
    on_drain_start: Hook | None = option(
        None, _HOOK_READ, "`module:function`, imported", _HOOK_MEANING, check=_HOOK_CHECK
    )
    on_drained: Hook | None = option(None, _HOOK_READ, "`module:function`, imported", _HOOK_MEANING, check=_HOOK_CHECK)
    hook_timeout: float = option(
        5.0, duration, "a duration", "how long `on_drained` may take (never past deadline + reserve/2)"
    )
    unwind_timeout: float = option(
        2.0, duration, "a duration", "after the deadline, how long to wait for cancelled work to unwind"
    )
    drain_on_sigterm: bool = option(
        True,
        flag,
        "`1`/`0`",
        "SIGTERM/SIGINT start the drain and reach the server's own handler once it has ended "
        "(see [outside Kubernetes](outside-kubernetes.md)); False leaves them to the server",
    )
    # Not an option: the names of the options given in code, read-only. The others came from their
    # variables, else their defaults; ``graceful run`` refuses a flag that contradicts one given in code.
    in_code: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @classmethod
    def resolve(cls, given: Mapping[str, Any], environ: Mapping[str, str]) -> DrainConfig:
        """Parse the options given (``UNSET`` where not; durations as numbers or strings), filling the rest
        from their variables in ``environ``, else the defaults; raises TypeError, or ConfigError as a server
        that imports the app reports in one line (``reported``: ``Drain(...)`` is often built at import)."""
        unknown = set(given) - DRAIN_OPTIONS
        if unknown:
            raise TypeError(f"unknown drain option(s) {sorted(unknown)}; the options are {sorted(DRAIN_OPTIONS)}")
        try:
            budget = Budget.resolve(environ=environ, **{name: given.get(name, UNSET) for name in _BUDGET})
            passed = check_given(_OWN, {name: value for name, value in given.items() if name in _OWN})
            found, _ = from_environ(_OWN, (name for name in _OWN if name not in passed), environ)
        except ConfigError as exc:
            raise reported(exc).with_traceback(None) from None
        # A budget option given as None is not given (Budget.resolve's rule): its variable fills it.
        in_code = {name for name in _BUDGET if given.get(name) is not None and given[name] is not UNSET}
        config = cls(budget, **{**found, **passed}, in_code=frozenset(in_code | passed.keys()))
        for problem in budget.problems(admit=config.admit_during_propagation):
            logger.warning("budget: %s", problem)
        logger.debug("budget: %s", budget.describe(admit=config.admit_during_propagation))
        return config

    def values(self) -> dict[str, object]:
        """Every drain option's value in force, by name (``graceful run`` compares its flags with them)."""
        budget = self.budget
        return {name: getattr(budget, name) for name in _BUDGET} | {name: getattr(self, name) for name in _OWN}

    def in_force(self) -> dict[str, object]:
        """The budget's options as the admin status shows them (``graceful advise`` reads them)."""
        budget = self.budget
        shown: dict[str, object] = {name: getattr(budget, name) for name in _BUDGET}
        return shown | {"admit_during_propagation": self.admit_during_propagation}


class Overrides:
    """A drain's own ``propagation_wait``, ``propagation_quiet`` and ``timeout``, parsed and judged against
    the budget once: the rule ``Drain.begin_drain``, the admin server and ``graceful drain`` share."""

    __slots__ = ("limit", "quiet", "wait")

    def __init__(
        self,
        config: DrainConfig,
        propagation_wait: float | str | None = None,
        propagation_quiet: float | str | None = None,
        timeout: float | str | None = None,
    ) -> None:
        budget = config.budget
        wait = budget.propagation_wait
        if propagation_wait is not None:
            wait = parse_duration(propagation_wait, name="propagation_wait")
        quiet = budget.propagation_quiet
        if propagation_quiet is not None:
            quiet = parse_duration(propagation_quiet, name="propagation_quiet")
            check_quiet(quiet, wait, given=propagation_quiet)
        limit = budget.check_wait(wait, timeout=None if timeout is None else parse_duration(timeout, name="timeout"))
        self.wait: float = wait
        self.quiet: float | None = quiet
        self.limit: float = limit

    def as_tuple(self) -> tuple[float, float | None, float]:
        return self.wait, self.quiet, self.limit


def check_given(table: Mapping[str, tuple[Any, Env]], given: Mapping[str, Any]) -> dict[str, Any]:
    """The options passed in code (not ``UNSET``), checked by their declarations (``Env.check``: a flag
    must be a bool, a duration parses, a hook is an async function...); raises :class:`ConfigError`
    naming the option as passed, the value and the fix."""
    return {name: table[name][1].check(name, value) for name, value in given.items() if value is not UNSET}


_BUDGET = declared(Budget)
_OWN = declared(DrainConfig)
# Every drain option, in the order of the documentation's table: the budget's, then the drain's own.
DRAIN_DECLARED = _BUDGET | _OWN
DRAIN_OPTIONS = frozenset(DRAIN_DECLARED)
