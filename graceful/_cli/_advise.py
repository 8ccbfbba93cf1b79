"""``graceful advise``: the budget from evidence, read from the servers (or an engine) that saw the traffic.

The arithmetic is ``_drain._advice``'s and the evidence ``_evidence``'s (every worker's admin status, or
an engine's metrics page); this module declares the command, prints the advice and turns its verdict into an exit code:
0 when the budget in force covers the traffic seen (or cuts no more than ``--max-cut``), 1 when it
cuts more or the grace period the traffic needs is over ``--max-grace-period``, 2 for bad usage
(two sources of evidence at once among them), 3 when no server (or engine) answers.
"""

from __future__ import annotations

import json
import math
from typing import Any

import click
from click.core import ParameterSource

from .._drain._advice import Advice, advise
from .._drain._budget import Budget
from .._drain._durations import default_reserve
from .._drain._environ import parse_duration
from .._drain._errors import ConfigError
from .._drain._options import DRAIN_DECLARED, DrainConfig
from ._drain_client import EXIT_LEFTOVER, EXIT_OK, EXIT_USAGE
from ._evidence import Problem, as_typed, engine_evidence, one_source, saved_evidence, server_evidence
from ._params import ENGINES, judge_flag, search_dir, socket_dir_option, socket_option

__all__ = [
    "OVER_LIMIT",
    "advise_command",
    "parse_share",
    "report",
    "run_advise",
    "verdict",
]

# The verdict when the grace period the traffic needs is over --max-grace-period (exit 1, as "cuts").
OVER_LIMIT = "over the limit"


# The budget values the command line may give: its parameter -> (the budget's name, the flag).
_BUDGET_FLAGS = {
    "grace_period": ("grace_period", "--grace-period"),
    "reserve": ("reserve", "--reserve"),
    "propagation_wait": ("propagation_wait", "--propagation-wait"),
    "propagation_quiet": ("propagation_quiet", "--propagation-quiet"),
    "timeout": ("drain_timeout", "--timeout"),
}


def parse_share(text: str) -> float:
    """``1%``, ``0.5%`` or a fraction such as ``0.01``; raises ConfigError naming the value."""
    raw = text.strip()
    try:
        share = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        share = math.nan
    if not 0.0 <= share <= 1.0:
        raise ConfigError(f"--max-cut {text!r} is not a share; give a percentage such as 1% or a fraction such as 0.01")
    return share


def verdict(advice: Advice, max_cut: float, max_grace: float | None) -> str:
    """The advice's own verdict (``holds``, ``cuts``, ``no evidence``), but ``OVER_LIMIT`` where it
    holds while the grace period the traffic needs is over ``max_grace`` (or none can be read)."""
    judged = advice.verdict(max_cut)
    needed = advice.grace_period
    if judged == "holds" and max_grace is not None and (needed is None or needed > max_grace):
        return OVER_LIMIT
    return judged


def budget_from(in_force: dict[str, Any], given: dict[str, float | None]) -> tuple[Budget, bool]:
    """The budget to judge: the server's (or the environment's), with the command line's values over it.

    Returns it with whether its reserve was set (kept by the recommendations) rather than the default rule."""
    values = {**in_force, **{k: v for k, v in given.items() if v is not None}}
    if given.get("grace_period") is not None and given.get("reserve") is None:
        values.pop("reserve", None)  # a new grace period brings its own default reserve
    reserve = values.get("reserve")
    budget = Budget.resolve(
        grace_period=values.get("grace_period"),
        reserve=reserve,
        drain_timeout=values.get("drain_timeout"),
        propagation_wait=values.get("propagation_wait") or 0.0,
        propagation_quiet=values.get("propagation_quiet"),
    )
    return budget, reserve is not None and budget.reserve != default_reserve(budget.grace_period)


def _bound(value: float, last: float) -> str:
    """A percentile as the bucket gives it: ``<= 15 s``, or ``> 7680 s`` past the last bucket."""
    return f"> {last:g} s" if math.isinf(value) else f"<= {value:g} s"


def _window(seconds: float | None) -> str:
    if seconds is None:
        return "since the engine started"
    if seconds >= 3600:
        return f"over {seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"over {seconds / 60:.0f} min"
    return f"over {seconds:.0f} s"


def report(advice: Advice, max_cut: float, max_grace: float | None = None, max_grace_given: str = "") -> list[str]:
    """The advice as the command prints it; ``max_grace_given`` is ``--max-grace-period`` as typed."""
    evidence = advice.evidence
    if advice.requests == 0:
        return [f"graceful advise: {evidence.source}: no finished request seen yet; send traffic, then ask again"]
    lines = [f"graceful advise: {evidence.source}, {advice.requests} finished requests {_window(evidence.window)}"]
    lines.append(f"  {'durations':<13}{'p50':>11}{'p95':>11}{'p99':>11}{'max':>11}   (bucket upper bounds)")
    for name, figures in advice.percentiles.items():
        if name == "all" and len(advice.percentiles) <= 2:
            continue  # one kind seen: its row says it all
        cells = "".join(f"{_bound(figures[p], advice.last_bound):>11}" for p in ("p50", "p95", "p99", "max"))
        lines.append(f"  {name:<13}{cells}")
    if evidence.propagation:
        count = len(evidence.propagation)
        lines.append(
            f"  propagation: {count} drain figure{'s' if count != 1 else ''} (one per worker and drain); "
            f"new requests stopped {max(evidence.propagation):.1f} s after a drain's start at the latest"
        )
    elif evidence.sees_drains:
        lines.append("  propagation: no drain seen yet (graceful_propagation_seconds fills at the first)")
    else:
        lines.append("  propagation: an engine's page has no drain figures (graceful's own counts have)")
    budget = advice.budget
    mode = "admitting during it" if advice.admit else "refusing during it"
    lines.append(
        f"budget in force: grace period {budget.grace_period:g} s, reserve {budget.reserve:g} s"
        + ("" if budget.drain_timeout is None else f", drain timeout {budget.drain_timeout:g} s")
        + f", propagation wait {budget.propagation_wait:g} s, {mode}: covers requests of up to {advice.covered:g} s"
    )
    risky = advice.at_risk["all"]
    share = advice.at_risk_share
    if risky:
        by_kind = ", ".join(f"{advice.at_risk[k]} {k}" for k in advice.at_risk if k != "all" and advice.at_risk[k])
        lines.append(
            f"  at risk: {risky} of {advice.requests} requests ({share:.2%}; {by_kind}) may have run longer: "
            "a drain can cut such requests at its deadline"
        )
    else:
        lines.append(f"  at risk: none of the {advice.requests} requests ran longer: this budget cuts none of them")
    seen = advice.admitting  # issue 54: what each admission mode does with the requests of the wait
    if seen is not None:
        left = seen.limit - seen.wait
        arriving = f"  arriving during the {seen.wait:g} s propagation wait ({left:g} s to the deadline at its end)"
        if round(seen.refused) == 0:
            lines.append(f"{arriving}, every request seen finishes: --admission fits refuses none, all cuts none")
        else:
            lines.append(
                f"{arriving}: --admission fits would refuse up to {math.ceil(seen.refused - 1e-9)} of the "
                f"{seen.requests} requests seen ({seen.refused / seen.requests:.2%}); --admission all would leave at "
                f"least {math.floor(seen.cut + 1e-9)} to be cut ({seen.cut / seen.requests:.2%})"
            )
    lines.append("recommended:")
    reasons = advice.reasons
    if advice.grace_period is not None:
        lines.append(f"  terminationGracePeriodSeconds: {advice.grace_period:g}   ({reasons.get('grace_period', '')})")
    lines.append(f"  propagation wait: {advice.propagation_wait:g} s   ({reasons.get('propagation_wait', '')})")
    if advice.propagation_quiet is not None:
        why = reasons.get("propagation_quiet", "in force")
        lines.append(f"  propagation quiet: {advice.propagation_quiet:g} s   ({why})")
    if advice.drain_timeout is not None:
        lines.append(f"  drain timeout: {advice.drain_timeout:g} s or unset   ({reasons.get('drain_timeout', '')})")
    if advice.admit and advice.refuse_grace_period is not None and advice.refuse_grace_period != advice.grace_period:
        lines.append(
            f"  refusing new requests during the wait (--no-admit-during-propagation) needs "
            f"{advice.refuse_grace_period:g} s instead; the balancers must retry the refusals"
        )
    if advice.handoff is not None:
        lines.append(f"  {advice.handoff}")
    allowed = "none" if max_cut == 0 else f"{max_cut:.2%}"
    judged = verdict(advice, max_cut, max_grace)
    if judged == OVER_LIMIT:
        limit = f"--max-grace-period {max_grace_given}"
        judged = (
            f"{OVER_LIMIT}: no grace period holds the longest requests seen, within {limit} or beyond"
            if advice.grace_period is None
            else f"{OVER_LIMIT}: the traffic seen needs a grace period of {advice.grace_period:g} s, "
            f"more than {limit} allows"
        )
    else:
        judged = f"the budget in force {judged}"
    lines.append(f"verdict: {judged} (at risk {share:.2%}; allowed {allowed})")
    return lines


def run_advise(
    *,
    socket_dir: str | None,
    socket: str | None,
    engine: str | None,
    metrics_url: str | None,
    histogram: str | None,
    saved: tuple[str, ...],
    admit_during_propagation: bool | None,
    max_cut: str,
    max_grace_period: str | None,
    json_output: bool,
    **budget_options: str | None,
) -> int:
    """Read the options (``budget_options``: those of ``_BUDGET_FLAGS``, as the command line gave
    them), gather, judge, print; returns the exit code."""
    try:
        given = {
            name: None if budget_options[param] is None else parse_duration(str(budget_options[param]), name=flag)
            for param, (name, flag) in _BUDGET_FLAGS.items()
        }
        share = parse_share(max_cut)
        longest = None if max_grace_period is None else parse_duration(max_grace_period, name="--max-grace-period")
        # GRACEFUL_SOCKET_DIR says where servers are, not that they are the evidence: only the flag counts.
        one_source(
            as_typed(("--socket-dir", socket_dir if _typed("socket_dir") else None), ("--socket", socket)),
            as_typed(("--from", saved[0] if saved else None)),
            as_typed(("--engine", engine), ("--metrics-url", metrics_url), ("--histogram", histogram)),
        )
        if engine is not None or metrics_url is not None or histogram is not None:
            evidence = engine_evidence(engine, metrics_url, histogram)
            in_force: dict[str, Any] = {}
        elif saved:
            evidence, in_force = saved_evidence(saved)
        else:
            evidence, in_force = server_evidence(socket_dir, socket)
        budget, reserve_given = budget_from(in_force, given)
    except (Problem, ConfigError) as exc:
        click.echo(f"graceful advise: {exc}", err=True)
        return exc.code if isinstance(exc, Problem) else EXIT_USAGE
    admit = (
        in_force.get("admit_during_propagation", DrainConfig.admit_during_propagation)
        if admit_during_propagation is None
        else admit_during_propagation
    )
    advice = advise(evidence, budget, admit=bool(admit), max_grace=longest, reserve_given=reserve_given)
    judged = verdict(advice, share, longest)
    if json_output:
        click.echo(json.dumps({**advice.as_dict(), "max_cut": share, "max_grace_period": longest, "verdict": judged}))
    else:
        for line in report(advice, share, longest, max_grace_period or ""):
            click.echo(line)
    return EXIT_LEFTOVER if judged in ("cuts", OVER_LIMIT) else EXIT_OK


def _typed(name: str) -> bool:
    """Whether the command line gave option ``name`` (rather than its environment variable)."""
    ctx = click.get_current_context(silent=True)
    return ctx is None or ctx.get_parameter_source(name) is not ParameterSource.ENVIRONMENT


@click.command("advise")
@socket_dir_option
@socket_option
@click.option("--engine", type=click.Choice(ENGINES), default=None, help="Read an engine's request-duration histogram.")
@click.option("--metrics-url", default=None, metavar="URL", help="The engine's metrics page [the engine's default].")
@click.option(
    "--histogram", default=None, metavar="NAME", help="The request-duration histogram to read [the engine's]."
)
@click.option(
    "--from",
    "saved",
    multiple=True,
    metavar="FILE",
    help="Read workers' statuses saved by graceful status --json instead of asking running servers; repeatable.",
)
# What if: the budget's options and the admission mode, from their fields. Durations are read by ``run_advise``:
# a wrong one gets a one-line message, as every other problem does.
@judge_flag("grace_period", DRAIN_DECLARED["grace_period"])
@judge_flag("reserve", DRAIN_DECLARED["reserve"], instead="the server's, else the default rule")
@judge_flag("propagation_wait", DRAIN_DECLARED["propagation_wait"])
@judge_flag("propagation_quiet", DRAIN_DECLARED["propagation_quiet"])
@judge_flag("drain_timeout", DRAIN_DECLARED["drain_timeout"], flag="--timeout")
@judge_flag(
    "admit_during_propagation", DRAIN_DECLARED["admit_during_propagation"], instead="the server's (engines: admit)"
)
@click.option(
    "--max-cut",
    default="0",
    metavar="SHARE",
    show_default=True,
    help="Exit 1 when the budget leaves more than this share of the requests seen at risk (1% or 0.01).",
)
@click.option(
    "--max-grace-period", default=None, metavar="DURATION", help="The longest grace period the platform allows."
)
@click.option("--json", "json_output", is_flag=True, help="Print the advice as JSON on stdout.")
@click.pass_context
def advise_command(ctx: click.Context, /, **options: Any) -> None:
    """Say which grace period, propagation wait and timeout the traffic seen needs.

    Reads every worker's request durations over the admin socket (or from files saved by
    graceful status --json, or an engine's histogram) and judges the budget in force by them. Exit 0
    when it covers them (within --max-cut), 1 when it does not, 2 on bad usage, 3 when
    no server answers.
    """
    options["socket_dir"] = search_dir(ctx, options["socket_dir"], options["socket"])
    ctx.exit(run_advise(**options))
