"""The rollout demo behind a real LiteLLM proxy (``--gateway litellm``): its options, and its promise with handoff.

The quick run needs the proxy of ``bash scripts/setup-litellm`` (``.litellm/venv``); the option
checks do not.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from examples.rollout import litellm
from examples.rollout.cli import rollout_command
from examples.rollout.drains import HANDOFF_EXIT_SLACK, late_exits
from examples.rollout.node import missing_node
from examples.rollout.scenarios import Options
from graceful import ConfigError
from tests.utils import ROOT

DEMO_LIMIT = 150.0  # the quick run takes about 35 s on two cores


@pytest.fixture
def some_litellm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Options check for LiteLLM's Python only: any executable will do."""
    monkeypatch.setattr(litellm, "PYTHON", sys.executable)


def test_a_missing_litellm_is_a_usage_error_naming_the_set_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(litellm, "PYTHON", "/nonexistent/.litellm/venv/bin/python")
    with pytest.raises(
        ConfigError, match="no LiteLLM at /nonexistent/.litellm/venv/bin/python; run bash scripts/setup"
    ):
        Options.resolve(gateway="litellm")
    result = CliRunner().invoke(rollout_command, ["--gateway", "litellm", "--quick"])
    assert result.exit_code == 2 and "bash scripts/setup-litellm" in result.output
    assert "Traceback" not in result.output


@pytest.mark.usefixtures("some_litellm")
def test_the_gateway_runs_the_example_servers_default_and_strict_clients() -> None:
    for args, expected in (
        (["--vllm"], "drop --vllm"),
        (["--scenario", "node-loss"], "use --scenario default or strict-clients with --gateway"),
    ):
        result = CliRunner().invoke(rollout_command, ["--gateway", "litellm", *args])
        assert result.exit_code == 2 and expected in result.output, result.output


@pytest.mark.usefixtures("some_litellm")
def test_behind_the_gateway_clients_read_raw_streams_of_up_to_30_s() -> None:
    """30 s streams (15 s with --quick, past its 10 s grace period), sent without graceful's transport, with
    the proxy's key, for the example model, their count checked; handoff without a gateway resumes in the client."""
    full = Options.resolve(gateway="litellm", handoff_streams=True, scenario="strict-clients")
    quick = Options.resolve(gateway="litellm", handoff_streams=True, quick=True)
    assert (full.longest_stream, quick.longest_stream) == (30.0, 15.0)
    assert quick.longest_stream > quick.grace_period
    assert not full.resume and full.retry == "none" and full.node_streams == 4
    configs = full.traffic("http://127.0.0.1:1", {"authorization": "Bearer k"})
    assert all(not c.resume and c.check_count and c.model == "graceful-example" for c in configs)
    assert all(c.headers == {"authorization": "Bearer k"} for c in configs)
    assert max(c.tokens("stream") for c in configs) == 300
    assert Options.resolve(handoff_streams=True, quick=True).resume  # no gateway: the clients resume


def test_the_promise_is_each_old_replicas_exit_after_its_drains_start() -> None:
    options = Options.resolve(quick=True, handoff_streams=True)
    bound = options.propagation_wait + HANDOFF_EXIT_SLACK

    def drains(*apart: float | None, handed: int = 3) -> dict[str, object]:
        rows = [{"replica": f"r{i}", "drain_to_exit": a, "handed_off": handed} for i, a in enumerate(apart)]
        return {"drains": rows}

    assert late_exits(drains(1.0, bound), options) == []
    assert late_exits(drains(1.0, bound + 0.1, None), options) == [
        f"r1, r2 exited more than {bound:g} s after the drain's start (propagation wait + 5 s)"
    ]
    assert late_exits(drains(1.0, handed=0), options) == ["handed_off=0 (no drain handed a stream off)"]


@pytest.mark.timeout(DEMO_LIMIT + 40)
@pytest.mark.skipif(not Path(litellm.PYTHON).exists(), reason="no LiteLLM at .litellm/venv: bash scripts/setup-litellm")
def test_quick_rollout_behind_litellm_hands_streams_off_and_loses_nothing(tmp_path: Path) -> None:
    """1. two replicas behind HAProxy, a LiteLLM proxy in front, its deployment opted in to resume
    2. strict clients stream through the proxy (15 s streams, raw SSE without graceful's transport, and
       Node openai SDK callers where node is installed), and Responses callers on its /v1/responses (the Node
       SDK's responses.create and responses.stream, curl -N)  3. one rolling update: each old replica drains
       with --handoff-streams and hands its streams off after the 1 s propagation wait
    4. the proxy continues them on the new replicas: 0 failed, every count whole, and each old replica
       exited within the propagation wait + 5 s of its drain's start"""
    report = tmp_path / "report.json"
    argv = [
        sys.executable, "-m", "examples.rollout", "--quick", "--gateway", "litellm", "--handoff-streams",
        "--scenario", "strict-clients", "--skip-baseline", "--seed", "5", "--report", str(report),
    ]  # fmt: skip
    demo = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = demo.communicate(timeout=DEMO_LIMIT)
    except subprocess.TimeoutExpired:
        demo.send_signal(signal.SIGINT)  # the demo stops every replica, the balancer and the proxy
        out, _ = demo.communicate(timeout=30)
        pytest.fail(f"the quick demo took more than {DEMO_LIMIT:g} s:\n{out[-4000:]}")
    assert demo.returncode == 0, out[-4000:]
    document = json.loads(report.read_text())
    graceful = document["graceful"]
    assert document["broken"] == [] and graceful["kind"] == "graceful, handoff"
    # More requests than the quick run's 6 clients (one each would be a demo that never got going): how many
    # more is the machine's throughput, not the software's (28 in a CI run beside the vLLM tier, 50 and more alone).
    assert graceful["gateway"].startswith("LiteLLM ") and graceful["requests"] > 6
    assert {reason for reason, count in graceful["by_reason"].items() if count} == {"ok"}, graceful["by_reason"]
    bound = 1.0 + HANDOFF_EXIT_SLACK
    assert len(graceful["drains"]) == 2
    assert all(row["drain_to_exit"] <= bound for row in graceful["drains"]), graceful["drains"]
    assert sum(row["handed_off"] for row in graceful["drains"]) > 0
    if missing_node() is None:
        assert graceful["node_streams"] > 0 and graceful["node_failed"] == 0
    else:
        assert any("no Node SDK callers" in note for note in graceful["notes"])
    # Responses callers on LiteLLM's native /v1/responses path (the Node SDK's create and stream, curl -N)
    assert graceful["responses_streams"] >= 3 and graceful["responses_failed"] == 0, graceful
    assert "Responses streams (Node SDK, curl), failed" in out
    assert "drain start to exit" in out
