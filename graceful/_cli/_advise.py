"""``graceful advise``: the budget from evidence, read from the servers (or an engine) that saw the traffic.

The arithmetic is ``_drain._advice``'s; this module gathers the evidence (every worker's admin
status, or an engine's metrics page), prints the advice and turns its verdict into an exit code:
0 when the budget in force covers the traffic seen (or cuts no more than ``--max-cut``), 1 when it
cuts more, 2 for bad usage, 3 when no server (or engine) answers.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import anyio
import click

from .._admin._client import NoServer, discover, request_all
from .._admin._wire import Field
from .._drain._advice import Advice, Evidence, advise
from .._drain._budget import Budget
from .._drain._durations import default_reserve, parse_duration
from .._drain._errors import ConfigError
from .._drain._observed import KINDS, Histogram, ObservationError
from .._drain._options import DrainConfig
from ._servers import EXIT_LEFTOVER, EXIT_NO_SERVER, EXIT_OK, EXIT_USAGE

__all__ = [
    "Problem",
    "engine_evidence",
    "evidence_from",
    "parse_share",
    "report",
    "run_advise",
    "saved_evidence",
    "server_evidence",
]


class Problem(Exception):
    """What keeps ``advise`` from advising, with the exit code it means."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


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


def server_evidence(socket_dir: str | None, socket: str | None) -> tuple[Evidence, dict[str, Any]]:
    """Every worker's durations, merged, and the budget in force (the first worker's); raises Problem."""
    try:
        paths = discover(socket_dir, socket)
        answers = request_all(paths, "GET", "/status")
    except NoServer as exc:
        raise Problem(str(exc), EXIT_NO_SERVER) from None
    live = [body for body in answers.values() if body is not None]
    if not live:
        raise Problem("no graceful server found: nothing is listening on " + ", ".join(paths), EXIT_NO_SERVER)
    return evidence_from(live)


def saved_evidence(files: tuple[str, ...]) -> tuple[Evidence, dict[str, Any]]:
    """The workers' statuses saved by ``graceful status --json`` (a list per file), merged; raises Problem."""
    bodies: list[dict[str, Any]] = []
    for name in files:
        try:
            with open(name, encoding="utf-8") as saved:
                content = json.load(saved)
        except OSError as exc:
            raise Problem(f"--from {name}: {exc.strerror}; give a file written by graceful status --json") from None
        except ValueError as exc:
            raise Problem(f"--from {name}: not JSON ({exc}); give a file written by graceful status --json") from None
        content = content if isinstance(content, list) else [content]
        if not all(isinstance(body, dict) for body in content):
            raise Problem(
                f"--from {name}: not a list of worker statuses; give a file written by graceful status --json"
            )
        bodies.extend(content)
    if not bodies:
        raise Problem("--from: the files hold no worker status; give files written by graceful status --json")
    return evidence_from(bodies)


def evidence_from(bodies: list[dict[str, Any]]) -> tuple[Evidence, dict[str, Any]]:
    """Merge workers' statuses (``/status`` answers) and take the first one's budget; raises Problem."""
    histograms: dict[str, Histogram] = {}
    now = time.time()
    since, until, propagation = now, 0.0, list[float]()
    for body in bodies:
        durations = body.get(Field.DURATIONS)
        if not isinstance(durations, dict) or Field.BOUNDS not in durations:
            raise Problem(f"worker {body.get(Field.PID, '?')} reports no request durations: upgrade its graceful")
        try:
            for kind in KINDS:
                seen = Histogram.from_dict(durations[Field.BOUNDS], durations.get(kind) or {})
                histograms[kind] = histograms[kind].merged(seen) if kind in histograms else seen
            since = min(since, float(durations.get(Field.SINCE) or since))
            until = max(until, float(durations.get(Field.UNTIL) or now))
            propagation.extend(float(p) for p in body.get(Field.PROPAGATION) or ())
        except (ObservationError, AttributeError, TypeError, ValueError) as exc:
            raise Problem(f"worker {body.get(Field.PID, '?')}: unreadable durations ({exc})") from None
    workers = f"{len(bodies)} worker{'s' if len(bodies) != 1 else ''}"
    return Evidence(histograms, until - since, tuple(propagation), workers), dict(bodies[0].get(Field.BUDGET) or {})


def engine_evidence(engine: str | None, metrics_url: str | None, histogram: str | None) -> Evidence:
    """The engine's request-duration histogram, read once off its page; raises Problem."""
    from .._engine._histogram import EvidenceError, fetch_histogram
    from .._engine._presets import PRESETS

    preset = PRESETS[engine] if engine is not None else None
    name = histogram or (preset.histogram if preset is not None else "")
    if not name:
        if preset is not None:
            raise Problem(f"{engine} publishes no request-duration histogram; name one with --histogram NAME")
        raise Problem("--metrics-url needs --engine (vllm, sglang, tgi) or --histogram NAME to know what to read")
    url = metrics_url or (preset.url if preset is not None else "")
    if not url:
        raise Problem(f"--histogram {name} needs --metrics-url (the engine's metrics page) or --engine")
    try:
        seen = anyio.run(fetch_histogram, url, name)
    except EvidenceError as exc:
        raise Problem(str(exc), EXIT_NO_SERVER if exc.unreachable else EXIT_USAGE) from None
    return Evidence({"all requests": seen}, None, (), f"{name} at {url}", sees_drains=False)


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


def report(advice: Advice, max_cut: float) -> list[str]:
    """The advice as the command prints it."""
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
    lines.append(f"verdict: the budget in force {advice.verdict(max_cut)} (at risk {share:.2%}; allowed {allowed})")
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
    verdict = advice.verdict(share)
    if json_output:
        click.echo(json.dumps({**advice.as_dict(), "max_cut": share, "verdict": verdict}))
    else:
        for line in report(advice, share):
            click.echo(line)
    return EXIT_LEFTOVER if verdict == "cuts" else EXIT_OK
