"""The rollout demo judges its own traffic with ``graceful advise``, and its numbers hold.

1. ``--quick`` with a grace period of 6 s (2 s reserve, 1 s propagation wait): admitting during
   the wait, requests of up to 1.5 s are covered, and the 3 s streams are not. The advice, from
   the old replicas' own statuses, says so and names a grace period;
2. the same traffic again with the recommended grace period, propagation wait and quiet rule:
   no request fails, none is ended by the deadline, and the advice finds nothing at risk.
"""

from __future__ import annotations

import tempfile
from typing import Any

import pytest

from examples.rollout.advice import advise
from examples.rollout.scenarios import Options, run_side

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


async def run(**given: Any) -> tuple[Any, list[str], dict[str, Any]]:
    options = Options.resolve(quick=True, seed=3, **given)
    with tempfile.TemporaryDirectory(prefix="g-logs-") as logs:
        side = await run_side("graceful", options, log_dir=logs, log=lambda line: None)
        lines, advice = advise(side, options, logs)
    assert advice is not None, lines
    return side, lines, advice


async def test_the_demos_advice_names_numbers_under_which_its_next_run_cuts_nothing() -> None:
    short, lines, advice = await run(grace_period=6.0)
    assert advice["source"] == "2 workers" and advice["requests"] > 20, advice
    assert advice["in_force"]["grace_period"] == 6 and advice["in_force"]["covers"] == 1.5
    assert advice["at_risk"]["stream"] > 0 and advice["verdict"] == "cuts", lines
    assert advice["percentiles"]["stream"]["max"] >= 3.0  # the 60-token streams at 20 tokens/s
    assert any(line.startswith("  terminationGracePeriodSeconds:") for line in lines), lines
    numbers = advice["recommended"]
    grace, wait, quiet = numbers["grace_period"], numbers["propagation_wait"], numbers["propagation_quiet"]
    assert grace > 6

    again, lines, advice = await run(grace_period=grace, propagation_wait=wait, propagation_quiet=quiet)
    records = again.report.records
    failed = [r for r in records if r.reason != "ok"]
    assert records and not failed, [(r.reason, r.cls) for r in failed]
    assert advice["at_risk"]["all"] == 0 and advice["verdict"] == "holds", lines
