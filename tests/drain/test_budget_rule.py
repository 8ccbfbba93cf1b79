"""The budget rule, one verdict everywhere (docs/middleware.md, "The budget rule").

A propagation wait longer than the drain's limit cannot work: the deadline would end every
request while the balancers may still send. The server (its options, at start-up), a drain's
overrides (through the admin socket) and the preStop hook (its flags) judge the same inputs
the same way: refused with one message, no drain begun.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from graceful import ConfigError, GracefulMiddleware, State
from graceful._cli._main import cli
from tests.apps.streaming import app

# (grace period, drain timeout, propagation wait, verdict). A 10 s grace period keeps a 5 s
# reserve (default_reserve): the drain's limit is 5 s, or the timeout where that is shorter.
CASES = [
    ("10", None, "5s", "taken"),  # the wait ends at the deadline: it fits exactly
    ("10", None, "8s", "refused"),
    ("60", "5s", "8s", "refused"),  # the timeout binds
    ("60", "10s", "8s", "taken"),
]


def server(grace: str, timeout: str | None, wait: str) -> GracefulMiddleware:
    options: dict[str, Any] = {"grace_period": grace, "propagation_wait": wait}
    if timeout is not None:
        options["drain_timeout"] = timeout
    return GracefulMiddleware(app, registry=CollectorRegistry(), admin=False, **options)


def hook(grace: str, timeout: str | None, wait: str, socket_dir: Path) -> Any:
    args = ["drain", "--socket-dir", str(socket_dir), "--grace-period", grace, "--propagation-wait", wait]
    return CliRunner().invoke(cli, args + (["--timeout", timeout] if timeout is not None else []))


@pytest.mark.parametrize(("grace", "timeout", "wait", "verdict"), CASES)
def test_the_server_judges_its_options(grace: str, timeout: str | None, wait: str, verdict: str) -> None:
    if verdict == "taken":
        assert server(grace, timeout, wait).drain.state is State.STARTING
        return
    with pytest.raises(ConfigError, match=f"propagation_wait {wait} is longer than the whole drain"):
        server(grace, timeout, wait)


@pytest.mark.parametrize(("grace", "timeout", "wait", "verdict"), CASES)
def test_the_prestop_hook_judges_its_flags_the_same(
    grace: str, timeout: str | None, wait: str, verdict: str, tmp_path: Path
) -> None:
    """Refused: exit 2 before it looks for a server. Taken: it goes on to look (none here: exit 3)."""
    result = hook(grace, timeout, wait, tmp_path)
    if verdict == "taken":
        assert result.exit_code == 3, result.output
        return
    assert result.exit_code == 2, result.output
    assert f"--propagation-wait {wait} is longer than the whole drain" in result.stderr
    assert "Traceback" not in result.output


def test_the_variables_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside vLLM the options come from GRACEFUL_* variables: the message names them."""
    monkeypatch.setenv("GRACEFUL_GRACE_PERIOD", "10")
    monkeypatch.setenv("GRACEFUL_PROPAGATION_WAIT", "8s")
    with pytest.raises(ConfigError) as caught:
        GracefulMiddleware(app, registry=CollectorRegistry(), admin=False)
    assert str(caught.value) == (
        "propagation_wait (GRACEFUL_PROPAGATION_WAIT) 8s is longer than the whole drain: grace_period "
        "(GRACEFUL_GRACE_PERIOD) 10s leaves the drain 5s after the reserve 5s; shorten propagation_wait "
        "(GRACEFUL_PROPAGATION_WAIT) or raise grace_period (GRACEFUL_GRACE_PERIOD), the pod's "
        "terminationGracePeriodSeconds"
    )


def test_a_drain_request_the_server_refuses_exits_2_with_its_reason(served: Any) -> None:
    """The hook without --grace-period cannot judge; the server (grace 6 s, reserve 1 s: limit 5 s)
    does, answers 400, begins no drain, and the hook exits 2 with the server's message."""
    assert os.listdir(served.socket_dir)
    result = CliRunner().invoke(cli, ["drain", "--socket-dir", served.socket_dir, "--propagation-wait", "8s"])
    assert result.exit_code == 2, result.output
    assert (
        "propagation_wait 8s is longer than the whole drain: grace_period 6s leaves the drain 5s after the "
        "reserve 1s" in result.stderr
    )
    assert served.mw.drain.state is State.SERVING
