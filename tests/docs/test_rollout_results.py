"""docs/rollout-results.md: every command line of the measured runs is one the demo takes.

The page's figures are measurements of runs of minutes each (records, not examples to reproduce).
Each block is a file that bash runs here with stand-ins for ``python`` (tests/docs/recorded.py); each
``python -m examples.rollout`` line it starts is handed to the demo's own command, which parses and
resolves it, so a renamed flag, scenario or balancer, or a combination the demo refuses, fails here.
The demo's ``--quick`` run itself is tests/test_rollout.py's (``test_quick_rollout_graceful_loses_nothing``);
the balancers' configurations are run by tests/test_gateway.py and tests/test_envoy.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.recorded import check_started, recorded

pytestmark = pytest.mark.timeout(60)

# Each file and the runs it starts: the rows of the page's tables come from these runs.
RUNS = {
    "docs_src/rollout-results/strict_clients_quick.sh": 7,  # 3 admitting, 2 L7 refusing without and with retry
    "docs_src/rollout-results/full_size.sh": 3,
    "docs_src/rollout-results/long_streams.console": 2,
    "docs_src/rollout-results/envoy.sh": 8,  # 2 seeds x (3 retry policies admitting + refusing with the retry)
    "docs_src/rollout-results/envoy_announce.sh": 6,  # 2 seeds x (the header, none, none with a 12 s wait)
    "docs_src/rollout-results/litellm.sh": 2,
    "docs_src/rollout-results/vllm.sh": 5,
    "docs_src/rollout-results/short_grace.sh": 2,  # issue 54: HAProxy, then nginx retrying not-started 503s
}


@pytest.mark.parametrize("path", sorted(RUNS))
def test_each_command_line_is_one_the_demo_takes(path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = recorded(path, tmp_path)
    assert [name for name, _ in started] == ["python"] * RUNS[path], started
    check_started(started, monkeypatch)


def test_a_renamed_flag_or_scenario_fails_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: a flag the demo does not have, a scenario it does not know, and a
    combination it refuses (the gateway's retry behind an L4 balancer)."""
    for line in (
        "python -m examples.rollout --quick --balancer nginx --gateway-retries",
        "python -m examples.rollout --scenario strict-client",
        "python -m examples.rollout --balancer haproxy --gateway-retry",
    ):
        script = tmp_path / "docs_src" / "page" / "wrong.sh"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(line + "\n")
        started = recorded(str(script), tmp_path / "scratch")
        with pytest.raises(AssertionError):
            check_started(started, monkeypatch)
