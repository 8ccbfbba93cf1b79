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

from ._admission import MODES, Admission, check_mode, read_mode
from ._budget import BUDGET_DECLARED, Budget, not_none
from ._durations import RULES, check_quiet
from ._environ import FLAG, UNSET, Env, Given, Kind, callable_kind, declared, duration, option
from ._errors import ConfigError, reported

__all__ = ["DRAIN_DECLARED", "DRAIN_OPTIONS", "DrainConfig", "Hook", "Overrides"]

logger = logging.getLogger("graceful")

Hook = Callable[[], Awaitable[None]]
_HOOK_MEANING = "async hooks (deregister, flush audit data); cut off when they overrun"
# A hook is awaited mid-drain: one that is not callable, not async or wants arguments is refused
# when the options are resolved, not found out by the drain that calls it.
_HOOK = callable_kind("an async function of no arguments (async def hook(): ...)", awaited=True)
_MODULE_FUNCTION = "`module:function`, imported"


@dataclass(frozen=True)
class DrainConfig:
    """Drain options with durations parsed and the budget's defaults filled in."""

    budget: Budget
    admit_during_propagation: bool = option(
        default=True,
        kind=FLAG,
        value="`1`/`0` (also `true`/`false`, `yes`/`no`, `on`/`off`)",
        meaning="keep admitting until the propagation wait ends; off, refuse new requests from the drain's first "
        "instant (see below)",
        noun="admission mode",
    )
    handoff_streams: bool = option(
        default=False,
        kind=FLAG,
        value="`1`/`0`",
        meaning="once the propagation wait has passed, end resumable SSE streams at once with the final event, "
        "for the client to continue elsewhere (see [Resumable streams](resume.md))",
    )
    admission: Admission = option(
        default="fits",
        kind=Kind(read_mode, check_mode, choices=MODES),
        value="`all` or `fits`",
        meaning="during a drain, `all` admits every request the drain would; `fits` only those expected to finish "
        "before this replica ends them, refusing the others with the not-started 503 "
        "(see [Admission during a drain](budget.md#admission-during-a-drain))",
    )
    on_drain_start: Hook | None = option(default=None, kind=_HOOK, value=_MODULE_FUNCTION, meaning=_HOOK_MEANING)
    on_drained: Hook | None = option(default=None, kind=_HOOK, value=_MODULE_FUNCTION, meaning=_HOOK_MEANING)
    hook_timeout: float = option(
        default=5.0,
        kind=duration(),
        value="a duration",
        meaning="how long `on_drained` may take (never past deadline + reserve/2)",
    )
    unwind_timeout: float = option(
        default=2.0,
        kind=duration(),
        value="a duration",
        meaning="after the deadline, how long to wait for cancelled work to unwind",
    )
    drain_on_sigterm: bool = option(
        default=True,
        kind=FLAG,
        value="`1`/`0`",
        meaning="SIGTERM/SIGINT start the drain and reach the server's own handler once it has ended "
        "(see [outside Kubernetes](outside-kubernetes.md)); False leaves them to the server",
    )
    # Not an option: the names of the options given in code, read-only. The others came from their
    # variables, else their defaults; ``graceful run`` refuses a flag that contradicts one given in code.
    in_code: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @classmethod
    def resolve(cls, given: Mapping[str, Any], environ: Mapping[str, str]) -> DrainConfig:
        """The drain options ``given`` (``UNSET`` where not; durations as numbers or strings; a budget option
        given as None is not given), the rest from their variables in ``environ``, else the defaults (``Given``);
        raises TypeError, or ConfigError as a server that imports the app reports in one line (``reported``:
        ``Drain(...)`` is often built at import)."""
        unknown = {name for name, value in given.items() if value is not UNSET} - DRAIN_OPTIONS
        if unknown:
            raise TypeError(f"unknown drain option(s) {sorted(unknown)}; the options are {sorted(DRAIN_OPTIONS)}")
        options = Given(
            DRAIN_DECLARED,
            environ,
            {name: UNSET if value is None and name in _BUDGET else value for name, value in given.items()},
        )
        try:
            budget = Budget.from_given(options)
            config = cls(budget, **options.settle(_OWN), in_code=options.in_code)
        except ConfigError as exc:
            raise reported(exc).with_traceback(None) from None
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
        options = {"propagation_wait": propagation_wait, "propagation_quiet": propagation_quiet, "timeout": timeout}
        given = Given(_OVERRIDES, {}, not_none(options), names={"timeout": "this drain's timeout"})
        own = given.settle(_OVERRIDES)
        wait = budget.propagation_wait if propagation_wait is None else own["propagation_wait"]
        quiet = own["propagation_quiet"]  # this drain's, judged against its wait; else the budget's, judged already
        self.limit: float = given.judged(_judge, budget=budget, wait=wait, quiet=quiet, timeout=own["timeout"])
        self.wait: float = wait
        self.quiet: float | None = budget.propagation_quiet if quiet is None else quiet

    def as_tuple(self) -> tuple[float, float | None, float]:
        return self.wait, self.quiet, self.limit


def _judge(*, budget: Budget, wait: float, quiet: float | None, timeout: float | None) -> float:
    """A drain's own quiet period against its wait, and its wait against the budget shortened by its own timeout."""
    if quiet is not None:
        check_quiet(quiet, wait)
    return budget.judge(wait, timeout=timeout)


_BUDGET = BUDGET_DECLARED
_OWN = declared(DrainConfig)
# Every drain option, in the order of the documentation's table: the budget's, then the drain's own.
DRAIN_DECLARED = _BUDGET | _OWN
DRAIN_OPTIONS = frozenset(DRAIN_DECLARED)
# What a drain's overrides take: the budget's wait and quiet period, and its own timeout (the drain
# timeout's rule: above 0).
_OVERRIDES: dict[str, tuple[Any, Env]] = {name: _BUDGET[name] for name in ("propagation_wait", "propagation_quiet")}
_OVERRIDES["timeout"] = (
    None,
    Env(duration(RULES["timeout"], optional=True), "a duration", "this drain's timeout", None, None),
)
