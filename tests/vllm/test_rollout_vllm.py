"""The rollout demo with real vLLM replicas: ``python -m examples.rollout --vllm --quick``.

Both sides run ``vllm serve`` with the model the vLLM tests make (tests/vllm/conftest.py's
cache, which the demo shares); the graceful side loads ``graceful.GracefulMiddleware`` and
runs the preStop ``graceful drain``. Skipped without a vLLM, as every test here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.utils import ROOT
from tests.vllm.conftest import VLLM

# Four vLLM starts (25 to 90 s each on two cores) and two rollouts: about 3 minutes here.
LIMIT = 720.0
pytestmark = [pytest.mark.timeout(LIMIT + 120), pytest.mark.vllm_late]


def run_demo(tmp_path: Path, *args: str) -> tuple[str, dict[str, Any]]:
    """The demo with --vllm --quick and ``args``: its output and its JSON report; it must exit 0."""
    report = tmp_path / "report.json"
    env = {**os.environ, "GRACEFUL_VLLM": VLLM}
    # A 60 s grace period in place of --quick's 30 s (reserve 5 s): the old replica's drain waits
    # for a 1024-token stream and the one more request of its pinned connection, beside the new
    # replica's engine on the same core. That took up to 18.7 s idle, and past the 25 s deadline
    # beside stress-ng --cpu 4 (docs/testing.md, "Under load"). An idle drain ends when its streams do.
    budget = ("--grace-period", "60s")
    argv = [sys.executable, "-m", "examples.rollout", "--vllm", "--quick", *budget, "--report", str(report), *args]
    with open(tmp_path / "demo.log", "wb") as log:
        demo = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = demo.wait(LIMIT)
        except subprocess.TimeoutExpired:
            # Ctrl-C: the demo stops every replica and the balancer before it exits.
            demo.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                demo.wait(60)
            demo.kill()
            demo.wait()
            raise AssertionError(f"the demo ran past {LIMIT:g}s:\n{(tmp_path / 'demo.log').read_text()[-4000:]}")
    output = (tmp_path / "demo.log").read_text()
    assert code == 0, output[-4000:]
    result: dict[str, Any] = json.loads(report.read_text())
    return output, result


def test_quick_rollout_with_vllm_replicas_keeps_the_promise(model_dir: str, tmp_path: Path) -> None:
    """1. the quick demo with --vllm: baseline (plain vllm serve, no preStop) then graceful
       (vllm serve --middleware graceful.GracefulMiddleware, preStop graceful drain), same traffic
    2. it exits 0: the graceful side kept its promise
    3. the graceful side: streams and short requests served, no ambiguous, truncated, timed-out or
       failed request, every answer of the length asked for, the drain ended "drained", no SIGKILL
    4. the baseline ran through the same rollout"""
    output, result = run_demo(tmp_path, "--seed", "3")
    assert "graceful: kept its promise for default." in output
    assert model_dir in output  # the demo served the tests' model, made once
    grace, base = result["graceful"], result["baseline"]
    assert result["broken"] == []
    assert grace["requests"] > 50 and grace["streams"] > 0 and grace["by_reason"]["ok"] > 0
    for reason in ("ambiguous", "truncated", "timeout", "http_error"):
        assert grace["by_reason"][reason] == 0, (reason, grace)
    assert grace["duplicates"] == 0 and grace["sigkills"] == 0
    assert grace["deletions"] == 1 and grace["prestop_codes"] == [0]
    assert grace["exit_max"] < grace["grace_period"]
    assert base["deletions"] == 1 and base["prestop_codes"] == [] and base["requests"] > 0


def test_strict_clients_inside_vllm_lose_nothing_with_the_defaults(model_dir: str, tmp_path: Path) -> None:
    """1. the quick demo with --vllm, --scenario strict-clients (no client retries), graceful's
       defaults (admitting during the propagation wait), the graceful side alone
    2. it exits 0, and not one request failed: not even an explicit not-started 503, as a request
       on a connection busy at the drain's start is served after the wait, and the requests such
       clients send as their streams end are read before vLLM closes their connections"""
    output, result = run_demo(tmp_path, "--scenario", "strict-clients", "--skip-baseline", "--seed", "5")
    assert "graceful: kept its promise for strict-clients." in output
    grace = result["graceful"]
    assert result["broken"] == []
    assert grace["requests"] > 50 and grace["streams"] > 0
    failed = {reason: count for reason, count in grace["by_reason"].items() if reason != "ok" and count}
    assert failed == {}, grace
    assert grace["deletions"] == 1 and grace["prestop_codes"] == [0] and grace["sigkills"] == 0
