"""The budget from evidence: what the durations a server saw say about its grace period.

Pure arithmetic over ``Histogram`` snapshots and a ``Budget``, with the budget's own rule
(``Budget.longest_covered``) as the only measure of what a budget holds:

- a request is *at risk* when it lasted longer than the budget in force covers; their share
  is what a drain can cut at its deadline;
- the recommended grace period is the shortest whole number of seconds whose budget covers
  the longest request seen (a bucket's upper bound, never less than the truth);
- the recommended propagation wait is never shorter than the one in force: the slowest drain
  seen (``graceful_propagation_seconds``) with half again as much raises it, and the quiet
  rule ends it early.

``outlook`` judges the work in flight at a drain's start by the same durations, and ``admitting`` the
requests that arrive during the propagation wait: how many ``admission="fits"`` would refuse and how many
``admission="all"`` would leave to be cut (issue 54).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ._budget import Budget
from ._durations import default_reserve
from ._observed import Histogram, merge_all

__all__ = [
    "PROPAGATION_HEADROOM",
    "QUIET",
    "Admitting",
    "Advice",
    "Evidence",
    "Outlook",
    "admitting",
    "advise",
    "outlook",
]

PERCENTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99), ("max", 1.0))
PROPAGATION_HEADROOM = 1.5  # the slowest propagation seen, times this, rounded up to whole seconds
QUIET = 2.0  # the suggested quiet rule: the wait ends once no new request has come for this long
_LONGEST_GRACE = 10**7  # seconds: the search's upper end (115 days)


@dataclass(frozen=True)
class Evidence:
    """What a server (or an engine's page) saw: durations by kind, over ``window`` seconds, and
    each drain's propagation figure. An engine's page has one histogram, for all requests."""

    histograms: dict[str, Histogram]
    window: float | None = None
    propagation: tuple[float, ...] = ()
    source: str = ""
    sees_drains: bool = True  # False for an engine's page: it has no propagation figures

    @property
    def all(self) -> Histogram:
        merged = merge_all(self.histograms.values())
        return Histogram.empty() if merged is None else merged


@dataclass(frozen=True)
class Advice:
    """What ``graceful advise`` says: the evidence, the verdict on the budget in force and the numbers."""

    evidence: Evidence
    percentiles: dict[str, dict[str, float]]
    budget: Budget
    admit: bool
    covered: float
    at_risk: dict[str, int]
    longest: float
    grace_period: float | None  # None: no evidence, or no grace period holds the longest request seen
    propagation_wait: float
    propagation_quiet: float | None
    drain_timeout: float | None
    refuse_grace_period: float | None  # the grace period if new requests were refused during the wait
    reasons: dict[str, str] = field(default_factory=dict)
    handoff: str | None = None
    admitting: Admitting | None = None  # None: nothing is admitted during the propagation wait

    @property
    def requests(self) -> int:
        return self.evidence.all.count

    @property
    def last_bound(self) -> float:
        """The histogram's last bucket bound: longer requests have no figure."""
        bounds = self.evidence.all.bounds
        return bounds[-1] if bounds else math.inf

    def verdict(self, max_cut: float) -> str:
        """``cuts`` when the share at risk is over ``max_cut``, else ``holds``; ``no evidence`` before any request."""
        if self.requests == 0:
            return "no evidence"
        return "cuts" if self.at_risk_share > max_cut else "holds"

    @property
    def at_risk_share(self) -> float:
        return 0.0 if self.requests == 0 else self.at_risk["all"] / self.requests

    def as_dict(self) -> dict[str, object]:
        def number(value: float | None) -> float | str | None:
            if value is None:
                return None
            return "inf" if math.isinf(value) else round(value, 6)

        evidence = self.evidence
        return {
            "source": evidence.source,
            "requests": self.requests,
            "window": number(evidence.window),
            "percentiles": {k: {p: number(v) for p, v in ps.items()} for k, ps in self.percentiles.items()},
            "propagation": {
                "drains": len(evidence.propagation),
                "longest": number(max(evidence.propagation, default=None)),
            },
            "in_force": {
                "grace_period": self.budget.grace_period,
                "reserve": self.budget.reserve,
                "drain_timeout": self.budget.drain_timeout,
                "propagation_wait": self.budget.propagation_wait,
                "propagation_quiet": self.budget.propagation_quiet,
                "admit_during_propagation": self.admit,
                "limit": self.budget.limit,
                "covers": number(self.covered),
            },
            "at_risk": {**self.at_risk, "share": round(self.at_risk_share, 6)},
            "recommended": {
                "grace_period": self.grace_period,
                "propagation_wait": self.propagation_wait,
                "propagation_quiet": self.propagation_quiet,
                "drain_timeout": self.drain_timeout,
                "grace_period_refusing": self.refuse_grace_period,
                "reasons": self.reasons,
            },
            "longest": number(self.longest),
            "handoff": self.handoff,
            "admitting": None if self.admitting is None else self.admitting.as_dict(),
        }


def advise(
    evidence: Evidence, budget: Budget, *, admit: bool, max_grace: float | None = None, reserve_given: bool = False
) -> Advice:
    """Judge ``budget`` by ``evidence`` and find the numbers that cover what was seen.

    ``admit`` is the server's ``admit_during_propagation``; ``max_grace`` the longest grace period
    the platform allows (beyond it, streams must be handed off); ``reserve_given``: the budget's
    reserve was set, so the recommendations keep it (else they use the default rule).
    """
    merged = evidence.all
    percentiles = {
        name: {label: histogram.quantile(q) for label, q in PERCENTILES}
        for name, histogram in [*evidence.histograms.items(), ("all", merged)]
        if histogram.count
    }
    covered = budget.longest_covered(admit=admit)
    at_risk = {name: histogram.over(covered) for name, histogram in evidence.histograms.items()}
    at_risk["all"] = merged.over(covered)
    longest = merged.longest()
    reasons: dict[str, str] = {}

    wait = budget.propagation_wait
    figures = len(evidence.propagation)
    if evidence.propagation:
        slowest = max(evidence.propagation)
        seen = float(math.ceil(slowest * PROPAGATION_HEADROOM))
        if seen > wait:
            wait = seen
            reasons["propagation_wait"] = (
                f"the slowest of {figures} drain figures (one per worker and drain) had new requests until "
                f"{slowest:.1f} s; x {PROPAGATION_HEADROOM:g}, rounded up"
            )
        elif wait == 0:
            reasons["propagation_wait"] = "none in force, so the drains seen could measure none: set one"
        else:
            reasons["propagation_wait"] = (
                f"the {wait:g} s in force covers the slowest of {figures} drain figures ({slowest:.1f} s; "
                "a figure cannot pass the wait in force)"
            )
    elif evidence.sees_drains:
        reasons["propagation_wait"] = "no drain seen yet: the wait in force"
    else:
        reasons["propagation_wait"] = "an engine's page has no drain figures: the wait given"
    quiet = budget.propagation_quiet
    if quiet is None and wait >= QUIET:
        quiet = QUIET
        reasons["propagation_quiet"] = f"ends the wait once {QUIET:g} s pass without a new request"

    reserve = budget.reserve if reserve_given else None
    seen_any = merged.count > 0  # no evidence, no numbers
    grace = _shortest_grace(longest, wait, reserve, admit=admit) if seen_any else None
    refuse_grace = _shortest_grace(longest, wait, reserve, admit=False) if seen_any else None
    handoff = None
    if seen_any and grace is None:
        handoff = (
            f"the longest requests outran the histogram's last bucket ({merged.bounds[-1]:g} s): "
            "no grace period can be read from them"
        )
    elif grace is not None and max_grace is not None and grace > max_grace:
        handoff = f"{grace:g} s is more than the {max_grace:g} s allowed"
    if handoff is not None:
        handoff += "; hand long streams off to another replica instead (resumable streams, docs/resume.md)"
    timeout = None
    if grace is not None and math.isfinite(longest):
        # Whole seconds, rounded up: fed back, the timeout covers the longest request exactly as
        # the server computes it (a hair under it in floating point would leave it at risk).
        # Refusing, the drain still lasts the propagation wait at least.
        need = wait + 2 * longest if admit else max(wait, longest)
        timeout = float(math.ceil(need))
        rule = f"propagation wait {wait:g} s + 2 x {longest:g} s" if admit else f"{need:g} s"
        reasons["grace_period"] = f"covers the longest request seen (up to {longest:g} s): {rule} + reserve" + (
            "" if reserve is not None else " (the default rule)"
        )
        reasons["drain_timeout"] = f"a drain needs {rule}; leave it unset or at least this"
    return Advice(
        evidence=evidence,
        percentiles=percentiles,
        budget=budget,
        admit=admit,
        covered=covered,
        at_risk=at_risk,
        longest=longest,
        grace_period=grace,
        propagation_wait=wait,
        propagation_quiet=quiet,
        drain_timeout=timeout,
        refuse_grace_period=refuse_grace,
        reasons=reasons,
        handoff=handoff,
        admitting=admitting(evidence.histograms, budget.propagation_wait, budget.limit) if admit else None,
    )


def _covers(grace: float, wait: float, reserve: float | None, longest: float, *, admit: bool) -> bool:
    res = default_reserve(grace) if reserve is None else reserve
    if res >= grace or wait > grace - res:
        return False
    budget = Budget(grace_period=grace, reserve=res, drain_timeout=None, propagation_wait=wait)
    return budget.longest_covered(admit=admit) >= longest


def _shortest_grace(longest: float, wait: float, reserve: float | None, *, admit: bool) -> float | None:
    """The shortest whole number of seconds whose budget covers ``longest``; None when none does."""
    if not math.isfinite(longest) or not _covers(_LONGEST_GRACE, wait, reserve, longest, admit=admit):
        return None
    low, high = 1, _LONGEST_GRACE  # what a grace period leaves the drain grows with it: bisect
    while low < high:
        middle = (low + high) // 2
        if _covers(middle, wait, reserve, longest, admit=admit):
            high = middle
        else:
            low = middle + 1
    return float(low)


@dataclass(frozen=True)
class Admitting:
    """The requests seen, as if each had arrived during the propagation wait (``wait`` seconds, ``limit``
    seconds from the drain's start to its deadline), at an instant spread evenly over it: how many
    ``admission="fits"`` would refuse (``refused``: its estimate reads a bucket's upper bound, so at most
    this many) and how many ``admission="all"`` would admit for the deadline to cut (``cut``: a bucket's
    lower bound, so at least this many). Expected counts, not whole numbers."""

    wait: float
    limit: float
    requests: int
    refused: float
    cut: float

    def as_dict(self) -> dict[str, object]:
        return {
            "wait": self.wait,
            "limit": self.limit,
            "requests": self.requests,
            "refused_with_fits": round(self.refused, 3),
            "cut_with_all": round(self.cut, 3),
        }


def admitting(histograms: Mapping[str, Histogram], wait: float, limit: float) -> Admitting | None:
    """Judge the requests seen as arrivals during the propagation wait (``Admitting``); None without a wait.

    A request of ``d`` seconds arriving ``t`` seconds into the drain outruns the deadline when
    ``t + d > limit``; with ``t`` even over ``[0, wait)``, its chance is ``(d + wait - limit) / wait``,
    clamped to 0..1.
    """
    if wait <= 0:
        return None
    merged = merge_all(histograms.values()) or Histogram.empty()

    def chance(duration: float) -> float:
        return min(1.0, max(0.0, (duration + wait - limit) / wait))

    refused = cut = 0.0
    lower = 0.0
    for upper, count in zip([*merged.bounds, math.inf], merged.counts):
        if count:
            refused += count * chance(upper)
            cut += count * chance(lower)
        lower = upper
    return Admitting(wait, limit, merged.count, refused, cut)


@dataclass(frozen=True)
class Outlook:
    """The work in flight at a drain's start, judged by the durations seen: how many may outlast
    the ``left`` seconds to the deadline, how many are expected to (the sum of their chances), and
    how many have run longer than every request seen of their kind (``older``: nothing to judge
    them by, so no forecast either way)."""

    in_flight: int
    left: float
    at_risk: int
    expected: float
    seen: int
    older: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "in_flight": self.in_flight,
            "left": round(self.left, 3),
            "at_risk": self.at_risk,
            "expected": round(self.expected, 3),
            "seen": self.seen,
            "older": self.older,
        }


def outlook(ages: Sequence[tuple[float, bool]], histograms: Mapping[str, Histogram], left: float) -> Outlook:
    """Judge each item in flight (its age, whether it has streamed) by ``histograms`` (by kind): one
    that has streamed by the streams seen, any other by everything seen.

    An item that has run ``a`` seconds is judged by the requests seen that ran longer than ``a``:
    its chance of running past the deadline is the share of them that also ran longer than ``a``
    plus the time left. When none ran longer than ``a``, the durations seen say nothing of it: it
    counts as older than every request seen, not as at risk (a stream a little older than the rest
    is no sign of a cut, issue 51).
    """
    merged = merge_all(histograms.values()) or Histogram.empty()
    if merged.count == 0:  # nothing to judge by
        return Outlook(len(ages), left, 0, 0.0, 0)
    stream = histograms.get("stream")
    streams = stream if stream is not None and stream.count else merged
    at_risk, expected, older = 0, 0.0, 0
    for age, streamed in ages:
        judged = streams if streamed else merged
        if not judged.over(age):
            older += 1
            continue
        chance = judged.still_running(age, left)
        if chance > 0:
            at_risk += 1
            expected += chance
    return Outlook(len(ages), left, at_risk, expected, merged.count, older)
