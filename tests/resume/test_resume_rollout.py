"""The rollout demo's ``long-streams-handoff`` scenario at ``--quick`` size: streams outlive the grace period and go on.

1. two replicas under ``graceful run`` with ``GRACEFUL_HANDOFF_STREAMS=1`` behind HAProxy; soak
   clients send through the resuming transport (``graceful soak --resume``), streams 1.5 x the
   grace period;
2. one rolling update: each old replica's preStop drain hands its streams off once the
   propagation wait is over, and the clients continue them on the replicas that stay;
3. the promise: no stream ends ``ended_by_server``, ``truncated`` or ``token_mismatch``, every
   stream of an old replica ends ``resumed``, and the median old replica exits within the
   propagation wait + 5 s instead of at the drain deadline.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace

import pytest

from examples.rollout.report import HANDOFF_EXIT_SLACK, expectations, render, side_summary
from examples.rollout.scenarios import Options, run_side

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


def test_the_scenario_is_long_streams_with_handoff_and_resume() -> None:
    long = Options.resolve(scenario="long-streams", quick=True)
    handoff = Options.resolve(scenario="long-streams-handoff", quick=True)
    assert handoff.stream_tokens == long.stream_tokens and handoff.longest_stream > handoff.grace_period
    assert (handoff.handoff_streams, handoff.resume) == (True, True)
    assert (long.handoff_streams, long.resume) == (False, False)
    assert handoff.settings("graceful", "/tmp").environment("x", "/tmp")["GRACEFUL_HANDOFF_STREAMS"] == "1"
    assert "GRACEFUL_HANDOFF_STREAMS" not in long.settings("graceful", "/tmp").environment("x", "/tmp")
    assert all(config.resume for config in handoff.traffic("http://127.0.0.1:9"))
    full = Options.resolve(scenario="long-streams-handoff")
    assert {config.max_resumes for config in full.traffic("http://127.0.0.1:9")} == {full.replicas * full.updates}


async def test_quick_long_streams_handoff_keeps_its_promise() -> None:
    options = Options.resolve(scenario="long-streams-handoff", quick=True, seed=7)
    with tempfile.TemporaryDirectory(prefix="g-logs-") as logs:
        side = await run_side("graceful", options, log_dir=logs, log=lambda line: None)
    summary = side_summary(side, options)
    reasons = summary["by_reason"]
    for reason in ("ended_by_server", "truncated", "token_mismatch", "ambiguous", "timeout", "http_error"):
        assert reasons[reason] == 0, (reason, summary)
    old = {t.name for t in side.terminations}
    streams = [r for r in side.report.records if r.cls == "stream" and r.served_by in old]
    assert streams and all(r.reason == "resumed" and r.tokens == r.expected_tokens for r in streams)
    assert summary["duplicates"] == 0 and summary["sigkills"] == 0
    assert summary["deletions"] == options.replicas * options.updates
    assert summary["exit_median"] <= options.propagation_wait + HANDOFF_EXIT_SLACK
    assert expectations(summary, options) == []

    # The table: the scenario beside long-streams (here the same run relabelled), resume rows shown.
    compare = side_summary(replace(side, handoff_streams=False), options)
    table = render(compare, summary, options)
    assert any(line.split() == ["long-streams", "long-streams-handoff"] for line in table.splitlines())
    assert any(line.split()[:1] == ["resumed"] for line in table.splitlines())
    assert "baseline:" not in table

    # The promise can fail: a late exit, a stream ended by the server, a wrong continuation.
    late = {**summary, "exit_median": options.propagation_wait + HANDOFF_EXIT_SLACK + 0.1}
    assert [b for b in expectations(late, options) if b.startswith("old-replica exit median")]
    cut = {**summary, "by_reason": {**reasons, "ended_by_server": 1, "token_mismatch": 2}}
    assert {"ended_by_server=1", "token_mismatch=2"} <= set(expectations(cut, options))
