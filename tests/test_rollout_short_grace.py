"""The rollout demo's short-grace scenario (issue 54): its sizes, how it counts each client kind, and a
reduced run through HAProxy with admission all and fits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from examples.rollout.balancer import find_haproxy
from examples.rollout.scenarios import Options, SideResult
from examples.rollout.short_grace import RETRYING, STRICT, Counts, broken, count
from examples.rollout.timeline import Termination
from graceful._soak._report import Attempt, RequestRecord, SoakReport
from tests.utils import ROOT


@pytest.mark.parametrize("quick", [False, True])
def test_the_budget_holds_a_stream_in_flight_but_not_one_admitted_late_in_the_wait(quick: bool) -> None:
    options = Options.resolve(scenario="short-grace", quick=quick)
    limit = options.grace_period - (options.reserve or 0.0)
    assert options.longest_stream <= limit < options.propagation_wait + options.longest_stream
    # The balancer keeps sending for most of the wait; drains do not overlap.
    assert options.lb_delay < options.propagation_wait and options.step_pause > limit
    assert options.admission is None and options.admit_during_propagation  # the columns set it: all, then fits
    kinds = [kind for kind, _ in options.client_traffic("http://127.0.0.1:1")]
    assert set(kinds) == {RETRYING, STRICT}
    retrying = [c for kind, c in options.client_traffic("http://127.0.0.1:1") if kind == RETRYING]
    assert {c.retry for c in retrying} == {"sdk"} and not any(c.resume for c in retrying)
    # What the user sets wins.
    assert Options.resolve(scenario="short-grace", grace_period=40.0).grace_period == 40.0


def attempt(start: float, reason: str, served_by: str | None = "old", end: float | None = None) -> Attempt:
    return Attempt(reason=reason, start=start, end=start + 1.0 if end is None else end, served_by=served_by)


def record(rid: str, tokens: int, *history: Attempt) -> RequestRecord:
    last = history[-1]
    return RequestRecord(
        rid, f"k-{rid}", "stream", tokens, history[0].start, last.end, last.reason, history=list(history)
    )


def side(records: list[RequestRecord], kinds: dict[str, str]) -> SideResult:
    """One drain of the replica "old": T0 at 1000 s, drain from 1000.1, wait to 1012, deadline 1028.1."""
    termination = Termination("old", 0.0, drain_start=0.1, propagation_end=12.0, wall_t0=1000.0)
    report = SoakReport("http://x", 990.0, 60.0, records, {})
    return SideResult("graceful", "haproxy", report, [termination], 28.0, 0, client_kinds=kinds)


def test_each_kind_is_counted_and_a_refusal_that_would_have_finished_is_extra() -> None:
    records = [
        # A long stream answered at once elsewhere: 24 s is how long 240 tokens take.
        record("a", 240, attempt(900.0, "ok", "new", end=924.0)),
        # Retrying: refused at 1005 s (would have ended at 1029: past the deadline), then served elsewhere.
        record("b", 240, attempt(1005.0, "rejected_retryable", None), attempt(1006.0, "ok", "new", end=1030.0)),
        # Retrying: refused at 1003 s, which would have finished at 1027 s: an extra refusal.
        record("c", 240, attempt(1003.0, "rejected_retryable", None), attempt(1004.0, "ok", "new", end=1028.0)),
        # Strict: admitted at 1006 s and cut at the deadline.
        record("d", 240, attempt(1006.0, "ended_by_server", "old", end=1028.3)),
        # Strict: refused and not retried; and a short request served by the draining replica in its wait.
        record("e", 240, attempt(1010.0, "rejected_retryable", None)),
        record("f", 10, attempt(1002.0, "ok", "old", end=1003.0)),
        # After the wait: refused as server_draining (not counted as a refusal of the wait).
        record("g", 10, attempt(1013.0, "rejected_retryable", None)),
    ]
    kinds = {"a": RETRYING, "b": RETRYING, "c": RETRYING, "d": STRICT, "e": STRICT, "f": STRICT, "g": STRICT}
    counts = count(side(records, kinds))
    assert (counts.requests[RETRYING], counts.requests[STRICT]) == (3, 4)
    assert (counts.lost[RETRYING], counts.lost[STRICT]) == (0, 1)
    assert (counts.refusals[RETRYING], counts.refusals[STRICT]) == (2, 2)
    assert (counts.retries[RETRYING], counts.refused_in_the_end[STRICT]) == (2, 2)
    assert (counts.arrived, counts.refused_in_wait, counts.extra) == (5, 3, 1)
    assert broken(counts) == []  # one extra refusal is the resolution of 5 arrivals
    assert counts.as_dict()["kinds"][STRICT]["lost_at_deadline"] == 1
    # Retrying: refused at 1004 s, which would have finished at 1028 s: a second extra refusal.
    records.append(record("h", 240, attempt(1004.0, "rejected_retryable", None), attempt(1005.0, "ok", "new")))
    counts = count(side(records, {**kinds, "h": RETRYING}))
    assert (counts.arrived, counts.extra) == (6, 2)
    assert broken(counts) == [
        "2 refusal(s) of 6 arrivals during the waits would have finished (limit: under 5%, or 1 below 20 arrivals)"
    ]


@pytest.mark.parametrize(
    ("arrived", "extra", "kept"),
    [(0, 0, True), (15, 1, True), (15, 2, False), (38, 1, True), (38, 2, False), (100, 4, True), (100, 5, False)],
)
def test_extra_refusals_stay_under_the_share_or_one_in_a_small_sample(arrived: int, extra: int, kept: bool) -> None:
    counts = Counts(arrived=arrived, refused_in_wait=extra, extra=extra)
    assert (broken(counts) == []) is kept


@pytest.mark.servers
@pytest.mark.skipif(find_haproxy() is None, reason="haproxy is not installed")
def test_quick_short_grace_through_haproxy(tmp_path: Path) -> None:
    """1. the quick short-grace rollout runs twice behind HAProxy, admission all then fits 2. with fits no
    retrying client loses an answer at a deadline, and the refusals that would have finished stay under 5%
    (one at most in a sample under 20: ``broken``)."""
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "examples.rollout", "--scenario", "short-grace", "--quick", "--balancer", "haproxy",
         "--report", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    kinds = json.loads(report.read_text())["kinds"]
    assert list(kinds) == ["admission all", "admission fits"]
    fits = kinds["admission fits"]
    assert fits["kinds"][RETRYING]["lost_at_deadline"] == 0
    assert fits["extra_refusals"] <= fits["refused_in_wait"] <= fits["arrived_in_wait"]
    assert "Per client kind" in done.stdout and "answers lost at a deadline" in done.stdout
