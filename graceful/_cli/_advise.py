"""``graceful advise``: the budget from evidence, read from the servers (or an engine) that saw the traffic.

The arithmetic is ``_drain._advice``'s; this module gathers the evidence (every worker's admin
status, or an engine's metrics page), prints the advice and turns its verdict into an exit code:
0 when the budget in force covers the traffic seen (or cuts no more than ``--max-cut``), 1 when it
cuts more or the grace period the traffic needs is over ``--max-grace-period``, 2 for bad usage
(two sources of evidence at once among them), 3 when no server (or engine) answers.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import anyio
import click
from click.core import ParameterSource

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
    "OVER_LIMIT",
    "Problem",
    "as_typed",
    "engine_evidence",
    "evidence_from",
    "one_source",
    "parse_share",
    "report",
    "run_advise",
    "saved_evidence",
    "server_evidence",
    "verdict",
]

# The verdict when the grace period the traffic needs is over --max-grace-period (exit 1, as "cuts").
OVER_LIMIT = "over the limit"


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
    """The workers' statuses saved by ``graceful status --json`` (a list per file), merged; raises Problem.

    Input given twice counts once: a file named twice (by any path) is read once, and a worker saved
    twice (the same process: its pid and when its counts began) counts by its latest status only.
    """
    read: set[str] = set()
    workers: dict[tuple[object, ...], tuple[str, dict[str, Any]]] = {}
    for name in files:
        path = os.path.realpath(name)
        if path in read:
            continue
        read.add(path)
        try:
            with open(name, encoding="utf-8") as saved:
                content = json.load(saved)
        except OSError as exc:
            raise Problem(f"--from {name}: {exc.strerror}; give a file written by graceful status --json") from None
        except ValueError as exc:
            raise Problem(f"--from {name}: not JSON ({exc}); give a file written by graceful status --json") from None
        for index, body in enumerate(content if isinstance(content, list) else [content]):
            if not isinstance(body, dict) or Field.PID not in body or Field.STATE not in body:
                raise Problem(
                    f"--from {name}: not a worker status written by graceful status --json; "
                    f"save one with graceful status --json > {name}"
                )
            key = _worker(body) or (path, index)
            kept = workers.get(key)
            if kept is None or _until(body) > _until(kept[1]):
                workers[key] = (f"--from {name}", body)
    if not workers:
        given = " ".join(f"--from {name}" for name in files)
        where = "it" if len(files) == 1 else "them"
        raise Problem(f"{given}: no worker status in {where}; give files written by graceful status --json")
    origins, bodies = zip(*workers.values(), strict=True)
    return evidence_from(list(bodies), list(origins))


def _worker(body: dict[str, Any]) -> tuple[object, ...] | None:
    """Which process a saved status is (its pid and when its counts began), or None when it does not say."""
    durations = body.get(Field.DURATIONS)
    began = durations.get(Field.SINCE) if isinstance(durations, dict) else None
    return None if began is None else (str(body.get(Field.PID)), str(began))


def _until(body: dict[str, Any]) -> float:
    """When a saved status's counts end (0 when it does not say): of two of one worker, the later holds more."""
    durations = body.get(Field.DURATIONS)
    until = durations.get(Field.UNTIL) if isinstance(durations, dict) else None
    return float(until) if isinstance(until, (int, float)) else 0.0


def evidence_from(bodies: list[dict[str, Any]], origins: list[str] | None = None) -> tuple[Evidence, dict[str, Any]]:
    """Merge workers' statuses (``/status`` answers) and take the first one's budget; raises Problem.

    ``origins`` says where each came from (``--from FILE``), for the messages."""
    histograms: dict[str, Histogram] = {}
    now = time.time()
    since, until, propagation = now, 0.0, list[float]()
    for position, body in enumerate(bodies):
        where = f"{origins[position]}: " if origins else ""
        worker = f"{where}worker {body.get(Field.PID, '?')}"
        durations = body.get(Field.DURATIONS)
        if not isinstance(durations, dict) or Field.BOUNDS not in durations:
            raise Problem(f"{worker} reports no request durations: upgrade its graceful")
        try:
            for kind in KINDS:
                seen = Histogram.from_dict(durations[Field.BOUNDS], durations.get(kind) or {})
                histograms[kind] = histograms[kind].merged(seen) if kind in histograms else seen
            since = min(since, float(durations.get(Field.SINCE) or since))
            until = max(until, float(durations.get(Field.UNTIL) or now))
            propagation.extend(float(p) for p in body.get(Field.PROPAGATION) or ())
        except (ObservationError, AttributeError, TypeError, ValueError) as exc:
            raise Problem(f"{worker}: unreadable durations ({exc})") from None
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
            raise Problem(
                f"--engine {engine}: it publishes no request-duration histogram; name one with --histogram NAME"
            )
        raise Problem("--metrics-url needs --engine (vllm, sglang, tgi) or --histogram NAME to know what to read")
    url = metrics_url or (preset.url if preset is not None else "")
    if not url:
        raise Problem(f"--histogram {name} needs --metrics-url (the engine's metrics page) or --engine")
    try:
        seen = anyio.run(fetch_histogram, url, name)
    except EvidenceError as exc:
        raise Problem(str(exc), EXIT_NO_SERVER if exc.unreachable else EXIT_USAGE) from None
    return Evidence({"all requests": seen}, None, (), f"{name} at {url}", sees_drains=False)


def one_source(*sources: str) -> None:
    """Refuse two sources of evidence at once (running servers, saved statuses, an engine's page);
    raises Problem (exit 2). Each source is as the command line gave it (``--from status.json``),
    or "" when not given: ``as_typed`` makes one."""
    named = [source for source in sources if source]
    if len(named) > 1:
        listed = f"{', '.join(named[:-1])} or {named[-1]}"
        raise Problem(
            f"use {listed}, not {'both' if len(named) == 2 else 'more than one'}: each is a source of evidence"
        )


def as_typed(*options: tuple[str, str | None]) -> str:
    """The first option of one source that the command line gave, as typed (``--engine vllm``), else ""."""
    return next((f"{flag} {value}" for flag, value in options if value), "")


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
        lines.append(
            f"  arriving during the {seen.wait:g} s propagation wait ({seen.limit - seen.wait:g} s to the deadline "
            f"at its end): --admission fits would refuse up to {seen.refused:.0f} of the {seen.requests} requests "
            f"seen ({seen.refused / seen.requests:.2%}); --admission all would leave at least {seen.cut:.0f} to be "
            f"cut ({seen.cut / seen.requests:.2%})"
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
