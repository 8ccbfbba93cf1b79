"""The short-grace scenario (issue 54): a budget shorter than the propagation wait plus the longest stream.

A spot node or a low ``terminationGracePeriodSeconds`` leaves the drain less time than a request admitted
late in the propagation wait needs. Two kinds of client send OpenAI bodies with ``max_tokens``: ones that
retry a not-started 503 (the OpenAI SDK's two retries) but do not resume a stream, and strict ones that
never retry. The same rollout runs with the graceful side's ``admission`` set to ``all`` and to ``fits``,
and this module counts, per client kind: the answers lost at a drain's deadline, the refusals and the
retries; and of the requests that reached a draining replica during its propagation wait, those refused
that would have finished there.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from graceful._soak._report import Attempt, RequestRecord

if TYPE_CHECKING:
    from .scenarios import SideResult

__all__ = ["KINDS", "RETRYING", "STRICT", "Counts", "broken", "count", "render_kinds", "sides"]

RETRYING, STRICT = "retrying", "strict"
KINDS = (RETRYING, STRICT)
# What a request that did not end ok and was not refused lost: its answer, at a drain's deadline.
_LOST = ("ended_by_server", "truncated", "ambiguous", "http_error", "timeout", "token_mismatch")
# The promise: extra refusals under fits stay below this share of the requests that reached a draining
# replica during its propagation wait. Below 1 / EXTRA_SHARE arrivals (the quick run's waits see about 15)
# a single refusal already passes the share: one is the sample's resolution, so there the limit reads as
# one at most. Admission judges by the slow end of the pace it saw (HIGH), this count by the median
# answer, so a stream near the deadline can land on either side of it.
EXTRA_SHARE = 0.05
EXTRA_FLOOR = 1
# A deadline's cut reaches the client this long after the deadline at most (unwind_timeout and the network).
_CUT_SLACK = 3.0


@dataclass
class Counts:
    """One side's figures: per client kind, and for the drains as a whole."""

    requests: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    lost: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # answers lost at a deadline
    other_losses: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    refusals: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # not-started 503 attempts
    retries: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    refused_in_the_end: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    arrived: int = 0  # attempts that reached a draining replica during its propagation wait
    refused_in_wait: int = 0  # of them, refused
    extra: int = 0  # of those, the ones that would have finished before the deadline

    def as_dict(self) -> dict[str, Any]:
        kinds = {
            kind: {
                "requests": self.requests[kind],
                "lost_at_deadline": self.lost[kind],
                "other_losses": self.other_losses[kind],
                "refusals": self.refusals[kind],
                "retries": self.retries[kind],
                "refused_in_the_end": self.refused_in_the_end[kind],
            }
            for kind in KINDS
        }
        return {
            "kinds": kinds,
            "arrived_in_wait": self.arrived,
            "refused_in_wait": self.refused_in_wait,
            "extra_refusals": self.extra,
        }


@dataclass(frozen=True)
class _Window:
    """One old replica's drain, on the wall clock: its start, the end of its propagation wait, its deadline."""

    name: str
    start: float
    wait_end: float
    deadline: float


def _windows(side: SideResult) -> list[_Window]:
    windows = []
    for t in side.terminations:
        if t.drain_start is None:
            continue
        start = t.wall_t0 + t.drain_start
        wait_end = t.wall_t0 + (t.propagation_end if t.propagation_end is not None else t.drain_start)
        windows.append(_Window(t.name, start, wait_end, start + side.budget_limit))
    return windows


def _durations(records: Iterable[RequestRecord]) -> dict[tuple[str, int], float]:
    """How long an answer of each class and length took where it was answered at once (the median)."""
    seen: dict[tuple[str, int], list[float]] = defaultdict(list)
    for record in records:
        if record.reason == "ok" and len(record.history) == 1:
            attempt = record.history[0]
            seen[(record.cls, record.expected_tokens)].append(attempt.end - attempt.start)
    return {key: statistics.median(values) for key, values in seen.items()}


def count(side: SideResult) -> Counts:
    """The side's figures (``side.client_kinds`` names each request's client kind)."""
    counts = Counts()
    windows = _windows(side)
    records = side.report.records
    durations = _durations(records)
    for record in records:
        kind = side.client_kinds.get(record.request_id, STRICT)
        counts.requests[kind] += 1
        counts.refusals[kind] += sum(1 for a in record.history if a.reason == "rejected_retryable")
        counts.retries[kind] += len(record.history) - 1
        last = record.history[-1] if record.history else None
        if record.reason == "rejected_retryable":
            counts.refused_in_the_end[kind] += 1
        elif record.reason in _LOST and last is not None:
            at_deadline = any(w.deadline - 1.0 <= last.end <= w.deadline + _CUT_SLACK for w in windows)
            (counts.lost if at_deadline else counts.other_losses)[kind] += 1
        for attempt in record.history:
            window = _arrived_in_wait(attempt, windows)
            if window is None:
                continue
            counts.arrived += 1
            if attempt.reason == "rejected_retryable":
                counts.refused_in_wait += 1
                took = durations.get((record.cls, record.expected_tokens))
                if took is not None and attempt.start + took <= window.deadline:
                    counts.extra += 1
    return counts


def _arrived_in_wait(attempt: Attempt, windows: list[_Window]) -> _Window | None:
    """The drain whose replica this attempt reached during its propagation wait: answered by it, or refused
    (only a draining replica refuses here; a refusal names no replica); None for any other attempt."""
    for window in windows:
        if not window.start <= attempt.start < window.wait_end:
            continue
        if attempt.served_by == window.name or (attempt.reason == "rejected_retryable" and attempt.served_by is None):
            return window
    return None


def broken(fits: Counts) -> list[str]:
    """What admission fits promised and did not keep: no answer of a retrying client lost at a deadline, and
    extra refusals below ``EXTRA_SHARE`` of the requests that reached a draining replica during its wait
    (``EXTRA_FLOOR`` at most where the sample is too small for the share to allow one)."""
    problems = []
    if fits.lost[RETRYING]:
        problems.append(f"retrying clients lost {fits.lost[RETRYING]} answer(s) at a deadline with admission fits")
    if fits.extra > EXTRA_FLOOR and fits.extra >= EXTRA_SHARE * fits.arrived:
        problems.append(
            f"{fits.extra} refusal(s) of {fits.arrived} arrivals during the waits would have finished "
            f"(limit: under {EXTRA_SHARE:.0%}, or {EXTRA_FLOOR} below {round(1 / EXTRA_SHARE)} arrivals)"
        )
    return problems


def render_kinds(sides: list[tuple[str, Counts]]) -> list[str]:
    """The per-kind table: one column per side (``admission all``, ``admission fits``)."""
    rows: list[tuple[str, ...]] = [("", *(label for label, _ in sides))]
    for kind, title in ((RETRYING, "clients that retry not-started 503s"), (STRICT, "strict clients (no retry)")):
        rows.append((title, *(str(c.requests[kind]) for _, c in sides)))
        rows.append(("  answers lost at a deadline", *(str(c.lost[kind]) for _, c in sides)))
        rows.append(("  refusals (not-started 503s)", *(str(c.refusals[kind]) for _, c in sides)))
        if kind == RETRYING:
            rows.append(("  retries", *(str(c.retries[kind]) for _, c in sides)))
            rows.append(("  refused after every retry", *(str(c.refused_in_the_end[kind]) for _, c in sides)))
        rows.append(("  other failures", *(str(c.other_losses[kind]) for _, c in sides)))
    rows.append(("arrived at a draining replica in its wait", *(str(c.arrived) for _, c in sides)))
    rows.append(("  refused", *(str(c.refused_in_wait) for _, c in sides)))
    rows.append(
        (
            "  refused that would have finished",
            *(f"{c.extra} ({c.extra / max(1, c.arrived):.1%})" for _, c in sides),
        )
    )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)) for r in rows]


def sides(first: SideResult | None, second: SideResult) -> list[tuple[str, Counts]]:
    """Each side's column label and figures, in order."""
    return [(_label(side), count(side)) for side in (first, second) if side is not None]


def _label(side: SideResult) -> str:
    """A column's name: the baseline, or the graceful side's admission mode (graceful's default when unset)."""
    return "baseline" if side.kind == "baseline" else f"admission {side.admission or 'fits'}"
